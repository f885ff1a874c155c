package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait on a real server.
const wait = 10 * time.Second

// fakeRLS answers ShouldRateLimit with handle.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	handle func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

func (f *fakeRLS) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, f) }

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return f.handle(ctx, req)
}

func okHandler(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

type running struct {
	grpcAddr, adminAddr string
	conn                *grpc.ClientConn
	cancel              context.CancelFunc
	done                chan error
}

// start serves cfg on loopback ports until the test ends.
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = 10 * time.Millisecond
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{grpcAddr: gl.Addr().String(), adminAddr: al.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, gl, al) }()
	r.conn, err = grpc.NewClient("passthrough:///"+r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = r.conn.Close()
		select {
		case <-r.done: //nolint:errcheck // the cleanup only waits; Serve's error is checked by the tests that stop it
		case <-time.After(wait):
			t.Error("Serve did not return after cancel")
		}
	})
	return r
}

// stop cancels the server and returns Serve's result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for Cleanup
		return err
	case <-time.After(wait):
		t.Fatal("Serve did not return after cancel")
		return nil
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: wait}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// waitHealth watches service's health until it reports want.
func waitHealth(t *testing.T, conn *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health watch: %v", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("health %q never became %v: %v", service, want, err)
		}
		if resp.GetStatus() == want {
			return
		}
	}
}

func TestReadinessDrivesHealthAndReadyz(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	r := start(t, Config{
		Services: []Service{&fakeRLS{handle: okHandler}},
		Ready: func(context.Context) error {
			if !ready.Load() {
				return errors.New("rules not loaded\nsecond line")
			}
			return nil
		},
	})
	rlsName := rlsv3.RateLimitService_ServiceDesc.ServiceName
	for _, svc := range []string{"", rlsName} {
		waitHealth(t, r.conn, svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	if code, body := httpGet(t, "http://"+r.adminAddr+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready: rules not loaded second line\n" {
		t.Errorf("/readyz = %d %q, want 503 with a one-line reason", code, body)
	}
	if code, _ := httpGet(t, "http://"+r.adminAddr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200 even when not ready", code)
	}

	ready.Store(true)
	for _, svc := range []string{"", rlsName} {
		waitHealth(t, r.conn, svc, healthpb.HealthCheckResponse_SERVING)
	}
	if code, body := httpGet(t, "http://"+r.adminAddr+"/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz = %d %q, want 200 ok", code, body)
	}

	ready.Store(false)
	waitHealth(t, r.conn, "", healthpb.HealthCheckResponse_NOT_SERVING)
}

func TestReadyzTimesOut(t *testing.T) {
	t.Parallel()
	r := start(t, Config{
		Services:     []Service{&fakeRLS{handle: okHandler}},
		ReadyTimeout: 20 * time.Millisecond,
		Ready: func(ctx context.Context) error {
			<-ctx.Done() // a store that never answers its ping
			return ctx.Err()
		},
	})
	if code, body := httpGet(t, "http://"+r.adminAddr+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "deadline exceeded") {
		t.Errorf("/readyz = %d %q, want 503 deadline exceeded", code, body)
	}
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Add(3)
	r := start(t, Config{
		Services:    []Service{&fakeRLS{handle: okHandler}},
		Gatherer:    reg,
		DebugConfig: func() any { return map[string]any{"domains": []string{"ai"}} },
	})
	if code, body := httpGet(t, "http://"+r.adminAddr+"/metrics"); code != http.StatusOK || !strings.Contains(body, "tollgate_test_things_total 3") {
		t.Errorf("/metrics = %d, want 200 with the registry's metrics:\n%s", code, body)
	}
	code, body := httpGet(t, "http://"+r.adminAddr+"/debug/config")
	var got struct{ Domains []string }
	if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil || !slices.Equal(got.Domains, []string{"ai"}) {
		t.Errorf("/debug/config = %d %q (%v), want the view as JSON", code, body, err)
	}
	if code, _ := httpGet(t, "http://"+r.adminAddr+"/nope"); code != http.StatusNotFound {
		t.Errorf("/nope = %d, want 404", code)
	}

	bare := start(t, Config{Services: []Service{&fakeRLS{handle: okHandler}}})
	if code, _ := httpGet(t, "http://"+bare.adminAddr+"/debug/config"); code != http.StatusNotFound {
		t.Errorf("/debug/config without a view = %d, want 404", code)
	}
}

func TestPprof(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		give  bool
		path  string
		want  int
		check func(body string) bool // nil: any body
	}{
		{name: "off: index", path: "/debug/pprof/", want: http.StatusNotFound},
		{name: "off: cmdline", path: "/debug/pprof/cmdline", want: http.StatusNotFound},
		{name: "off: profile", path: "/debug/pprof/profile?seconds=1", want: http.StatusNotFound},
		{name: "on: index", give: true, path: "/debug/pprof/", want: http.StatusOK, check: func(b string) bool { return strings.Contains(b, "goroutine") }},
		{name: "on: cmdline", give: true, path: "/debug/pprof/cmdline", want: http.StatusOK, check: func(b string) bool { return strings.Contains(b, "server.test") }},
		{name: "on: heap", give: true, path: "/debug/pprof/heap?debug=1", want: http.StatusOK, check: func(b string) bool { return strings.HasPrefix(b, "heap profile:") }},
		// A profile is a gzipped protobuf.
		{name: "on: 1s CPU profile", give: true, path: "/debug/pprof/profile?seconds=1", want: http.StatusOK, check: func(b string) bool { return strings.HasPrefix(b, "\x1f\x8b") }},
	}
	servers := map[bool]*running{
		false: start(t, Config{Services: []Service{&fakeRLS{handle: okHandler}}}),
		true:  start(t, Config{Services: []Service{&fakeRLS{handle: okHandler}}, Pprof: true}),
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, body := httpGet(t, "http://"+servers[tt.give].adminAddr+tt.path)
			if code != tt.want || (tt.check != nil && !tt.check(body)) {
				t.Errorf("GET %s = %d %.80q, want %d", tt.path, code, body, tt.want)
			}
		})
	}
}

func TestPprofClashesWithAdminRoutes(t *testing.T) {
	t.Parallel()
	_, err := New(Config{
		Services: []Service{&fakeRLS{handle: okHandler}},
		Gatherer: prometheus.NewRegistry(),
		Pprof:    true,
		Admin:    map[string]http.Handler{"/debug/pprof/": http.NotFoundHandler()},
	})
	if err == nil {
		t.Error("New with an admin route on /debug/pprof/ and Pprof: no error")
	}
}

func TestPanicBecomesInternal(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.ErrorLevel)
	var calls atomic.Int32
	r := start(t, Config{
		Logger: zap.New(core),
		Services: []Service{&fakeRLS{handle: func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			if calls.Add(1) == 1 {
				panic("secret internal detail")
			}
			return okHandler(ctx, req)
		}}},
	})
	client := rlsv3.NewRateLimitServiceClient(r.conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
	if s, _ := status.FromError(err); s.Code() != codes.Internal || strings.Contains(s.Message(), "secret") {
		t.Errorf("panicking call = %v, want Internal without the panic text", err)
	}
	if _, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"}); err != nil {
		t.Errorf("call after the panic: %v, want the server still serving", err)
	}
	if n := logs.FilterMessage("handler panicked").Len(); n != 1 {
		t.Errorf("%d panic logs, want 1", n)
	}
}

func TestReflectionListsServices(t *testing.T) {
	t.Parallel()
	r := start(t, Config{Services: []Service{&fakeRLS{handle: okHandler}}})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{rlsv3.RateLimitService_ServiceDesc.ServiceName, "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
}

func TestGracefulStopFinishesCallsInFlight(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	r := start(t, Config{
		Services: []Service{&fakeRLS{handle: func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			if req.GetDomain() == "slow" {
				close(entered)
				<-release
			}
			return okHandler(ctx, req)
		}}},
	})
	waitHealth(t, r.conn, "", healthpb.HealthCheckResponse_SERVING)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	callErr := make(chan error, 1)
	go func() {
		_, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "slow"})
		callErr <- err
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the slow call never reached the handler")
	}

	r.cancel()
	// While the call drains, the admin port still answers and says why
	// this replica is out.
	for {
		code, body := httpGet(t, "http://"+r.adminAddr+"/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("/readyz = %d %q, never reported shutting down", code, body)
		}
		time.Sleep(5 * time.Millisecond) // polling a real server
	}
	select {
	case err := <-r.done:
		t.Fatalf("Serve returned (%v) with a call in flight", err)
	default:
	}
	close(release)
	if err := <-callErr; err != nil {
		t.Errorf("in-flight call: %v, want it to finish", err)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func TestDrainTimeoutCutsCallsInFlight(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	r := start(t, Config{
		DrainTimeout: 50 * time.Millisecond,
		Services: []Service{&fakeRLS{handle: func(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			close(entered)
			<-ctx.Done() // until Stop cancels it
			return nil, ctx.Err()
		}}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	callErr := make(chan error, 1)
	go func() {
		_, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
		callErr <- err
	}()
	<-entered
	if err := r.stop(t); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if err := <-callErr; status.Code(err) == codes.OK || ctx.Err() != nil {
		t.Errorf("in-flight call = %v (ctx %v), want it cut by the drain timeout", err, ctx.Err())
	}
}

func TestServeReturnsListenerErrors(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{Services: []Service{&fakeRLS{handle: okHandler}}, Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = al.Close() // the admin listener fails at once
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), gl, al) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "serve admin") {
			t.Errorf("Serve = %v, want the admin listener's error", err)
		}
	case <-time.After(wait):
		t.Fatal("Serve kept running with a dead listener")
	}
}

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Gatherer: prometheus.NewRegistry()}); err == nil {
		t.Error("New without services succeeded")
	}
	if _, err := New(Config{Services: []Service{&fakeRLS{handle: okHandler}}}); err == nil {
		t.Error("New without a gatherer succeeded")
	}
}

func TestDebugToken(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef0123456789abcdef"
	r := start(t, Config{
		Services:    []Service{&fakeRLS{handle: okHandler}},
		Gatherer:    prometheus.NewRegistry(),
		DebugConfig: func() any { return map[string]any{"domains": []string{"ai"}} },
		Pprof:       true,
		Cmdline:     []string{"tollgate", "serve", "--redis-url=redis://:xxxxx@r:6379"},
		DebugToken:  token,
		Admin: map[string]http.Handler{
			"GET /debug/pressure": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }),
			"GET /v1/pressure":    http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("own token")) }),
		},
	})
	tests := []struct {
		name string
		path string
		auth string // the Authorization header; empty: none
		want int
	}{
		{name: "config without a token", path: "/debug/config", want: http.StatusUnauthorized},
		{name: "config with the token", path: "/debug/config", auth: "Bearer " + token, want: http.StatusOK},
		{name: "config with another token", path: "/debug/config", auth: "Bearer " + strings.ToUpper(token), want: http.StatusUnauthorized},
		{name: "config with a prefix of the token", path: "/debug/config", auth: "Bearer " + token[:31], want: http.StatusUnauthorized},
		{name: "config with the token as Basic", path: "/debug/config", auth: "Basic " + token, want: http.StatusUnauthorized},
		{name: "pressure without a token", path: "/debug/pressure", want: http.StatusUnauthorized},
		{name: "pprof index without a token", path: "/debug/pprof/", want: http.StatusUnauthorized},
		{name: "pprof cmdline without a token", path: "/debug/pprof/cmdline", want: http.StatusUnauthorized},
		{name: "pprof cmdline with the token", path: "/debug/pprof/cmdline", auth: "Bearer " + token, want: http.StatusOK},
		{name: "unclean path", path: "/x/../debug/config", want: http.StatusUnauthorized},
		// Go reads "//debug/config" as host debug, path /config.
		{name: "double slash", path: "//debug/config", want: http.StatusNotFound},
		{name: "double slash inside", path: "/debug//config", want: http.StatusUnauthorized},
		{name: "bare /debug", path: "/debug", want: http.StatusUnauthorized},
		{name: "metrics stay open", path: "/metrics", want: http.StatusOK},
		{name: "healthz stays open", path: "/healthz", want: http.StatusOK},
		{name: "routes outside /debug keep their own auth", path: "/v1/pressure", want: http.StatusOK},
	}
	client := &http.Client{
		Timeout: 10 * time.Second,
		// A redirect to the clean path must be checked again, not followed here.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(http.MethodGet, "http://"+r.adminAddr, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.URL.Opaque = tt.path // sent as is, not cleaned by the client
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("GET %s = %d %.80q, want %d", tt.path, resp.StatusCode, body, tt.want)
			}
			if strings.Contains(string(body), token) {
				t.Errorf("GET %s answers with the token: %q", tt.path, body)
			}
		})
	}
}

func TestPprofCmdline(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []string
		want string
	}{
		{name: "the program name by default", want: os.Args[0]},
		{name: "as given", give: []string{"tollgate", "serve", "--redis-url=redis://:xxxxx@r"}, want: "tollgate\x00serve\x00--redis-url=redis://:xxxxx@r"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := start(t, Config{Services: []Service{&fakeRLS{handle: okHandler}}, Pprof: true, Cmdline: tt.give})
			if code, body := httpGet(t, "http://"+r.adminAddr+"/debug/pprof/cmdline"); code != http.StatusOK || body != tt.want {
				t.Errorf("/debug/pprof/cmdline = %d %q, want %q", code, body, tt.want)
			}
		})
	}
}
