package rls

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// waits records how the queue's waits ended.
type waits struct {
	mu  sync.Mutex
	got []admission.QueueOutcome
}

func (w *waits) Queued(string, string, int) {}
func (w *waits) Shed(string, string, bool)  {}
func (w *waits) Waited(_, _ string, _ time.Duration, o admission.QueueOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, o)
}

// TestShouldRateLimitQueueBound: over real gRPC, a ShouldRateLimit that a
// limit refuses waits in its domain's queue until the caller's deadline
// less admission.QueueMargin, and is answered OVER_LIMIT before the
// deadline, so Envoy applies our answer, not its failure_mode_deny; with
// no deadline it waits its max_wait. 100ms is the ratelimit filter's
// timeout in the shipped envoy/envoy.yaml.
func TestShouldRateLimitQueueBound(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		maxWait  time.Duration
		deadline time.Duration // 0: none
		want     time.Duration // the least the call takes
	}{
		{name: "the shipped 100ms timeout", maxWait: 3 * time.Second, deadline: 100 * time.Millisecond, want: 100*time.Millisecond - admission.QueueMargin},
		{name: "a 1s timeout", maxWait: 3 * time.Second, deadline: time.Second, want: time.Second - admission.QueueMargin},
		{name: "no deadline: max_wait", maxWait: 300 * time.Millisecond, want: 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rules := fmt.Sprintf("domain: q\nqueue: {max_wait: %s, max_length: 10}\ndescriptors:\n  - key: model\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", tt.maxWait)
			d, err := config.Parse("rules.yaml", []byte(rules))
			if err != nil {
				t.Fatal(err)
			}
			rs, err := limit.NewRuleSet(d)
			if err != nil {
				t.Fatal(err)
			}
			obs := &waits{}
			svc, err := New(admission.NewLimiter(memstore.New(), nil, rs, admission.WithQueue(admission.NewQueue(obs))), zap.NewNop(), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			client := rlsv3.NewRateLimitServiceClient(testutil.Serve(t, svc))
			req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "model", Value: "m"}}}}}
			bound, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the test's own bound
			defer cancel()
			if resp, err := client.ShouldRateLimit(bound, req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first call = %v, %v; want OK", resp, err)
			}
			// The margin covers the answer's way back; on a loaded machine
			// (2 cores, -race, other tests) one answer in about 75 came
			// late, so a call gets three tries: a margin that does not
			// hold fails them all.
			var fails []string
			for attempt := range 3 {
				took, outcome, err := heldCall(bound, client, req, obs, tt.deadline)
				switch {
				case err != nil:
					fails = append(fails, fmt.Sprintf("try %d: %v after %v", attempt, err, took))
					continue
				case outcome != admission.QueueTimeout:
					t.Fatalf("the wait ended %v, want a timeout", outcome)
				case took < tt.want-20*time.Millisecond:
					// The server's deadline is the client's less the way
					// there, so its wait may end a little before want.
					t.Fatalf("answered after %v, want a wait of about %v", took, tt.want)
				case tt.deadline == 0 && took > tt.want+2*time.Second:
					t.Fatalf("answered after %v, want about max_wait %v", took, tt.want)
				}
				if len(fails) > 0 {
					t.Logf("late answers before this one: %v", fails)
				}
				return
			}
			t.Errorf("no answer before the deadline in 3 tries: %v", fails)
		})
	}
}

// heldCall asks req, which the limit refuses, under deadline (0: none)
// and returns how long it took, how the server's wait ended, and the
// call's error, or an error when the answer is not OVER_LIMIT.
func heldCall(ctx context.Context, client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, obs *waits, deadline time.Duration) (time.Duration, admission.QueueOutcome, error) {
	if deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	start := time.Now()
	resp, err := client.ShouldRateLimit(ctx, req)
	took := time.Since(start)
	if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		err = fmt.Errorf("answer %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	outcome := admission.QueueGone
	if n := len(obs.got); n > 0 {
		outcome = obs.got[n-1]
	}
	return took, outcome, err
}
