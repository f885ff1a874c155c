package replicas

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/test/faultproxy"
	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// Issue 12's case: a request limit of 100 a minute, and a token budget
// with room for 10 requests of sfEstimate tokens, each for the whole
// cluster.
const (
	sfLimit    = 100
	sfEstimate = 400 // max_tokens, with no prompt: exactly the estimate
	sfBudget   = 10 * sfEstimate
	sfKey      = "sk-storefail-0123456789"

	// sfRTT is the proxy's delay each way while the store is slow but
	// answering, sfSlow while it answers later than the store timeout
	// (15ms) every time.
	sfRTT  = 2 * time.Millisecond
	sfSlow = 12 * time.Millisecond
	// sfWorkers call each replica at once: 30 in all, as issue 12 did.
	sfWorkers = 10
	// sfCallTimeout is generous, so that every answer is seen and counted:
	// an answer the client gave up on may still have been an admission.
	sfCallTimeout = 5 * time.Second
	// sfBurnFor bounds the CPU burner, whatever becomes of this test.
	sfBurnFor = 2 * time.Minute
	// envBurn makes the test binary a CPU burner (TestHelperBurnCPU).
	envBurn = "TOLLGATE_TEST_BURN_CPU"
)

var sfRules = fmt.Sprintf(`domain: storefail
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: %[1]d}
  - key: tenant
    value: fresh
    rate_limit: {unit: minute, requests_per_unit: %[1]d}
  - key: tenant
    value: budget
    token_limit: {unit: hour, tokens_per_unit: %[2]d}
  - key: tenant
    value: probe
    rate_limit: {unit: minute, requests_per_unit: 1000000}
`, sfLimit, sfBudget)

const sfAuthz = `domain: storefail
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
`

// TestDefaultsHoldLimitsWhenStoreIsSlow is issue 12's acceptance test of
// point 5: three freshly started replicas, with the default store flags,
// on one redis-server behind a proxy that delays every byte, beside a
// process that keeps every core busy, loaded at once (30 calls at a time)
// and through a spell where the store answers later than the store
// timeout every time. Whatever the machine's load, they admit at most the
// limit plus a tenth on the request limits, and at most the budget plus
// one estimate on the token budget.
//
// The phases, each with the proxy's delay and its calls:
//   - cold: 2ms each way; 200 calls on acme, 40 Checks on the budget,
//     from the moment the last replica is ready;
//   - slow: 12ms each way, past the store timeout (and the circuit opens);
//     60 calls on acme, 80 on fresh (a tenant the store never answered
//     for: only the local share answers it), 30 Checks;
//   - back: 2ms, the CPU burner stopped; once every replica answers
//     from the store again (calls on probe, a tenant of its own, until
//     one is not degraded), 140 on acme, 180 on fresh, 30 Checks.
//
// All of it runs within the limits' windows (a minute, an hour), so every
// admission counts against one limit: fresh is where the store's answers
// and the local ones add up in one window.
func TestDefaultsHoldLimitsWhenStoreIsSlow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, a CPU burner and three tollgate processes for about 10s; skipped with -short")
	}
	t.Parallel()
	bin := tollgatetest.Build(t)
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	authzPath := filepath.Join(dir, "authz.yaml")
	for path, data := range map[string]string{
		rulesPath:                       sfRules,
		authzPath:                       sfAuthz,
		filepath.Join(dir, "keys.yaml"): "keys:\n  - {key: \"" + sfKey + "\", tenant: budget}\n",
	} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redistest.Start(t)
	px := faultproxy.New(t, rdb.Addr())
	px.Latency(sfRTT, sfRTT)
	stopBurning := burnCPU(t)

	began := time.Now()
	reps := make([]*tollgatetest.Process, replicas)
	for i := range reps {
		// The defaults, but for where to listen and what to load.
		reps[i] = tollgatetest.Start(t, bin, fmt.Sprintf("replica %d", i),
			"--redis-url", "redis://"+px.Addr(), "--config", rulesPath, "--authz-config", authzPath)
	}
	t.Logf("redis, proxy (%v each way), CPU burner and %d replicas ready in %v", sfRTT, replicas, time.Since(began).Round(time.Millisecond))

	l := newSFLoad(t, reps)
	l.phase("cold", map[string]int{"acme": 200, "budget": 40})
	px.Latency(sfSlow, sfSlow)
	l.phase("slow", map[string]int{"acme": 60, "fresh": 80, "budget": 30})
	var details []string
	for i, r := range reps {
		details = append(details, fmt.Sprintf("replica %d: %s", i, l.readyz(r)))
	}
	detail := strings.Join(details, "\n")
	px.Latency(sfRTT, sfRTT)
	// Without the burner, so that the store answers most calls in time:
	// fresh then gets the store's admissions on top of the local ones of
	// the slow phase, in the same window.
	stopBurning()
	l.recover()
	l.phase("back", map[string]int{"acme": 140, "fresh": 180, "budget": 30})
	t.Logf("/readyz in the slow phase:\n%s", detail)
	t.Logf("run took %v", time.Since(began).Round(time.Millisecond))
	if info, err := rdb.Client(t).Info(t.Context(), "stats").Result(); err == nil {
		for line := range strings.Lines(info) {
			if strings.HasPrefix(line, "total_connections_received:") {
				t.Logf("redis: %s", strings.TrimSpace(line))
			}
		}
	}

	for _, tenant := range []string{"acme", "fresh", "budget"} {
		c := l.total(tenant)
		t.Logf("%s: %d calls, %d admitted, %d over limit, %d degraded (%d of them admitted), %d over 20ms (Envoy's rate limit timeout), %d failed",
			tenant, c.calls, c.ok, c.over, c.degraded, c.degradedOK, c.slow, c.failed)
		if c.failed > 0 {
			t.Errorf("%s: %d calls failed, e.g. %v; want every call answered", tenant, c.failed, c.firstErr)
		}
		if c.over == 0 {
			t.Errorf("%s: no call was over the limit: the load did not reach it, so the test shows nothing", tenant)
		}
		switch tenant {
		case "budget":
			if cost := c.ok * sfEstimate; cost > sfBudget+sfEstimate {
				t.Errorf("budget: admitted %d tokens (%d requests of %d), want at most the budget %d plus one estimate",
					cost, c.ok, sfEstimate, sfBudget)
			}
		default:
			if c.ok > sfLimit+sfLimit/10 {
				t.Errorf("%s: admitted %d, want at most the limit %d plus a tenth", tenant, c.ok, sfLimit)
			}
		}
	}
	if slow := l.byPhase["slow"]; slow.degraded == 0 {
		t.Errorf("no degraded answer while the store was slower than its timeout: the test shows nothing")
	}
}

// TestHelperBurnCPU is not a test: run by burnCPU in a child process, it
// keeps every core busy for the time envBurn says, then exits.
func TestHelperBurnCPU(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv(envBurn))
	if err != nil {
		t.Skip("a helper process for TestDefaultsHoldLimitsWhenStoreIsSlow")
	}
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 2 * runtime.NumCPU() {
		wg.Go(func() {
			for n := 0; time.Now().Before(stop); n++ {
				for range 100_000 {
					n = n*31 + 7
				}
			}
		})
	}
	wg.Wait()
}

// burnCPU runs TestHelperBurnCPU in a child process until stop is
// called or the test ends, sfBurnFor at most.
func burnCPU(t *testing.T) (stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBurnCPU$", "-test.count=1")
	cmd.Env = append(os.Environ(), envBurn+"="+sfBurnFor.String())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the CPU burner: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// sfCounts are the answers to one tenant's calls.
type sfCounts struct {
	calls, ok, over, degraded, degradedOK, slow, failed int
	firstErr                                            error
}

func (c *sfCounts) add(o sfCounts) {
	c.calls += o.calls
	c.ok += o.ok
	c.over += o.over
	c.degraded += o.degraded
	c.degradedOK += o.degradedOK
	c.slow += o.slow
	c.failed += o.failed
	if c.firstErr == nil {
		c.firstErr = o.firstErr
	}
}

// sfLoad drives the replicas: ShouldRateLimit for acme and fresh, Check
// with the budget's key.
type sfLoad struct {
	t       *testing.T
	rls     []rlsv3.RateLimitServiceClient
	authz   []authv3.AuthorizationClient
	mu      sync.Mutex
	counts  map[string]*sfCounts // by tenant
	byPhase map[string]*sfCounts
}

func newSFLoad(t *testing.T, reps []*tollgatetest.Process) *sfLoad {
	l := &sfLoad{t: t, counts: map[string]*sfCounts{}, byPhase: map[string]*sfCounts{}}
	for i, r := range reps {
		cc, err := grpc.NewClient(r.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("replica %d: dial %s: %v", i, r.GRPC, err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		l.rls = append(l.rls, rlsv3.NewRateLimitServiceClient(cc))
		l.authz = append(l.authz, authv3.NewAuthorizationClient(cc))
	}
	return l
}

// phase sends calls[tenant] calls for each tenant, sfWorkers at a time
// per replica, each worker on its replica, the tenants' calls mixed.
func (l *sfLoad) phase(name string, calls map[string]int) {
	var jobs []string
	for more := true; more; {
		more = false
		for _, tenant := range []string{"acme", "fresh", "budget"} {
			if calls[tenant] > 0 {
				jobs = append(jobs, tenant)
				calls[tenant]--
				more = true
			}
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for i := range l.rls {
		for range sfWorkers {
			wg.Go(func() {
				for {
					j := int(next.Add(1)) - 1
					if j >= len(jobs) || l.t.Context().Err() != nil {
						return
					}
					c := l.call(i, jobs[j])
					l.mu.Lock()
					if l.counts[jobs[j]] == nil {
						l.counts[jobs[j]] = &sfCounts{}
					}
					if l.byPhase[name] == nil {
						l.byPhase[name] = &sfCounts{}
					}
					l.counts[jobs[j]].add(c)
					l.byPhase[name].add(c)
					if l.byPhase[name+"/"+jobs[j]] == nil {
						l.byPhase[name+"/"+jobs[j]] = &sfCounts{}
					}
					l.byPhase[name+"/"+jobs[j]].add(c)
					l.mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for _, key := range []string{name, name + "/acme", name + "/fresh", name + "/budget"} {
		if p := l.byPhase[key]; p != nil {
			l.t.Logf("phase %s: %d calls, %d admitted, %d over limit, %d degraded (%d admitted), %d over 20ms, %d failed",
				key, p.calls, p.ok, p.over, p.degraded, p.degradedOK, p.slow, p.failed)
		}
	}
}

// sfRecoverWithin bounds how long the replicas may take to answer from
// the store again once it is fast: the circuit probes at least once a
// second.
const sfRecoverWithin = 15 * time.Second

// recover calls probe on each replica until one answer comes from the
// store, not degraded.
func (l *sfLoad) recover() {
	start := time.Now()
	for i := range l.rls {
		for {
			c := l.call(i, "probe")
			if c.failed == 0 && c.degraded == 0 {
				break
			}
			if time.Since(start) > sfRecoverWithin {
				l.t.Fatalf("replica %d: no answer from the store within %v of it being fast again", i, sfRecoverWithin)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	l.t.Logf("every replica answers from the store again %v after it was fast", time.Since(start).Round(time.Millisecond))
}

// call makes one call for tenant on replica i.
func (l *sfLoad) call(i int, tenant string) sfCounts {
	ctx, cancel := context.WithTimeout(l.t.Context(), sfCallTimeout)
	defer cancel()
	c := sfCounts{calls: 1}
	start := time.Now()
	var ok, over, degraded bool
	var err error
	if tenant == "budget" {
		var resp *authv3.CheckResponse
		resp, err = l.authz[i].Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/v1/chat/completions",
				Headers: map[string]string{"authorization": "Bearer " + sfKey, "content-type": "application/json"},
				Body:    fmt.Sprintf(`{"model":"m","max_tokens":%d}`, sfEstimate)},
		}}})
		switch {
		case err != nil:
		case resp.GetOkResponse() != nil:
			ok = true
			degraded = hasDegraded(resp.GetOkResponse().GetHeaders()) || hasDegraded(resp.GetOkResponse().GetResponseHeadersToAdd())
		case resp.GetDeniedResponse().GetStatus().GetCode() == 429:
			over = true
			degraded = hasDegraded(resp.GetDeniedResponse().GetHeaders())
		default:
			err = fmt.Errorf("check answered %v", resp)
		}
	} else {
		var resp *rlsv3.RateLimitResponse
		resp, err = l.rls[i].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "storefail",
			Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}}}})
		if err == nil {
			ok = resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
			over = resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
			for _, h := range resp.GetResponseHeadersToAdd() {
				degraded = degraded || (h.GetKey() == "x-tollgate-degraded" && h.GetValue() == "store")
			}
			if !ok && !over {
				err = fmt.Errorf("ShouldRateLimit answered %v", resp.GetOverallCode())
			}
		}
	}
	if time.Since(start) > 20*time.Millisecond {
		c.slow = 1
	}
	switch {
	case err != nil:
		c.failed, c.firstErr = 1, fmt.Errorf("replica %d, %s: %w", i, tenant, err)
	case ok:
		c.ok = 1
	case over:
		c.over = 1
	}
	if degraded {
		c.degraded = 1
		c.degradedOK = c.ok
	}
	return c
}

func hasDegraded(hs []*corev3.HeaderValueOption) bool {
	for _, h := range hs {
		if strings.EqualFold(h.GetHeader().GetKey(), "x-tollgate-degraded") {
			return true
		}
	}
	return false
}

// readyz returns r's /readyz body.
func (l *sfLoad) readyz(r *tollgatetest.Process) string {
	ctx, cancel := context.WithTimeout(l.t.Context(), 5*time.Second)
	defer cancel()
	out, err := httpGetBody(ctx, "http://"+r.Admin+"/readyz")
	if err != nil {
		return err.Error()
	}
	return out
}

// httpGetBody GETs url and returns its status line and body.
func httpGetBody(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status + ": " + string(b), err
}

// total is tenant's answers over every phase.
func (l *sfLoad) total(tenant string) sfCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.counts[tenant]; c != nil {
		return *c
	}
	return sfCounts{}
}
