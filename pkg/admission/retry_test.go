package admission_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// fixedSignals answers the same retry signals for every model and
// records the models asked for.
type fixedSignals struct {
	s      limit.RetrySignals
	models []string
}

func (f *fixedSignals) RetrySignals(_, model string) limit.RetrySignals {
	f.models = append(f.models, model)
	return f.s
}

// probeBreakers admits every request as a half-open breaker's probe.
type probeBreakers struct{}

func (probeBreakers) Allow(context.Context, time.Time, string, string, string) (limit.BreakerVerdict, error) {
	return limit.BreakerVerdict{Allowed: true, ProbeID: "p1"}, nil
}

func (probeBreakers) Release(context.Context, time.Time, string, string, string, string) error {
	return nil
}

func retryRules(t testing.TB, budget *limit.RetryBudget) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:        "d",
		RetryBudget: budget,
		Breakers:    []limit.BreakerConfig{{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute}},
		Descriptors: []*limit.Rule{
			{Key: "model", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Minute, Algorithm: limit.FixedWindow}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestDecideRetryBudget(t *testing.T) {
	t.Parallel()
	def := limit.DefaultRetryBudget()
	req := func() *limit.Request {
		return &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "model", Value: "m"}}}}}
	}
	tests := []struct {
		name     string
		budget   *limit.RetryBudget
		give     limit.RetrySignals
		source   bool
		probe    bool
		second   bool // decide a second request, which the limit refuses
		want     int
		wantHas  bool
		wantCode limit.Code
	}{
		{name: "no budget: nothing told", budget: nil, source: true, wantCode: limit.CodeOK},
		{name: "calm", budget: &def, source: true, want: 3, wantHas: true, wantCode: limit.CodeOK},
		{name: "no source reads calm", budget: &def, want: 3, wantHas: true, wantCode: limit.CodeOK},
		{name: "errors above 0.2", budget: &def, source: true, give: limit.RetrySignals{ErrorRate: 0.3}, want: 2, wantHas: true, wantCode: limit.CodeOK},
		{name: "overloaded replica", budget: &def, source: true, give: limit.RetrySignals{Pressure: 0.95}, want: 0, wantHas: true, wantCode: limit.CodeOK},
		{name: "breaker open by the source", budget: &def, source: true, give: limit.RetrySignals{BreakerOpen: true}, want: 0, wantHas: true, wantCode: limit.CodeOK},
		{name: "a half-open probe", budget: &def, source: true, probe: true, want: 0, wantHas: true, wantCode: limit.CodeOK},
		{name: "refused: nothing told", budget: &def, source: true, second: true, wantCode: limit.CodeOverLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := &fixedSignals{s: tt.give}
			var opts []admission.Option
			if tt.source {
				opts = append(opts, admission.WithRetrySource(src))
			}
			if tt.probe {
				opts = append(opts, admission.WithBreakers(probeBreakers{}))
			}
			l := admission.NewLimiter(memstore.New(), nil, retryRules(t, tt.budget), opts...)
			dec, err := l.Decide(context.Background(), req())
			if err != nil {
				t.Fatal(err)
			}
			if tt.second {
				if dec, err = l.Decide(context.Background(), req()); err != nil {
					t.Fatal(err)
				}
			}
			if dec.Code != tt.wantCode || dec.HasRetries != tt.wantHas || dec.Retries != tt.want {
				t.Errorf("Decide = code %v, retries %d (has %v); want code %v, %d (has %v)", dec.Code, dec.Retries, dec.HasRetries, tt.wantCode, tt.want, tt.wantHas)
			}
			if tt.source && tt.budget != nil && !tt.second && (len(src.models) != 1 || src.models[0] != "m") {
				t.Errorf("signals asked for models %q, want [m]", src.models)
			}
		})
	}
}

// TestDecideRetryBudgetQueueWait: the Limiter reads the queue wait of the
// request's own domain from its own queue, with no source: a domain whose
// waits average above max_queue_wait gives 0 retries, and a domain
// without a queue reads no wait.
func TestDecideRetryBudgetQueueWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		budget := limit.DefaultRetryBudget()
		budget.MaxQueueWait = 500 * time.Millisecond
		rs, err := limit.NewRuleSet(
			&limit.Domain{
				Name:        "q",
				RetryBudget: &budget,
				Queue:       &limit.Queue{Default: limit.QueueTier{MaxWait: time.Second, MaxLength: 10}},
				Descriptors: []*limit.Rule{{Key: "model", MaxConcurrent: 1, Lease: time.Minute}},
			},
			&limit.Domain{
				Name:        "other",
				RetryBudget: &budget,
				Descriptors: []*limit.Rule{{Key: "model", MaxConcurrent: 1, Lease: time.Minute}},
			},
		)
		if err != nil {
			t.Fatal(err)
		}
		l := admission.NewLimiter(memstore.New(), nil, rs, admission.WithQueue(admission.NewQueue(nil)))
		ctx := context.Background()
		req := func(domain, id string) *limit.Request {
			return &limit.Request{Domain: domain, ID: id, Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "model", Value: "m"}}}}}
		}
		decide := func(r *limit.Request, wantCode limit.Code) *admission.Decision {
			t.Helper()
			dec, err := l.Decide(ctx, r)
			if err != nil || dec.Code != wantCode {
				t.Fatalf("Decide(%s %s) = %+v, %v; want code %v", r.Domain, r.ID, dec, err, wantCode)
			}
			return dec
		}
		tests := []struct {
			name string
			give func() *admission.Decision
			want int
		}{
			{name: "before any wait", give: func() *admission.Decision { return decide(req("q", "holder"), limit.CodeOK) }, want: 3},
			{name: "after a 1s wait", give: func() *admission.Decision {
				decide(req("q", "waiter"), limit.CodeOverLimit) // waits its whole bound
				if err := l.Release(ctx, req("q", "holder")); err != nil {
					t.Fatal(err)
				}
				return decide(req("q", "next"), limit.CodeOK)
			}, want: 0},
			{name: "another domain's waits do not count", give: func() *admission.Decision { return decide(req("other", "o"), limit.CodeOK) }, want: 3},
		}
		for _, tt := range tests { // in order: each builds on the one before
			if dec := tt.give(); !dec.HasRetries || dec.Retries != tt.want {
				t.Errorf("%s: retries %d (has %v), want %d", tt.name, dec.Retries, dec.HasRetries, tt.want)
			}
		}
	})
}
