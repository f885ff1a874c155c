package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// wait bounds every wait on the real servers.
const wait = 15 * time.Second

// gateStore holds any decision that charges the tenant "slowpoke" until
// release is closed, so a test can have a call in flight at shutdown.
type gateStore struct {
	pingStore
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (g *gateStore) Apply(ctx context.Context, now time.Time, cs []limit.Charge, res []limit.Result) (bool, error) {
	for _, c := range cs {
		if strings.Contains(c.Key, "slowpoke") {
			if g.once.CompareAndSwap(false, true) {
				close(g.entered)
			}
			<-g.release
		}
	}
	return g.pingStore.Apply(ctx, now, cs, res)
}

type e2e struct {
	t      *testing.T
	ctx    context.Context // bounds the whole test
	addrs  Addrs
	client rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
	stderr *buffer
}

func (e *e2e) call(tenant string) *rlsv3.RateLimitResponse {
	e.t.Helper()
	resp, err := e.client.ShouldRateLimit(e.ctx, &rlsv3.RateLimitRequest{
		Domain:      "e2e",
		Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}}},
	})
	if err != nil {
		e.t.Fatalf("ShouldRateLimit(%s): %v", tenant, err)
	}
	return resp
}

func (e *e2e) get(path string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, "http://"+e.addrs.Admin.String()+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// poll calls try until it reports done, failing the test at the deadline.
// It sleeps between tries: it waits on real servers and a real file watcher.
func (e *e2e) poll(what string, try func() bool) {
	e.t.Helper()
	for !try() {
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("timed out waiting for %s\nlog:\n%s", what, e.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rewrite writes a rules file that differs from every earlier write, so
// each one is a change the watcher acts on, however its start raced with
// the first write.
func rewrite(t *testing.T, path, rules string, n *int) {
	t.Helper()
	*n++
	tmp := path + ".tmp"
	writeFile(t, tmp, fmt.Sprintf("# edit %d\n%s", *n, rules))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestServeEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancelTest := context.WithTimeout(context.Background(), wait)
	defer cancelTest()

	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	writeFile(t, rulesPath, goodRules)

	gate := &gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	addrs := make(chan Addrs, 1)
	stderr := &buffer{}
	a := &App{
		Stdout:    io.Discard,
		Stderr:    stderr,
		Version:   "v0.0.0-test",
		LookupEnv: env(map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_LOG_LEVEL": "debug"}),
		Listening: func(ad Addrs) { addrs <- ad },
		wrapStore: func(s pingStore) pingStore { gate.pingStore = s; return gate },
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	exit := make(chan int, 1)
	go func() {
		exit <- a.Run(runCtx, []string{"serve", "--config", dir, "--admin-addr", "127.0.0.1:0", "--debug"})
	}()

	e := &e2e{t: t, ctx: ctx, stderr: stderr}
	select {
	case e.addrs = <-addrs:
	case code := <-exit:
		t.Fatalf("serve exited with %d before listening:\n%s", code, stderr.String())
	case <-ctx.Done():
		t.Fatal("serve never listened")
	}
	conn, err := grpc.NewClient("passthrough:///"+e.addrs.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e.client = rlsv3.NewRateLimitServiceClient(conn)
	e.health = healthpb.NewHealthClient(conn)

	// Ready: gRPC health and /readyz agree.
	e.poll("gRPC health SERVING", func() bool {
		resp, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	if code, body := e.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %q, want 200", code, body)
	}
	if code, _ := e.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}

	// Three calls fit a limit of 3 a minute; the fourth does not.
	for i := range 3 {
		resp := e.call("acme")
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != uint32(2-i) {
			t.Fatalf("call %d = %v, want OK with %d remaining", i+1, resp, 2-i)
		}
	}
	over := e.call("acme")
	if over.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fourth call = %v, want OVER_LIMIT", over)
	}
	if !hasHeader(over, "retry-after") || !hasHeader(over, "x-ratelimit-limit") {
		t.Errorf("over-limit headers = %v, want retry-after and x-ratelimit-*", over.GetResponseHeadersToAdd())
	}

	_, metrics := e.get("/metrics")
	for _, want := range []string{
		`tollgate_rls_decisions_total{domain="e2e",result="ok",rule="tenant",tier="none"} 3`,
		`tollgate_rls_decisions_total{domain="e2e",result="over_limit",rule="tenant",tier="none"} 1`,
		`tollgate_rls_decision_duration_seconds_count 4`,
		`tollgate_config_reloads_total{result="failure"} 0`,
		`tollgate_build_info{version="v0.0.0-test"} 1`,
		`tollgate_config_last_reload_success_timestamp_seconds `,
		`go_goroutines `,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	code, body := e.get("/debug/config")
	var view configView
	if err := json.Unmarshal([]byte(body), &view); code != http.StatusOK || err != nil {
		t.Fatalf("/debug/config = %d %q (%v)", code, body, err)
	}
	if len(view.Domains) != 1 || view.Domains[0].Name != "e2e" || view.Store.Kind != "memory" ||
		len(view.Domains[0].Descriptors) != 1 || view.Domains[0].Descriptors[0].ID != "tenant" ||
		view.Domains[0].Descriptors[0].RateLimit == nil || *view.Domains[0].Descriptors[0].RateLimit.RequestsPerUnit != 3 {
		t.Errorf("/debug/config = %s, want domain e2e with rule tenant at 3/minute on the memory store", body)
	}

	// A new limit takes effect without a restart.
	const raised = `domain: e2e
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, name: raised}
`
	e.watching()
	edits := 0
	e.poll("the raised limit", func() bool {
		rewrite(t, rulesPath, raised, &edits)
		return e.call("acme").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 100
	})
	if _, metrics := e.get("/metrics"); !strings.Contains(metrics, `tollgate_config_reloads_total{result="success"} `) ||
		strings.Contains(metrics, `tollgate_config_reloads_total{result="success"} 0`) {
		t.Errorf("/metrics shows no successful reload")
	}

	// A broken file is rejected and the raised limit keeps serving.
	e.poll("a failed reload", func() bool {
		rewrite(t, rulesPath, badRules, &edits)
		_, metrics := e.get("/metrics")
		return !strings.Contains(metrics, `tollgate_config_reloads_total{result="failure"} 0`)
	})
	if got := e.call("acme").GetStatuses()[0].GetCurrentLimit(); got.GetRequestsPerUnit() != 100 || got.GetName() != "raised" {
		t.Errorf("limit after a bad reload = %v, want the raised one still serving", got)
	}
	// Line 7, not 6: rewrite puts a comment line first.
	if !strings.Contains(stderr.String(), `rules.yaml:7: descriptors[1].rate_limit.requests_per_unit: -1 is negative`) {
		t.Errorf("log lacks the rejected file's problems:\n%s", stderr.String())
	}

	// Shutdown with a call in flight: it finishes, then serve exits 0.
	slow := make(chan *rlsv3.RateLimitResponse, 1)
	go func() {
		resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:      "e2e",
			Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "slowpoke"}}}},
		})
		if err != nil {
			t.Errorf("in-flight call: %v", err)
		}
		slow <- resp
	}()
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("the slow call never reached the store")
	}
	stop()
	e.poll("/readyz to report shutting down", func() bool {
		code, body := e.get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down")
	})
	close(gate.release)
	if resp := <-slow; resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("in-flight call = %v, want OK", resp)
	}
	select {
	case code := <-exit:
		if code != ExitOK {
			t.Errorf("serve exited with %d, want 0\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("serve did not exit after cancel")
	}
	if _, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e"}); err == nil {
		t.Error("a call after shutdown succeeded")
	}
}

func hasHeader(resp *rlsv3.RateLimitResponse, key string) bool {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == key {
			return true
		}
	}
	return false
}
