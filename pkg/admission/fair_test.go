package admission

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fairRules is a domain with plans free x1 and premium x4, a model rule
// shared by plan, a model rule shared by an explicit weight map, and an
// unshared rule beside them.
func fairRules(t testing.TB) (*limit.RuleSet, *limit.FairShare, *limit.FairShare) {
	t.Helper()
	byPlan := &limit.FairShare{Key: "tenant", Plan: true, DefaultWeight: 1,
		Rate:  &limit.FairPolicy{Backlog: time.Minute, Quantum: 1, Credit: 120, MaxKeys: 256},
		Token: &limit.FairPolicy{Backlog: time.Hour, Quantum: 1, Credit: 500, MaxKeys: 256},
	}
	byMap := &limit.FairShare{Key: "tenant", Weights: map[string]float64{"acme": 3}, DefaultWeight: 0.5,
		Rate: &limit.FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 5, MaxKeys: 256},
	}
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:  "d",
		Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 1, "premium": 4}},
		Descriptors: []*limit.Rule{
			{Key: "model", Value: "gpt-4o", Fair: byPlan,
				RateLimit:  &limit.Limit{Amount: 2400, Unit: limit.Minute},
				TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 10000, Unit: limit.Hour}},
			{Key: "model", Value: "small", Fair: byMap, RateLimit: &limit.Limit{Amount: 100, Unit: limit.Second}},
			{Key: "tenant", RateLimit: &limit.Limit{Amount: 60, Unit: limit.Minute}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs, byPlan, byMap
}

func TestDecideFairShare(t *testing.T) {
	t.Parallel()
	rs, byPlan, byMap := fairRules(t)
	bigKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("model", "gpt-4o"))
	tokKey := limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("model", "gpt-4o"))
	smallKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Second, "d", entries("model", "small"))
	tenantKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "acme"))
	type charge struct {
		key    string
		amount uint64
		fair   limit.FairCharge
	}
	tests := []struct {
		name string
		give limit.Request
		want []charge
	}{
		{
			name: "plan weight from a tier entry; the shared limits are not multiplied; the tenant's own limit is",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
				{Entries: entries("tier", "premium", "tenant", "acme")},
				{Entries: entries("model", "gpt-4o")},
			}},
			want: []charge{
				{tenantKey, 240, limit.FairCharge{}},
				{bigKey, 2400, limit.FairCharge{Policy: byPlan.Rate, Member: limit.FairMember("acme"), Weight: 4}},
				{tokKey, 10000, limit.FairCharge{Policy: byPlan.Token, Member: limit.FairMember("acme"), Weight: 4}},
			},
		},
		{
			name: "the key in a later descriptor; Request.Tier gives the weight over a tier entry",
			give: limit.Request{Domain: "d", Tier: "free", Descriptors: []limit.Descriptor{
				{Entries: entries("model", "gpt-4o", "tier", "premium")},
				{Entries: entries("tenant", "beta")},
			}},
			want: []charge{
				{bigKey, 2400, limit.FairCharge{Policy: byPlan.Rate, Member: limit.FairMember("beta"), Weight: 1}},
				{tokKey, 10000, limit.FairCharge{Policy: byPlan.Token, Member: limit.FairMember("beta"), Weight: 1}},
				{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "beta")), 60, limit.FairCharge{}},
			},
		},
		{
			name: "no fairness key: the overflow member, weighed by the default plan",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("model", "gpt-4o")}}},
			want: []charge{
				{bigKey, 2400, limit.FairCharge{Policy: byPlan.Rate, Member: limit.FairOverflowKey, Weight: 1}},
				{tokKey, 10000, limit.FairCharge{Policy: byPlan.Token, Member: limit.FairOverflowKey, Weight: 1}},
			},
		},
		{
			name: "weights map: a listed value",
			give: limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{
				{Entries: entries("model", "small")}, {Entries: entries("tenant", "acme")},
			}},
			want: []charge{
				{smallKey, 100, limit.FairCharge{Policy: byMap.Rate, Member: limit.FairMember("acme"), Weight: 3}},
				{tenantKey, 240, limit.FairCharge{}},
			},
		},
		{
			name: "weights map: a value not listed weighs default_weight, whatever the plan",
			give: limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{
				{Entries: entries("model", "small")}, {Entries: entries("tier", "premium", "tenant", "zed")},
			}},
			want: []charge{
				{smallKey, 100, limit.FairCharge{Policy: byMap.Rate, Member: limit.FairMember("zed"), Weight: 0.5}},
				{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "zed")), 240, limit.FairCharge{}},
			},
		},
		{
			name: "Envoy's own limit on the descriptor is not the shared one",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
				{Entries: entries("model", "small"), Override: &limit.Override{Amount: 7, Unit: limit.Second}},
				{Entries: entries("tenant", "acme")},
			}},
			want: []charge{{smallKey, 7, limit.FairCharge{}}, {tenantKey, 60, limit.FairCharge{}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			if _, err := NewLimiter(st, nil, rs).Decide(context.Background(), &tt.give); err != nil {
				t.Fatal(err)
			}
			if len(st.charges) != len(tt.want) {
				t.Fatalf("%d charges, want %d: %+v", len(st.charges), len(tt.want), st.charges)
			}
			for i, c := range st.charges {
				w := tt.want[i]
				if c.Key != w.key || c.Amount != w.amount || c.Fair != w.fair {
					t.Errorf("charge %d = {%s %d %+v}, want {%s %d %+v}", i, c.Key, c.Amount, c.Fair, w.key, w.amount, w.fair)
				}
			}
		})
	}
}

// TestExplainFairShare: explain shows the shared limit unmultiplied, with
// the member's value and weight.
func TestExplainFairShare(t *testing.T) {
	t.Parallel()
	rs, byPlan, _ := fairRules(t)
	ex, err := Explain(rs.Domain("d"), &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
		{Entries: entries("tier", "premium", "model", "gpt-4o")}, {Entries: entries("tenant", "acme")},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Charges) != 3 {
		t.Fatalf("%d charges, want 3", len(ex.Charges))
	}
	ce := ex.Charges[0]
	if ce.FairValue != "acme" || ce.Charge.Fair.Policy != byPlan.Rate || ce.Charge.Fair.Weight != 4 {
		t.Errorf("fair = %q %+v, want acme, the rate policy, weight 4", ce.FairValue, ce.Charge.Fair)
	}
	if ce.Planned.Amount != 2400 || ce.Limit.Amount != 2400 {
		t.Errorf("planned %d, effective %d, want 2400 both: a shared limit is not multiplied", ce.Planned.Amount, ce.Limit.Amount)
	}
}

// fitStore admits everything and keeps nothing.
type fitStore struct{}

func (fitStore) Apply(_ context.Context, _ time.Time, cs []limit.Charge, res []limit.Result) (bool, error) {
	for i := range cs {
		res[i] = limit.Result{Fits: true, Remaining: cs[i].Amount}
	}
	return true, nil
}

// TestFairShareAllocs: a fair-shared rule costs a decision the member's
// string and nothing more than the same rule unshared. Not parallel:
// AllocsPerRun counts the whole process's allocations.
func TestFairShareAllocs(t *testing.T) {
	shared, _, _ := fairRules(t)
	plain := func() *limit.RuleSet {
		rs, err := limit.NewRuleSet(&limit.Domain{
			Name:  "d",
			Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 1, "premium": 4}},
			Descriptors: []*limit.Rule{{Key: "model", Value: "gpt-4o",
				RateLimit:  &limit.Limit{Amount: 2400, Unit: limit.Minute},
				TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 10000, Unit: limit.Hour}},
				{Key: "tenant", RateLimit: &limit.Limit{Amount: 60, Unit: limit.Minute}},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}()
	req := &limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{
		{Entries: entries("model", "gpt-4o")}, {Entries: entries("tenant", "acme")},
	}}
	allocs := func(rs *limit.RuleSet) float64 {
		l := NewLimiter(fitStore{}, nil, rs)
		return testing.AllocsPerRun(200, func() {
			if _, err := l.Decide(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		})
	}
	p, s := allocs(plain), allocs(shared)
	if s > p+1 {
		t.Errorf("allocs per decision: %v shared, %v unshared; want at most one more (the member)", s, p)
	}
	t.Logf("allocs per decision: unshared %v, shared %v", p, s)
}
