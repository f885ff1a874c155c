package failover

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// rules is limitAmount per window for tenant=acme in domain failover.
var rules = fmt.Sprintf(`domain: failover
descriptors:
  - key: tenant
    value: acme
    rate_limit:
      algorithm: sliding_window
      unit: second
      unit_multiplier: %d
      requests_per_unit: %d
      buckets: %d
`, window/time.Second, limitAmount, buckets)

// setup writes the rules and returns the flags every tollgate gets: --store-failure=deny when the build has it (it may not
// have landed yet), which deny reports.
func setup(t *testing.T, bin string) (flags []string, deny bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	flags = append([]string{"--config", path}, tollgateFlags...)
	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	if strings.Contains(string(out), "-store-timeout ") {
		// The default (10ms) suits a production Redis a network hop
		// away; on a loaded 2-core test machine it would open the
		// store's circuit with no fault at all. This test is about
		// failover, so only a failing store may degrade decisions.
		flags = append(flags, "--store-timeout=200ms")
	}
	if strings.Contains(string(out), "-store-failure ") {
		return append(flags, "--store-failure=deny"), true
	}
	t.Logf("this build has no --store-failure: failed calls are gRPC errors, counted and reported")
	return flags, false
}

// startTollgate starts tollgate i with args; when the test fails, its
// store metrics are logged before it stops (cleanups run last first).
func startTollgate(t *testing.T, bin string, i int, args ...string) *tollgatetest.Process {
	t.Helper()
	tg := tollgatetest.Start(t, bin, fmt.Sprintf("tollgate %d", i), args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("tollgate %d store metrics:\n%s", i, storeMetrics(tg.Admin))
		}
	})
	return tg
}

// outcome is what one call got.
type outcome int

const (
	admitted outcome = iota
	overLimit
	degraded // an answer by store_failure: x-tollgate-degraded
	failed   // a gRPC error
)

// call is one call: client send and receive times since the run began.
type call struct {
	send, recv time.Duration
	outcome    outcome
	err        error
}

// drive sends ShouldRateLimit for tenant=acme to every tollgate from
// workers workers each for runFor, and calls fault once, at faultAt.
// It returns every call, sorted by send time.
func drive(t *testing.T, tgs []*tollgatetest.Process, workers int, runFor, faultAt time.Duration, fault func()) []call {
	t.Helper()
	ctx := t.Context()
	var (
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	start := time.Now()
	req := &rlsv3.RateLimitRequest{
		Domain: "failover",
		Descriptors: []*rlpb.RateLimitDescriptor{{
			Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}},
		}},
	}
	for i, tg := range tgs {
		cc, err := grpc.NewClient(tg.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("tollgate %d: dial %s: %v", i, tg.GRPC, err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		client := rlsv3.NewRateLimitServiceClient(cc)
		for range workers {
			wg.Go(func() {
				mine := make([]call, 0, 4096)
				defer func() {
					mu.Lock()
					calls = append(calls, mine...)
					mu.Unlock()
				}()
				for {
					send := time.Since(start)
					if send >= runFor || ctx.Err() != nil {
						return
					}
					// The deadline is far above hangBound, so a slow
					// answer is seen as slow, not cut off.
					cctx, cancel := context.WithTimeout(ctx, 3*hangBound)
					resp, err := client.ShouldRateLimit(cctx, req)
					cancel()
					c := call{send: send, recv: time.Since(start)}
					switch {
					case err != nil:
						c.outcome, c.err = failed, err
					case isDegraded(resp):
						c.outcome = degraded
					case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
						c.outcome = admitted
					case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
						c.outcome = overLimit
					default:
						c.outcome, c.err = failed, fmt.Errorf("overall code %v", resp.GetOverallCode())
					}
					mine = append(mine, c)
					if c.outcome == failed {
						// Do not spin on an error answered at once.
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
	}
	wg.Go(func() {
		select {
		case <-time.After(faultAt - time.Since(start)):
			fault()
		case <-ctx.Done():
		}
	})
	wg.Wait()
	slices.SortFunc(calls, func(x, y call) int { return cmp.Compare(x.send, y.send) })
	return calls
}

func isDegraded(resp *rlsv3.RateLimitResponse) bool {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), "x-tollgate-degraded") {
			return true
		}
	}
	return false
}

// maxSurelyInWindow returns the largest number of admitted calls whose
// whole [send, recv] lies inside one interval [a, a+w) with a >= from, and
// that a. See test/replicas: a lower bound on the true admissions in the
// interval, so any excess over the limit is a real over-admission.
func maxSurelyInWindow(calls []call, from, w time.Duration) (int, time.Duration) {
	var ok []call
	for _, c := range calls {
		if c.outcome == admitted && c.send >= from {
			ok = append(ok, c)
		}
	}
	best, bestAt := 0, time.Duration(0)
	for i, c := range ok {
		end := c.send + w
		n := 0
		for _, d := range ok[i:] {
			if d.send >= end {
				break
			}
			if d.recv < end {
				n++
			}
		}
		if n > best {
			best, bestAt = n, c.send
		}
	}
	return best, bestAt
}

// waitFor polls cond every 50ms until it returns nil or timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond(ctx)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		case <-tick.C:
		}
	}
}

// storeMetrics returns the tollgate_store_ lines of /metrics, for a
// failure's log.
func storeMetrics(adminAddr string) string {
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "tollgate_store_") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
