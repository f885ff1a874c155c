// Package prometheus holds the acceptance test of pressure.PromQuery
// against a real Prometheus (Debian's prometheus package, which `make
// test` installs): it scrapes a gauge served by the test, and the
// signal follows the gauge.
package prometheus

import (
	"context"
	"errors"
	"fmt"
	"github.com/tollgate-dev/tollgate/test/redistest"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/pkg/pressure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds the whole test: Prometheus starts in a second or
// two and scrapes every second.
const testTimeout = 25 * time.Second

// skipEnv names the variable that skips the test where prometheus is
// not installed; without it a missing binary fails, so that CI cannot
// silently stop testing the query source.
const skipEnv = "TOLLGATE_SKIP_PROMETHEUS"

func TestPromQueryFollowsRealPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a real Prometheus to scrape: about 8 s")
	}
	t.Parallel()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv(skipEnv) == "1" {
			t.Skipf("prometheus is not installed and %s=1", skipEnv)
		}
		t.Fatalf("prometheus is not on PATH (apt-get install prometheus, or `make test` does it; %s=1 skips this test): %v", skipEnv, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	reg := prometheus.NewRegistry()
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_test_pressure", Help: "The pressure the test wants Prometheus to report."})
	reg.MustRegister(gauge)
	gauge.Set(0.8)
	exporter := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(exporter.Close)

	addr := startPrometheus(t, bin, exporter.Listener.Addr().String())

	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	var errMu sync.Mutex
	var lastErr error
	p, err := pressure.NewPromQuery(pressure.PromConfig{
		URL:      "http://" + addr,
		Query:    "max(tollgate_test_pressure)",
		Interval: 200 * time.Millisecond,
		Scope:    "global",
		Client:   &http.Client{Transport: transport},
		OnError: func(_ string, err error) {
			errMu.Lock()
			lastErr = err
			errMu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(runCtx)
	}()
	defer func() { stop(); <-done }()

	start := time.Now()
	for _, step := range []struct{ set, want float64 }{
		{set: 0.8, want: 0.8},
		{set: 0.3, want: 0.3},
		{set: 7, want: 1}, // clamped
	} {
		gauge.Set(step.set)
		if err := waitScore(ctx, p, step.want); err != nil {
			errMu.Lock()
			defer errMu.Unlock()
			t.Fatalf("gauge %v: %v (last query error: %v; state %+v)", step.set, err, lastErr, p.State())
		}
		t.Logf("gauge %v: score %v after %v", step.set, step.want, time.Since(start).Round(time.Millisecond))
		start = time.Now()
	}
}

// waitScore waits until p scores want.
func waitScore(ctx context.Context, p *pressure.PromQuery, want float64) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got := p.Score(time.Now())
		if got == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still %v: %w", got, ctx.Err())
		case <-tick.C:
		}
	}
}

// startAttempts bounds retries when a picked port is taken before
// prometheus binds it.
const startAttempts = 3

// startPrometheus runs prometheus scraping target every second on a free
// loopback port, waits until it is ready and returns its host:port. The
// process is killed when the test ends.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "prom.yml")
	body := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: tollgate
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	for attempt := range startAttempts {
		var addr string
		addr, err = spawn(t, bin, conf, filepath.Join(dir, "data"+strconv.Itoa(attempt)))
		if err == nil {
			return addr
		}
	}
	t.Fatalf("start prometheus after %d attempts: %v", startAttempts, err)
	return ""
}

// readyTimeout bounds how long prometheus may take to report ready.
const readyTimeout = 15 * time.Second

func spawn(t *testing.T, bin, conf, data string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a free port: %w", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cmd := exec.Command(bin,
		"--config.file="+conf,
		"--storage.tsdb.path="+data,
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	out := &redistest.TailBuffer{Max: 8 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("run %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	kill := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	if err := waitReady(addr, exited); err != nil {
		kill()
		return "", fmt.Errorf("%w; output:\n%s", err, out.String())
	}
	t.Cleanup(func() {
		kill()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	return addr, nil
}

// waitReady polls /-/ready until it answers 200, the process exits, or
// readyTimeout passes.
func waitReady(addr string, exited <-chan struct{}) error {
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: time.Second}
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get("http://" + addr + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		select {
		case <-exited:
			return errors.New("prometheus exited")
		case <-deadline.C:
			return fmt.Errorf("not ready on %s within %v: %w", addr, readyTimeout, err)
		case <-tick.C:
		}
	}
}
