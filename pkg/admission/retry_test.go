package admission_test

import (
	"context"
	"testing"
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
