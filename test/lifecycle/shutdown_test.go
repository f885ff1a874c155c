package lifecycle

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

// shutdownCall is one call of TestGracefulShutdownUnderLoad, times since
// the run began.
type shutdownCall struct {
	send, recv time.Duration
	code       codes.Code
}

// TestGracefulShutdownUnderLoad sends SIGTERM while workers drive calls,
// some of them held in Redis by CLIENT PAUSE so that they are surely in
// flight: those finish OK, calls made once the server has stopped taking
// them are refused with Unavailable at once (none hangs, none gets
// another code), and the process exits 0 within the drain timeout.
func TestGracefulShutdownUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and a tollgate process; skipped with -short")
	}
	t.Parallel()
	const (
		workers      = 32
		conns        = 4
		pause        = 100 * time.Millisecond // well under the Redis client's 250ms read timeout
		drainTimeout = 10 * time.Second       // server.DefaultDrainTimeout
		callTimeout  = 5 * time.Second
	)
	rdb := redistest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "plain.yaml"), ruleFile("plain", 1_000_000))
	// Every decision asks Redis (no leases), and waits for it longer than
	// the pause; a store failure would deny, which counts as a bad answer.
	p := start(t, "--config", dir, "--redis-url", rdb.URL(), "--lease-fraction=0",
		"--store-timeout=1s", "--store-failure=deny", "--log-level", "info")
	clients := make([]rlsv3.RateLimitServiceClient, conns)
	for i := range clients {
		clients[i] = rlsv3.NewRateLimitServiceClient(p.dial(t))
	}
	ctx := t.Context()
	began := time.Now()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	results := make([][]shutdownCall, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				send := time.Since(began)
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				resp, err := clients[w%conns].ShouldRateLimit(cctx, request("plain", "tenant", fmt.Sprint("t", w, "-", i%100)))
				cancel()
				c := shutdownCall{send: send, recv: time.Since(began), code: status.Code(err)}
				if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					c.code = codes.Unknown
				}
				results[w] = append(results[w], c)
				if c.code == codes.Unavailable {
					time.Sleep(10 * time.Millisecond) // a client backing off, not spinning
				}
			}
		})
	}

	time.Sleep(time.Second) // under load
	if err := rdb.Client(t).Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	time.Sleep(pause / 3) // calls pile up in Redis
	sigAt := time.Since(began)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(drainTimeout + 5*time.Second):
		t.Fatalf("tollgate still running %v after SIGTERM", drainTimeout+5*time.Second)
	}
	exitAt := time.Since(began)
	time.Sleep(500 * time.Millisecond) // calls against the stopped process
	stopLoad()
	wg.Wait()

	var inFlightOK, after, afterOK, afterUnavailable, total int
	var slowest time.Duration
	bad := map[codes.Code]int{}
	for _, rs := range results {
		for _, c := range rs {
			total++
			slowest = max(slowest, c.recv-c.send)
			switch {
			case c.send < sigAt && c.recv >= sigAt: // in flight at SIGTERM
				if c.code == codes.OK {
					inFlightOK++
				} else {
					bad[c.code]++
					t.Errorf("a call in flight at SIGTERM (+%v..+%v) ended %v, want OK", c.send, c.recv, c.code)
				}
			case c.send >= sigAt:
				after++
				switch c.code {
				case codes.OK: // sent before the server's GOAWAY reached the client
					afterOK++
				case codes.Unavailable:
					afterUnavailable++
				default:
					bad[c.code]++
				}
			case c.code != codes.OK:
				bad[c.code]++
			}
		}
	}
	t.Logf("%d calls; SIGTERM at +%v with %d calls in flight (held %v in Redis), all finished OK; exit %v after SIGTERM (drain timeout %v)",
		total, sigAt.Round(time.Millisecond), inFlightOK, pause, (exitAt - sigAt).Round(time.Millisecond), drainTimeout)
	t.Logf("calls sent after SIGTERM: %d, %d OK (before the GOAWAY reached the client), %d Unavailable; slowest call %v",
		after, afterOK, afterUnavailable, slowest.Round(time.Millisecond))
	if len(bad) > 0 {
		t.Errorf("calls ended with codes other than OK or (after SIGTERM) Unavailable: %v", bad)
	}
	if inFlightOK < workers/2 {
		t.Errorf("only %d calls were in flight at SIGTERM, want most of the %d workers' (the pause did not hold them)", inFlightOK, workers)
	}
	if afterUnavailable == 0 {
		t.Error("no call after SIGTERM was refused: the load did not outlive the process")
	}
	if slowest < pause/2 {
		t.Errorf("the slowest call took %v: CLIENT PAUSE %v held no call", slowest, pause)
	}
	if slowest > 2*time.Second {
		t.Errorf("the slowest call took %v: a call hung instead of being refused", slowest)
	}
	if p.waitErr != nil {
		t.Errorf("tollgate exited with %v, want 0", p.waitErr)
	}
	if d := exitAt - sigAt; d > drainTimeout {
		t.Errorf("tollgate exited %v after SIGTERM, want within the drain timeout %v", d, drainTimeout)
	}
}
