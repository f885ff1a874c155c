package app

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

const failureRules = `domain: e2e
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func degraded(resp *rlsv3.RateLimitResponse) bool {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "x-tollgate-degraded" && h.GetValue() == "store" {
			return true
		}
	}
	return false
}

// TestServeRedisKilled kills the real Redis under a serving replica, for
// each --store-failure: every ShouldRateLimit is still answered, by the
// policy, marked degraded, within the store timeout plus a margin;
// /readyz is unready only under deny; and once Redis is back, answers come
// from it again within the circuit's longest backoff plus a margin.
func TestServeRedisKilled(t *testing.T) {
	t.Parallel()
	const (
		calls = 30
		// storeTimeout is above the 10ms default: this test is about the
		// policies and recovery, and on a loaded CI machine (-race,
		// packages in parallel) the probe after a restart must dial and
		// load the function library within it, or recovery waits for
		// the next probe.
		storeTimeout = "100ms"
		// answerBound is generous: a degraded answer takes the store
		// timeout at most, or microseconds with the circuit open; the
		// rest is a loaded test machine's scheduling.
		answerBound = 250 * time.Millisecond
		// recoveryBound: the circuit probes at least once a second.
		recoveryBound = 3 * time.Second
	)
	tests := []struct {
		policy    string
		wantOK    int // of calls, while Redis is down
		wantReady bool
	}{
		{policy: "allow", wantOK: calls, wantReady: true},
		{policy: "deny", wantOK: 0, wantReady: false},
		{policy: "local", wantOK: 10, wantReady: true}, // 100 x the automatic share, 0.1/1 replica
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
			defer cancel()
			srv := redistest.Start(t)
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "rules.yaml"), failureRules)
			r := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--store-failure", tt.policy, "--store-timeout", storeTimeout)
			r.poll("/readyz", func() bool { code, _ := r.get("/readyz"); return code == http.StatusOK })
			// The first calls dial Redis and may miss the timeout on a
			// busy machine (-race, parallel tests); a tenant of its own
			// keeps them out of the counts below.
			r.poll("an answer from Redis", func() bool { return !degraded(r.call("warm-up")) })

			srv.Kill()
			ok, slowest := 0, time.Duration(0)
			for range calls {
				start := time.Now()
				resp := r.call("acme") // fails the test on a gRPC error
				slowest = max(slowest, time.Since(start))
				if !degraded(resp) {
					t.Fatalf("with Redis killed: %v, want x-tollgate-degraded: store", resp)
				}
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					ok++
				}
			}
			t.Logf("--store-failure=%s: slowest degraded answer %v", tt.policy, slowest)
			if slowest > answerBound {
				t.Errorf("slowest degraded answer took %v, want under %v", slowest, answerBound)
			}
			if ok != tt.wantOK {
				t.Errorf("%d of %d calls OK with Redis killed, want %d", ok, calls, tt.wantOK)
			}
			if code, body := r.get("/readyz"); (code == http.StatusOK) != tt.wantReady {
				t.Errorf("/readyz with Redis killed = %d %q, want ready %v", code, body, tt.wantReady)
			}
			if _, metrics := r.get("/metrics"); !strings.Contains(metrics, `tollgate_store_degraded_decisions_total{domain="e2e",policy="`+tt.policy+`"} 30`) {
				t.Errorf("/metrics lacks 30 degraded decisions by %s", tt.policy)
			}

			// A longer outage: the circuit opens once the failures have
			// lasted storeguard.DefaultFailFor, and failed probes double
			// its backoff to its longest, 1s, the worst case for recovery.
			for killed := time.Now(); time.Since(killed) < 2*time.Second; {
				if resp := r.call("acme"); !degraded(resp) {
					t.Fatalf("with Redis killed: %v, want x-tollgate-degraded: store", resp)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if _, metrics := r.get("/metrics"); !strings.Contains(metrics, "tollgate_store_circuit_state 2") {
				t.Errorf("/metrics lacks tollgate_store_circuit_state 2 after 2s of failures")
			}
			// /readyz says why decisions are degraded, and never the URL.
			if _, body := r.get("/readyz"); !strings.Contains(body, "store circuit: open since") || !strings.Contains(body, "degraded decisions in the last minute:") ||
				strings.Contains(body, srv.URL()) {
				t.Errorf("/readyz during the outage = %q, want the circuit open and the degraded decisions, without the URL", body)
			}
			// Logged, but not once per decision: the first line at once,
			// the rest counted into one line per 10s.
			out := r.stderr.String()
			if n := strings.Count(out, "store circuit opened"); n < 1 || n > 2 {
				t.Errorf("the log has %d lines on the circuit opening, want 1 or 2:\n%s", n, out)
			}
			if n := strings.Count(out, "degraded decisions:"); n < 1 || n > 2 {
				t.Errorf("the log has %d lines on about 100 degraded decisions, want 1 or 2:\n%s", n, out)
			}

			srv.Restart()
			back := time.Now()
			r.poll("an answer from Redis", func() bool { return !degraded(r.call("acme")) })
			took := time.Since(back)
			t.Logf("--store-failure=%s: answers from Redis again %v after the restart", tt.policy, took)
			if took > recoveryBound {
				t.Errorf("answers from Redis again after %v, want within %v", took, recoveryBound)
			}
			if code, body := r.get("/readyz"); code != http.StatusOK {
				t.Errorf("/readyz after Redis came back = %d %q", code, body)
			}
		})
	}
}

// defaultFailure is failureFlags as parsed with no flag set.
var defaultFailure = failureFlags{timeout: 15 * time.Millisecond, policy: "local", fraction: 0, parsed: limit.FailureLocal}

func TestFailureFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    map[string]string
		want    failureFlags
		wantErr string
	}{
		{name: "defaults", want: defaultFailure},
		{
			name: "from the environment",
			give: map[string]string{"TOLLGATE_STORE_TIMEOUT": "5ms", "TOLLGATE_STORE_FAILURE": "local", "TOLLGATE_STORE_FAILURE_LOCAL_FRACTION": "0.25"},
			want: failureFlags{timeout: 5 * time.Millisecond, policy: "local", fraction: 0.25, parsed: limit.FailureLocal},
		},
		{name: "unknown policy", give: map[string]string{"TOLLGATE_STORE_FAILURE": "open"}, wantErr: `--store-failure "open" is not one of allow|deny|local`},
		{name: "fraction below 0", give: map[string]string{"TOLLGATE_STORE_FAILURE_LOCAL_FRACTION": "-0.1"}, wantErr: "--store-failure-local-fraction must be in [0,1] (0: automatic)"},
		{name: "fraction above 1", give: map[string]string{"TOLLGATE_STORE_FAILURE_LOCAL_FRACTION": "1.5"}, wantErr: "--store-failure-local-fraction must be in [0,1] (0: automatic)"},
		{name: "allow stays available", give: map[string]string{"TOLLGATE_STORE_FAILURE": "allow"},
			want: failureFlags{timeout: 15 * time.Millisecond, policy: "allow", parsed: limit.FailureAllow}},
		{name: "no timeout", give: map[string]string{"TOLLGATE_STORE_TIMEOUT": "0s"}, wantErr: "--store-timeout must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr buffer
			a := &App{Stderr: &stderr, LookupEnv: env(tt.give)}
			got, err := a.parseServeFlags(nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantErr) {
					t.Errorf("parseServeFlags = %v, stderr %q; want an error saying %q", err, stderr.String(), tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseServeFlags: %v\n%s", err, stderr.String())
			}
			if got.failure != tt.want {
				t.Errorf("failure flags = %+v, want %+v", got.failure, tt.want)
			}
		})
	}
}
