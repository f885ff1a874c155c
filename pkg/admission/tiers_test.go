package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// tierRules is a domain with premium x3, standard x2, free x1 and half
// x0.5, whose default is free.
func tierRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:  "d",
		Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "standard": 2, "free": 1, "half": 0.5}},
		Descriptors: []*limit.Rule{
			{Key: "tenant", RateLimit: &limit.Limit{Name: "tenant_requests", Amount: 100, Unit: limit.Minute}, Children: []*limit.Rule{
				{Key: "model", Value: "gpt-4o", TokenLimit: &limit.Limit{Name: "tokens", Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour}},
			}},
			{Key: "model", RateLimit: &limit.Limit{Amount: 10, Unit: limit.Second, Algorithm: limit.TokenBucket, Burst: 4}},
			{Key: "one", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Second}},
			{Key: "zero", RateLimit: &limit.Limit{Amount: 0, Unit: limit.Second}},
			{Key: "slots", MaxConcurrent: 5, Lease: time.Minute},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestDecideTiers(t *testing.T) {
	t.Parallel()
	tenantKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a"))
	tokenKey := limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("tenant", "a", "model", "gpt-4o"))
	bucketKey := limit.Key(limit.Requests, limit.TokenBucket, time.Second, "d", entries("model", "m"))
	type charge struct {
		key           string
		amount, burst uint64
	}
	tests := []struct {
		name       string
		give       limit.Request
		wantTier   string
		want       []charge
		wantLimits []uint64 // Status.Limit.Amount per descriptor, 0 for none
	}{
		{
			name:       "premium from a descriptor entry, removed before matching and keying",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tier", "premium", "tenant", "a")}}},
			wantTier:   "premium",
			want:       []charge{{tenantKey, 300, 0}},
			wantLimits: []uint64{300},
		},
		{
			name:       "the tier entry anywhere in the descriptor",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "tier", "standard")}}},
			wantTier:   "standard",
			want:       []charge{{tenantKey, 200, 0}},
			wantLimits: []uint64{200},
		},
		{
			name:       "no tier: the default",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			wantTier:   "free",
			want:       []charge{{tenantKey, 100, 0}},
			wantLimits: []uint64{100},
		},
		{
			name:       "an unknown tier: the default",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tier", "gold", "tenant", "a")}}},
			wantTier:   "free",
			want:       []charge{{tenantKey, 100, 0}},
			wantLimits: []uint64{100},
		},
		{
			name: "descriptors disagree: the first wins, and each is stripped",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
				{Entries: entries("tenant", "a", "tier", "standard")},
				{Entries: entries("tier", "premium", "tenant", "a", "model", "gpt-4o")},
			}},
			wantTier:   "standard",
			want:       []charge{{tenantKey, 200, 0}, {tokenKey, 2000, 0}},
			wantLimits: []uint64{200, 2000},
		},
		{
			name:       "limit.Request.Tier wins over a descriptor entry",
			give:       limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{{Entries: entries("tier", "free", "tenant", "a")}}},
			wantTier:   "premium",
			want:       []charge{{tenantKey, 300, 0}},
			wantLimits: []uint64{300},
		},
		{
			name:       "an unknown limit.Request.Tier: the default",
			give:       limit.Request{Domain: "d", Tier: "gold", Descriptors: []limit.Descriptor{{Entries: entries("tier", "premium", "tenant", "a")}}},
			wantTier:   "free",
			want:       []charge{{tenantKey, 100, 0}},
			wantLimits: []uint64{100},
		},
		{
			name:       "token bucket burst scaled",
			give:       limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{{Entries: entries("model", "m")}}},
			wantTier:   "premium",
			want:       []charge{{bucketKey, 30, 12}},
			wantLimits: []uint64{30},
		},
		{
			name:       "a fraction floors, but never below 1",
			give:       limit.Request{Domain: "d", Tier: "half", Descriptors: []limit.Descriptor{{Entries: entries("model", "m")}, {Entries: entries("one", "x")}, {Entries: entries("zero", "x")}}},
			wantTier:   "half",
			want:       []charge{{bucketKey, 5, 2}, {limit.Key(limit.Requests, limit.SlidingWindow, time.Second, "d", entries("one", "x")), 1, 0}, {limit.Key(limit.Requests, limit.SlidingWindow, time.Second, "d", entries("zero", "x")), 0, 0}},
			wantLimits: []uint64{5, 1, 0},
		},
		{
			name: "override first, then the multiplier",
			give: limit.Request{Domain: "d", Tier: "premium", Overrides: map[string]limit.Override{"tenant_requests": {Amount: 7}, "tokens": {Amount: 50}},
				Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "gpt-4o")}, {Entries: entries("tenant", "a")}}},
			wantTier:   "premium",
			want:       []charge{{tokenKey, 150, 0}, {tenantKey, 21, 0}},
			wantLimits: []uint64{150, 21},
		},
		{
			name:       "Envoy's descriptor limit is explicit: not scaled",
			give:       limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a"), Override: &limit.Override{Amount: 40, Unit: limit.Minute}}}},
			wantTier:   "premium",
			want:       []charge{{tenantKey, 40, 0}},
			wantLimits: []uint64{40},
		},
		{
			name:       "a descriptor of the tier entry alone matches nothing",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tier", "premium"), Override: &limit.Override{Amount: 1, Unit: limit.Second}}}},
			wantTier:   "premium",
			want:       nil,
			wantLimits: []uint64{0},
		},
		{
			name:       "max_concurrent scaled",
			give:       limit.Request{Domain: "d", Tier: "standard", ID: "r1", Descriptors: []limit.Descriptor{{Entries: entries("slots", "x")}}},
			wantTier:   "standard",
			want:       []charge{{limit.Key(limit.Requests, limit.Concurrency, time.Minute, "d", entries("slots", "x")), 10, 0}},
			wantLimits: []uint64{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			dec, err := NewLimiter(st, nil, tierRules(t)).Decide(context.Background(), &tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Tier != tt.wantTier {
				t.Errorf("Tier = %q, want %q", dec.Tier, tt.wantTier)
			}
			var got []charge
			for _, c := range st.charges {
				got = append(got, charge{c.Key, c.Amount, c.Burst})
			}
			if len(got) != len(tt.want) {
				t.Fatalf("charges %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("charge %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
			for i, want := range tt.wantLimits {
				var amount uint64
				if l := dec.Statuses[i].Limit; l != nil {
					amount = l.Amount
				}
				if amount != want {
					t.Errorf("status %d limit = %d, want %d", i, amount, want)
				}
			}
		})
	}
}

// TestDecideTiersKeepRules checks that scaling copies: the rule's own
// limit is untouched, and a multiplier of 1 reports the rule's limit itself.
func TestDecideTiersKeepRules(t *testing.T) {
	t.Parallel()
	rs := tierRules(t)
	l := NewLimiter(&recordStore{}, nil, rs)
	rule := rs.Domain("d").Match(entries("tenant", "a"))
	for _, tier := range []string{"premium", "free", "premium"} {
		dec, err := l.Decide(context.Background(), &limit.Request{Domain: "d", Tier: tier, Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}})
		if err != nil {
			t.Fatal(err)
		}
		if tier == "free" && dec.Statuses[0].Limit != rule.RateLimit {
			t.Errorf("free: status limit %p, want the rule's own %p", dec.Statuses[0].Limit, rule.RateLimit)
		}
	}
	if rule.RateLimit.Amount != 100 {
		t.Errorf("rule amount = %d after decisions, want 100", rule.RateLimit.Amount)
	}
}

func TestDecideWithoutTiers(t *testing.T) {
	t.Parallel()
	st := &recordStore{}
	dec, err := NewLimiter(st, nil, testRules(t)).Decide(context.Background(), &limit.Request{Domain: "d", Tier: "premium",
		Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}})
	if err != nil {
		t.Fatal(err)
	}
	if dec.Tier != "" || len(st.charges) != 1 || st.charges[0].Amount != 100 {
		t.Errorf("decision tier %q, charges %+v; want no tier and the rule's 100", dec.Tier, st.charges)
	}
}

// TestReconcileTiers checks that a reservation is settled against the
// limit it was reserved on, and under the same hash tag as its counters.
func TestReconcileTiers(t *testing.T) {
	t.Parallel()
	st := &recordStore{}
	req := &limit.Request{Domain: "d", ID: "r1", Tier: "premium", Descriptors: []limit.Descriptor{{Entries: entries("tier", "premium", "tenant", "a", "model", "gpt-4o")}}}
	if _, err := NewLimiter(st, nil, tierRules(t)).Settle(context.Background(), req, time.UnixMilli(1000), 300, 100); err != nil {
		t.Fatal(err)
	}
	want := []limit.Charge{
		{Key: limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("tenant", "a", "model", "gpt-4o")), Amount: 3000, Window: time.Hour, Cost: -200, At: 1000},
		{Key: limit.OnceKey("d", entries("tenant", "a", "model", "gpt-4o"), "r1"), Algorithm: limit.Once, Window: time.Hour, Cost: 1},
	}
	if len(st.charges) != len(want) {
		t.Fatalf("charges %+v", st.charges)
	}
	for i := range want {
		if st.charges[i] != want[i] {
			t.Errorf("charge %d = %+v\nwant %+v", i, st.charges[i], want[i])
		}
	}
}

func TestScale(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     uint64
		giveMult float64
		want     uint64
	}{
		{"one", 100, 1, 100},
		{"three", 100, 3, 300},
		{"half floors", 5, 0.5, 2},
		{"at least one", 1, 0.5, 1},
		{"zero stays zero", 0, 3, 0},
		{"exact where float64 is not", 100, 0.29, 29},
		{"tiny multiplier", 1000, 0.000001, 1},
		{"capped where Lua counts exactly", 1 << 53, 1000, 1 << 53},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			micro := uint64(tt.giveMult*limit.MicroOne + 0.5)
			if got := limit.Scale(tt.give, micro); got != tt.want {
				t.Errorf("limit.Scale(%d, %v) = %d, want %d", tt.give, tt.giveMult, got, tt.want)
			}
		})
	}
}

func TestNewRuleSetRejectsTiers(t *testing.T) {
	t.Parallel()
	plans := map[string]float64{"premium": 3, "free": 1}
	tests := []struct {
		name string
		give *limit.Tiers
		want string
	}{
		{"no key", &limit.Tiers{Default: "free", Plans: plans}, "key is empty"},
		{"no plans", &limit.Tiers{Key: "tier", Default: "free"}, "no plans"},
		{"default not a plan", &limit.Tiers{Key: "tier", Default: "gold", Plans: plans}, `default "gold" is not one of the plans`},
		{"zero multiplier", &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 0}}, "outside (0, 1000]"},
		{"huge multiplier", &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 1001}}, "outside (0, 1000]"},
		{"a rule on the tier key", &limit.Tiers{Key: "tenant", Default: "free", Plans: plans}, `rule tenant matches the tiers key "tenant"`},
		{"a nested rule on the tier key", &limit.Tiers{Key: "model", Default: "free", Plans: plans}, `rule tenant.model matches the tiers key "model"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := limit.NewRuleSet(&limit.Domain{Name: "x", Tiers: tt.give, Descriptors: []*limit.Rule{
				{Key: "tenant", RateLimit: perMinute(1), Children: []*limit.Rule{{Key: "model", RateLimit: perMinute(1)}}},
			}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
