package lifecycle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// ruleFile is a per-tenant limit high enough never to be reached; the
// tests read which rules serve from the answer's current limit.
func ruleFile(domain string, perMinute int) string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: %d}
`, domain, perMinute)
}

// configMap lays out dir as a Kubernetes ConfigMap volume does, or
// updates it: the data in a new hidden timestamped directory, ..data
// swapped to it by a rename, each key a symlink through ..data, the old
// directory removed.
func configMap(t testing.TB, dir, version string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_"+version)
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		writeFile(t, filepath.Join(ts, name), data)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data")) // "" the first time
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHotReloadUnderLoad drives ShouldRateLimit from many workers while
// the rules directory changes under the process: a rule file rewritten
// in place with a new limit, an invalid file added (the old rules must
// keep serving, and the failure counted) then removed, and a ConfigMap
// ..data symlink swap. Not one call may fail over the whole run.
func TestHotReloadUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a tollgate process under load for several seconds; skipped with -short")
	}
	t.Parallel()
	const workers = 16
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "plain.yaml"), ruleFile("plain", 1_000_000))
	configMap(t, dir, "01", map[string]string{"cm.yaml": ruleFile("cm", 2_000_000)})
	p := start(t, "--config", dir, "--log-level", "warn")
	client := rlsv3.NewRateLimitServiceClient(p.dial(t))
	ctx := t.Context()

	// limitOf asks for domain's current limit.
	limitOf := func(domain string) (uint32, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(cctx, request(domain, "tenant", "probe"))
		if err != nil {
			return 0, err
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
			return 0, fmt.Errorf("answer %v", resp)
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), nil
	}
	// waitLimit waits until domain serves want, and says how long it took.
	waitLimit := func(domain string, want uint32) time.Duration {
		t.Helper()
		began := time.Now()
		for {
			got, err := limitOf(domain)
			if err != nil {
				t.Fatalf("%s: %v", domain, err)
			}
			if got == want {
				return time.Since(began)
			}
			if time.Since(began) > 10*time.Second {
				t.Fatalf("%s still serves %d 10s after the change, want %d", domain, got, want)
			}
			time.Sleep(20 * time.Millisecond) // polling a real process
		}
	}
	reloads := func(result string) float64 {
		return p.scrape(t)[fmt.Sprintf("tollgate_config_reloads_total{result=%q}", result)]
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 0))
			domains := []string{"plain", "cm"}
			for loadCtx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				resp, err := client.ShouldRateLimit(cctx, request(domains[rng.IntN(2)], "tenant", fmt.Sprint("t", rng.IntN(1000))))
				cancel()
				calls.Add(1)
				if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("overall code %v", resp.GetOverallCode())
				}
				if err != nil && loadCtx.Err() == nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	defer func() {
		stopLoad()
		wg.Wait()
	}()

	waitLimit("plain", 1_000_000)
	waitLimit("cm", 2_000_000)
	time.Sleep(500 * time.Millisecond) // load on the first rules

	// 1. A rule file rewritten in place (truncate, write), as an editor
	// or `kubectl cp` does.
	writeFile(t, filepath.Join(dir, "plain.yaml"), ruleFile("plain", 1_100_000))
	took := waitLimit("plain", 1_100_000)
	t.Logf("rewrite: the new limit served after %v", took.Round(time.Millisecond))

	// 2. An invalid file: the reload is refused, counted, and the rules
	// in force keep serving; once removed, the rules load again.
	failures := reloads("failure")
	writeFile(t, filepath.Join(dir, "broken.yaml"), "domain: broken\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	began := time.Now()
	for reloads("failure") == failures {
		if time.Since(began) > 10*time.Second {
			t.Fatal("tollgate_config_reloads_total{result=\"failure\"} did not rise within 10s of an invalid file")
		}
		time.Sleep(20 * time.Millisecond) // polling a real process
	}
	t.Logf("invalid file: refused after %v", time.Since(began).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // load on the rules kept
	if got, err := limitOf("plain"); err != nil || got != 1_100_000 {
		t.Errorf("after an invalid file, plain serves %d (%v), want the rules in force: 1100000", got, err)
	}
	if got, err := limitOf("cm"); err != nil || got != 2_000_000 {
		t.Errorf("after an invalid file, cm serves %d (%v), want the rules in force: 2000000", got, err)
	}
	successes := reloads("success")
	if err := os.Remove(filepath.Join(dir, "broken.yaml")); err != nil {
		t.Fatal(err)
	}
	// The rules load again: a reload of its own, before the next change
	// (which would otherwise share its debounce and its count).
	began = time.Now()
	for reloads("success") == successes {
		if time.Since(began) > 10*time.Second {
			t.Fatal("tollgate_config_reloads_total{result=\"success\"} did not rise within 10s of removing the invalid file")
		}
		time.Sleep(20 * time.Millisecond) // polling a real process
	}

	// 3. A ConfigMap update: the ..data symlink swapped to new data.
	configMap(t, dir, "02", map[string]string{"cm.yaml": ruleFile("cm", 2_200_000)})
	took = waitLimit("cm", 2_200_000)
	t.Logf("..data swap: the new limit served after %v", took.Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // load on the last rules

	stopLoad()
	wg.Wait()
	m := p.scrape(t)
	t.Logf("%d calls from %d workers, %d failed; reloads: %v succeeded, %v refused",
		calls.Load(), workers, failed.Load(), m[`tollgate_config_reloads_total{result="success"}`], m[`tollgate_config_reloads_total{result="failure"}`])
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d calls failed during the reloads, e.g. %v", n, calls.Load(), firstErr.Load())
	}
	if got := m[`tollgate_config_reloads_total{result="success"}`]; got < 3 {
		t.Errorf("%v successful reloads, want at least 3 (rewrite, invalid file removed, ..data swap)", got)
	}
}
