package lifecycle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

// soakRules: a per-tenant limit on a 1s window, so the many cold
// tenants' counters expire and hot tenants go over their limit.
const soakRules = `domain: soak
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 200}
`

const (
	soakWorkers = 8
	soakSample  = 5 * time.Second
	// A series is flat when its second half's maximum is within this
	// share of its first half's (plus soakRSSSlack for RSS, whose
	// first samples may come before the heap reaches its working size).
	soakDrift        = 0.20
	soakRSSSlack     = 8 << 20
	soakGoroutineAdd = 10
)

// TestSoak runs only with TOLLGATE_SOAK set to a duration (`make soak`,
// SOAK=3m): mixed tenants (a few hot ones, and a new cold one every few
// calls: millions over the run) against a process on the in-memory store
// and one on Redis, side by side. It samples each process's RSS and
// goroutines from /metrics and requires them to stay flat, and every
// call to succeed.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("TOLLGATE_SOAK"))
	if err != nil {
		t.Skip("set TOLLGATE_SOAK to a duration (make soak) to run the soak")
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "soak.yaml"), soakRules)
	t.Run("memstore", func(t *testing.T) {
		t.Parallel()
		soak(t, d, start(t, "--config", dir, "--log-level", "warn"))
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Start(t)
		soak(t, d, start(t, "--config", dir, "--redis-url", rdb.URL(), "--log-level", "warn"))
	})
}

type soakSampleT struct {
	at         time.Duration
	rss        float64
	goroutines float64
	heap       float64
}

func soak(t *testing.T, d time.Duration, p *proc) {
	client := rlsv3.NewRateLimitServiceClient(p.dial(t))
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var calls, over, failed, cold atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range soakWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ctx.Err() == nil; i++ {
				tenant := fmt.Sprint("hot-", rng.IntN(4))
				if rng.IntN(4) == 0 {
					tenant = fmt.Sprint("cold-", w, "-", i)
					cold.Add(1)
				}
				cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Second)
				resp, err := client.ShouldRateLimit(cctx, request("soak", "tenant", tenant))
				ccancel()
				if ctx.Err() != nil {
					return
				}
				calls.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				case resp.GetOverallCode() != rlsv3.RateLimitResponse_OK:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("overall code %v", resp.GetOverallCode()))
				}
			}
		})
	}
	var samples []soakSampleT
	began := time.Now()
	tick := time.NewTicker(soakSample)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			m := p.scrape(t)
			samples = append(samples, soakSampleT{at: time.Since(began), rss: m["process_resident_memory_bytes"], goroutines: m["go_goroutines"], heap: m["go_memstats_heap_inuse_bytes"]})
		}
	}
	tick.Stop()
	wg.Wait()
	_, peak := p.memory(t)

	if len(samples) < 4 {
		t.Fatalf("%d samples in %v: too short a soak to judge", len(samples), d)
	}
	half := len(samples) / 2
	series := func(name string, f func(soakSampleT) float64) (first, second float64) {
		var vs []float64
		for _, s := range samples {
			vs = append(vs, f(s))
		}
		first, second = slices.Max(vs[:half]), slices.Max(vs[half:])
		t.Logf("%-10s min %8.1f  first-half max %8.1f  second-half max %8.1f  last %8.1f  (drift %+.1f%%)",
			name, slices.Min(vs), first, second, vs[len(vs)-1], 100*(second-first)/first)
		return first, second
	}
	t.Logf("%v: %d calls (%.0f/s), %d over limit, %d to cold tenants (each new), %d failed; %d samples every %v; peak RSS (VmHWM) %.1f MiB",
		d, calls.Load(), float64(calls.Load())/d.Seconds(), over.Load(), cold.Load(), failed.Load(), len(samples), soakSample, mib(peak))
	r1, r2 := series("rss MiB", func(s soakSampleT) float64 { return s.rss / (1 << 20) })
	series("heap MiB", func(s soakSampleT) float64 { return s.heap / (1 << 20) })
	g1, g2 := series("goroutines", func(s soakSampleT) float64 { return s.goroutines })

	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d calls failed, e.g. %v", n, calls.Load(), firstErr.Load())
	}
	if over.Load() == 0 {
		t.Error("no call was over the limit: the hot tenants were not hot")
	}
	if r2 > r1*(1+soakDrift)+soakRSSSlack/(1<<20) {
		t.Errorf("RSS grew: second-half max %.1f MiB, first-half max %.1f MiB (allowed %.0f%% + %d MiB)", r2, r1, 100*soakDrift, soakRSSSlack>>20)
	}
	if g2 > g1+soakGoroutineAdd {
		t.Errorf("goroutines grew: second-half max %.0f, first-half max %.0f (allowed +%d)", g2, g1, soakGoroutineAdd)
	}
}
