package load

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeRLS answers OVER_LIMIT to every third call and OK to the others; a
// request in domain "slow" waits for its deadline, one in domain "fail"
// gets Unavailable.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	calls atomic.Int64

	mu      sync.Mutex
	tenants map[string]int
	hits    map[uint32]int
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch req.GetDomain() {
	case "slow":
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	case "fail":
		return nil, status.Error(codes.Unavailable, "down")
	}
	n := f.calls.Add(1)
	f.mu.Lock()
	for _, d := range req.GetDescriptors() {
		for _, e := range d.GetEntries() {
			if e.GetKey() == "tenant" {
				f.tenants[e.GetValue()]++
			}
		}
	}
	f.hits[req.GetHitsAddend()]++
	f.mu.Unlock()
	code := rlsv3.RateLimitResponse_OK
	if n%3 == 0 {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

// startFake serves a fakeRLS on a free loopback port until the test ends.
func startFake(tb testing.TB) (*fakeRLS, string) {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	f := &fakeRLS{tenants: map[string]int{}, hits: map[uint32]int{}}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	tb.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return f, lis.Addr().String()
}

func runFlags(t *testing.T, args ...string) *Result {
	t.Helper()
	cfg, err := ParseFlags(args, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("ParseFlags(%q): %v", args, err)
	}
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func TestRunCountsAddUp(t *testing.T) {
	t.Parallel()
	f, addr := startFake(t)
	res := runFlags(t, "-addr", addr, "-c", "8", "-conns", "3", "-n", "300", "-d", "20s",
		"-domain", "api", "-descriptor", "tenant=acme,model=m", "-descriptor", "tenant=x",
		"-tenants", "5", "-spread", "round-robin", "-hits", "2")
	if res.Requests != 300 || res.OK != 200 || res.OverLimit != 100 || res.Unknown != 0 || res.ErrorCount() != 0 {
		t.Fatalf("requests %d ok %d over %d unknown %d errors %v, want 300 = 200 + 100",
			res.Requests, res.OK, res.OverLimit, res.Unknown, res.Errors)
	}
	if got := f.calls.Load(); got != 300 {
		t.Fatalf("server saw %d calls, want exactly -n = 300", got)
	}
	if res.Latency.Count() != 300 {
		t.Fatalf("latency samples %d, want 300", res.Latency.Count())
	}
	if res.Latency.Quantile(0.5) <= 0 || res.Latency.Max() < res.Latency.Quantile(0.999) {
		t.Fatalf("implausible latencies: p50 %v p999 %v max %v", res.Latency.Quantile(0.5), res.Latency.Quantile(0.999), res.Latency.Max())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Two descriptors carry the tenant key, both replaced: 600 entries.
	// The workers walk the tenants in turn, so every tenant gets some.
	total := 0
	for v, n := range f.tenants {
		if !strings.HasPrefix(v, "tenant-") {
			t.Errorf("tenant value %q was not replaced", v)
		}
		total += n
	}
	if len(f.tenants) != 5 || total != 600 {
		t.Errorf("tenants seen %v, want tenant-0..4 with 600 entries in all", f.tenants)
	}
	if f.hits[2] != 300 {
		t.Errorf("hits_addend seen %v, want 2 on every call", f.hits)
	}
}

func TestRoundRobinVisitsEachTenantOnce(t *testing.T) {
	t.Parallel()
	f, addr := startFake(t)
	// Workers run at different speeds; the turn is shared, so 1,000 calls
	// still reach each of 1,000 tenants once.
	res := runFlags(t, "-addr", addr, "-c", "16", "-n", "1000", "-d", "20s",
		"-domain", "api", "-descriptor", "tenant=acme", "-tenants", "1000", "-spread", "round-robin")
	if res.Requests != 1000 {
		t.Fatalf("requests %d, want 1000", res.Requests)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range 1000 {
		if n := f.tenants[fmt.Sprintf("tenant-%d", i)]; n != 1 {
			t.Errorf("tenant-%d got %d calls, want 1", i, n)
		}
	}
}

func TestRunStopsAtDurationWithWarmup(t *testing.T) {
	t.Parallel()
	f, addr := startFake(t)
	start := time.Now()
	res := runFlags(t, "-addr", addr, "-c", "4", "-d", "300ms", "-warmup", "100ms",
		"-domain", "api", "-descriptor", "tenant=acme", "-tenants", "3")
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("run took %v, want about 400ms", took)
	}
	if res.Requests == 0 || res.Requests != res.OK+res.OverLimit {
		t.Fatalf("requests %d ok %d over %d errors %v", res.Requests, res.OK, res.OverLimit, res.Errors)
	}
	if served := f.calls.Load(); served <= res.Requests {
		t.Fatalf("server saw %d calls, want more than the %d measured: the warmup's are not counted", served, res.Requests)
	}
	if res.Elapsed < 300*time.Millisecond || res.RPS() <= 0 {
		t.Fatalf("elapsed %v rps %v", res.Elapsed, res.RPS())
	}
}

func TestRunCountsErrorsByCode(t *testing.T) {
	t.Parallel()
	_, addr := startFake(t)
	tests := []struct {
		name   string
		domain string
		want   string
	}{
		{name: "deadline", domain: "slow", want: "DeadlineExceeded"},
		{name: "unavailable", domain: "fail", want: "Unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := runFlags(t, "-addr", addr, "-c", "2", "-n", "6", "-timeout", "50ms",
				"-domain", tt.domain, "-descriptor", "tenant=acme")
			if res.Requests != 6 || res.Errors[tt.want] != 6 || res.Latency.Count() != 0 {
				t.Fatalf("requests %d errors %v samples %d, want 6 %s", res.Requests, res.Errors, res.Latency.Count(), tt.want)
			}
		})
	}
}

func TestMainPrintsJSON(t *testing.T) {
	t.Parallel()
	_, addr := startFake(t)
	var out, errOut bytes.Buffer
	code := Main(t.Context(), []string{"-addr", addr, "-c", "3", "-n", "30", "-domain", "api", "-descriptor", "tenant=acme", "-json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	var got JSONResult
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if got.Requests != 30 || got.OK != 20 || got.OverLimit != 10 || got.LatencySamples != 30 {
		t.Fatalf("got %+v", got)
	}
	for _, k := range []string{"p50", "p90", "p99", "p999", "max"} {
		if got.LatencyMS[k] <= 0 {
			t.Errorf("latency_ms[%s] = %v, want > 0", k, got.LatencyMS[k])
		}
	}
}

func TestMainText(t *testing.T) {
	t.Parallel()
	_, addr := startFake(t)
	var out, errOut bytes.Buffer
	code := Main(t.Context(), []string{"-addr", addr, "-c", "2", "-n", "9", "-domain", "api", "-descriptor", "tenant=acme"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	for _, want := range []string{"requests   9", "ok 6  over_limit 3", "p50", "p999", "max"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if code := Main(t.Context(), []string{"-domain", "api"}, &out, &errOut); code != 2 {
		t.Errorf("bad flags: exit %d, want 2", code)
	}
}

// TestRunSpreadsOverAddresses: with several -addr, every replica gets a
// share of the workers, and AllCalls counts the warmup too.
func TestRunSpreadsOverAddresses(t *testing.T) {
	t.Parallel()
	f1, a1 := startFake(t)
	f2, a2 := startFake(t)
	f3, a3 := startFake(t)
	res := runFlags(t, "-addr", a1+","+a2+","+a3, "-c", "6", "-n", "600", "-d", "20s",
		"-warmup", "50ms", "-domain", "api", "-descriptor", "tenant=acme")
	if res.Requests != 600 {
		t.Fatalf("requests %d, want 600", res.Requests)
	}
	for i, f := range []*fakeRLS{f1, f2, f3} {
		if n := f.calls.Load(); n < 100 {
			t.Errorf("replica %d saw %d calls, want a third of them or so", i, n)
		}
	}
	served := f1.calls.Load() + f2.calls.Load() + f3.calls.Load()
	if res.AllCalls != served || res.AllCalls < res.Requests {
		t.Errorf("AllCalls = %d, want the %d the servers saw (>= %d measured)", res.AllCalls, served, res.Requests)
	}
}

// fakeAuthz denies a Check without the bearer key "good", and checks
// the body is the size asked.
type fakeAuthz struct {
	authv3.UnimplementedAuthorizationServer
	calls atomic.Int64
	sizes sync.Map // int -> true
}

func (f *fakeAuthz) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	f.calls.Add(1)
	h := req.GetAttributes().GetRequest().GetHttp()
	f.sizes.Store(len(h.GetBody()), true)
	if h.GetHeaders()["authorization"] != "Bearer good" {
		return &authv3.CheckResponse{HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{}}}, nil
	}
	return &authv3.CheckResponse{HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, nil
}

func TestRunCheck(t *testing.T) {
	t.Parallel()
	f := &fakeAuthz{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	authv3.RegisterAuthorizationServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	for _, tt := range []struct {
		key            string
		wantOK, wantNo int64
	}{{"good", 50, 0}, {"bad", 0, 50}} {
		res := runFlags(t, "-addr", lis.Addr().String(), "-api", "check", "-key", tt.key, "-c", "4", "-n", "50", "-body-bytes", "2048")
		if res.OK != tt.wantOK || res.OverLimit != tt.wantNo || res.ErrorCount() != 0 {
			t.Errorf("key %q: ok %d denied %d errors %v; want %d and %d", tt.key, res.OK, res.OverLimit, res.Errors, tt.wantOK, tt.wantNo)
		}
	}
	f.sizes.Range(func(k, _ any) bool {
		if n := k.(int); n != 2048 {
			t.Errorf("a body of %d bytes, want 2048", n)
		}
		return true
	})
}

// TestRateCapsTheCalls runs 1 s at -rate 200 with 8 workers on a server
// that answers at once: about 200 calls, not the thousands the workers
// would make uncapped, and an invalid rate is refused.
func TestRateCapsTheCalls(t *testing.T) {
	t.Parallel()
	f, addr := startFake(t)
	res := runFlags(t, "-addr", addr, "-c", "8", "-d", "1s", "-rate", "200", "-domain", "api", "-descriptor", "tenant=acme")
	// The schedule starts with the run and a call starts at each 5 ms
	// slot: 200 in 1 s, and calls the schedule skipped after a stall of
	// over 10 ms are lost, not made up (a loaded machine under -race
	// stalls: the floor is loose, the cap is not).
	if res.Requests < 100 || res.Requests > 202 {
		t.Errorf("%d calls in 1s at -rate 200, want about 200", res.Requests)
	}
	if got := f.calls.Load(); got != res.Requests {
		t.Errorf("server saw %d calls, the run counted %d", got, res.Requests)
	}
	for _, bad := range []string{"-1", "NaN", "1e9"} {
		c := Config{Addr: addr, Concurrency: 1, Conns: 1, Duration: time.Second, Timeout: time.Second, Domain: "api",
			Descriptors: []Descriptor{{{Key: "k", Value: "v"}}}, API: APIRateLimit, Rate: parseFloat(t, bad)}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "-rate") {
			t.Errorf("-rate %s: Validate() = %v, want an error naming -rate", bad, err)
		}
	}
}

func parseFloat(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
