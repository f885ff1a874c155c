package admission

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fakeShedder answers a fixed limit.ShedState per tier, and records the scopes
// asked for.
type fakeShedder struct {
	state  map[string]limit.ShedState // by tier
	scopes []string
}

func (f *fakeShedder) Shed(domain, scope, tier string) limit.ShedState {
	f.scopes = append(f.scopes, scope)
	return f.state[tier]
}

// fakeBreakers answers a fixed verdict per name and records releases.
type fakeBreakers struct {
	verdict  map[string]limit.BreakerVerdict // by name; absent: allowed
	err      error
	allows   int
	released []string // probe IDs
}

func (f *fakeBreakers) Allow(_ context.Context, _ time.Time, _, _, name string) (limit.BreakerVerdict, error) {
	f.allows++
	if f.err != nil {
		return limit.BreakerVerdict{}, f.err
	}
	if v, ok := f.verdict[name]; ok {
		return v, nil
	}
	return limit.BreakerVerdict{Allowed: true}, nil
}

func (f *fakeBreakers) Release(_ context.Context, _ time.Time, _, _, _, probeID string) error {
	f.released = append(f.released, probeID)
	return nil
}

func admissionRules(t testing.TB, scope string) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:     "d",
		Tiers:    &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "free": 1}},
		Shedding: &limit.Shedding{Steps: []limit.ShedStep{{Above: 0.7, Shed: []string{"free"}}}, Hold: 30 * time.Second, Scope: scope},
		Breakers: []limit.BreakerConfig{{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute}},
		Descriptors: []*limit.Rule{
			{Key: "tenant", RateLimit: perMinute(100)},
			{Key: "model", RateLimit: &limit.Limit{Amount: 10, Unit: limit.Second, Algorithm: limit.TokenBucket, Burst: 4}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestDecideAdmissionOrder(t *testing.T) {
	t.Parallel()
	probe := limit.BreakerVerdict{Allowed: true, ProbeID: "1.1"}
	open := limit.BreakerVerdict{RetryAfter: 20 * time.Second}
	tenantKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a"))
	type charge struct {
		key           string
		amount, burst uint64
	}
	tests := []struct {
		name        string
		give        limit.Request
		shed        map[string]limit.ShedState
		verdicts    map[string]limit.BreakerVerdict
		deny        bool // the store denies the tenant limit
		wantCode    limit.Code
		wantReason  Reason
		wantRetry   time.Duration
		wantShadow  bool
		wantCharges []charge
		wantLimits  []uint64 // Status.Limit.Amount per descriptor
		wantProbes  []string
		wantRelease []string
	}{
		{
			name:        "nothing applies",
			give:        limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			wantCode:    limit.CodeOK,
			wantCharges: []charge{{tenantKey, 100, 0}},
			wantLimits:  []uint64{100},
		},
		{
			name:       "a shed tier is refused and charged nothing",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}, {Entries: entries("model", "m")}}},
			shed:       map[string]limit.ShedState{"free": {Shed: true}},
			wantCode:   limit.CodeOverLimit,
			wantReason: ReasonShed,
			wantRetry:  30 * time.Second,
			wantLimits: []uint64{0, 0},
		},
		{
			name:        "another tier is admitted (admit_only leaves premium in)",
			give:        limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			shed:        map[string]limit.ShedState{"free": {Shed: true}},
			wantCode:    limit.CodeOK,
			wantCharges: []charge{{tenantKey, 300, 0}},
			wantLimits:  []uint64{300},
		},
		{
			name:        "shadow: admitted, marked, limits as written",
			give:        limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			shed:        map[string]limit.ShedState{"free": {Shed: true, Shadow: true, Factor: 0.5, NoBurst: true}},
			wantCode:    limit.CodeOK,
			wantShadow:  true,
			wantCharges: []charge{{tenantKey, 100, 0}},
			wantLimits:  []uint64{100},
		},
		{
			name: "factor after the plan multiplier, floored; burst down to 1s of the rate, which is above the burst",
			give: limit.Request{Domain: "d", Tier: "premium", Descriptors: []limit.Descriptor{
				{Entries: entries("tenant", "a")}, {Entries: entries("model", "m")},
			}},
			shed:     map[string]limit.ShedState{"premium": {Factor: 0.7, NoBurst: true}},
			wantCode: limit.CodeOK,
			wantCharges: []charge{
				{tenantKey, 210, 0},
				{limit.Key(limit.Requests, limit.TokenBucket, time.Second, "d", entries("model", "m")), 21, 8},
			},
			wantLimits: []uint64{210, 21},
		},
		{
			name:       "an open breaker refuses before the limits",
			give:       limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}, {Entries: entries("model", "m")}}},
			verdicts:   map[string]limit.BreakerVerdict{"m": open},
			wantCode:   limit.CodeOverLimit,
			wantReason: ReasonBreaker,
			wantRetry:  20 * time.Second,
			wantLimits: []uint64{0, 0},
		},
		{
			name:        "the breaker of limit.Request.Model, without a model entry",
			give:        limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			verdicts:    map[string]limit.BreakerVerdict{"m": open},
			wantCode:    limit.CodeOverLimit,
			wantReason:  ReasonBreaker,
			wantRetry:   20 * time.Second,
			wantLimits:  []uint64{0},
			wantCharges: nil,
		},
		{
			name:        "shedding before the breaker",
			give:        limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			shed:        map[string]limit.ShedState{"free": {Shed: true}},
			verdicts:    map[string]limit.BreakerVerdict{"m": probe},
			wantCode:    limit.CodeOverLimit,
			wantReason:  ReasonShed,
			wantRetry:   30 * time.Second,
			wantLimits:  []uint64{0},
			wantRelease: nil,
		},
		{
			name:        "a half-open probe is admitted and reported",
			give:        limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			verdicts:    map[string]limit.BreakerVerdict{"m": probe},
			wantCode:    limit.CodeOK,
			wantCharges: []charge{{tenantKey, 100, 0}},
			wantLimits:  []uint64{100},
			wantProbes:  []string{"1.1"},
		},
		{
			name:        "a probe the limits refuse is released",
			give:        limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			verdicts:    map[string]limit.BreakerVerdict{"m": probe},
			deny:        true,
			wantCode:    limit.CodeOverLimit,
			wantReason:  ReasonLimit,
			wantCharges: []charge{{tenantKey, 100, 0}},
			wantLimits:  []uint64{100},
			wantRelease: []string{"1.1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			if tt.deny {
				st.deny = map[string]bool{tenantKey: true}
			}
			sh := &fakeShedder{state: tt.shed}
			br := &fakeBreakers{verdict: tt.verdicts}
			l := NewLimiter(st, nil, admissionRules(t, ""), WithShedder(sh), WithBreakers(br))
			dec, err := l.Decide(context.Background(), &tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Code != tt.wantCode || dec.Reason != tt.wantReason || dec.RetryAfter != tt.wantRetry || dec.ShadowShed != tt.wantShadow {
				t.Errorf("decision = code %v reason %v retry %v shadow %v; want %v %v %v %v",
					dec.Code, dec.Reason, dec.RetryAfter, dec.ShadowShed, tt.wantCode, tt.wantReason, tt.wantRetry, tt.wantShadow)
			}
			var got []charge
			for _, c := range st.charges {
				got = append(got, charge{c.Key, c.Amount, c.Burst})
			}
			if !slices.Equal(got, tt.wantCharges) {
				t.Errorf("charges = %+v, want %+v", got, tt.wantCharges)
			}
			var limits []uint64
			for _, s := range dec.Statuses {
				var a uint64
				if s.Limit != nil {
					a = s.Limit.Amount
				}
				limits = append(limits, a)
			}
			if !slices.Equal(limits, tt.wantLimits) {
				t.Errorf("status limits = %v, want %v", limits, tt.wantLimits)
			}
			var probes []string
			for _, p := range dec.Probes {
				probes = append(probes, p.ID)
				if p.Key != "model" || p.Name != "m" {
					t.Errorf("probe %+v, want model=m", p)
				}
			}
			if !slices.Equal(probes, tt.wantProbes) {
				t.Errorf("probes = %v, want %v", probes, tt.wantProbes)
			}
			if !slices.Equal(br.released, tt.wantRelease) {
				t.Errorf("released = %v, want %v", br.released, tt.wantRelease)
			}
		})
	}
}

func TestDecideShedScope(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, scope string
		give        limit.Request
		want        string
	}{
		{name: "global", scope: "", give: limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}}, want: limit.ScopeGlobal},
		{name: "model from the request", scope: limit.ScopeModel, give: limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}}, want: "m"},
		{name: "model from a descriptor", scope: limit.ScopeModel, give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("model", "x")}}}, want: "x"},
		{name: "no model: global", scope: limit.ScopeModel, give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}}, want: limit.ScopeGlobal},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sh := &fakeShedder{}
			l := NewLimiter(&recordStore{}, nil, admissionRules(t, tt.scope), WithShedder(sh))
			if _, err := l.Decide(context.Background(), &tt.give); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(sh.scopes, []string{tt.want}) {
				t.Errorf("scopes asked = %v, want %s", sh.scopes, tt.want)
			}
		})
	}
}

// TestDecideBreakerError: a breaker that cannot answer fails the decision
// like a store, and spends nothing.
func TestDecideBreakerError(t *testing.T) {
	t.Parallel()
	st := &recordStore{}
	boom := errors.New("boom")
	l := NewLimiter(st, nil, admissionRules(t, ""), WithBreakers(&fakeBreakers{err: boom}))
	_, err := l.Decide(context.Background(), &limit.Request{Domain: "d", Model: "m", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}})
	if !errors.Is(err, boom) || len(st.charges) != 0 {
		t.Errorf("Decide = %v with %d charges, want boom and none", err, len(st.charges))
	}
}

func TestRuleSetAdmissionChecks(t *testing.T) {
	t.Parallel()
	tiers := &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 1}}
	ok := limit.BreakerConfig{Key: "model", FailureThreshold: 1, Window: time.Second, OpenFor: time.Second}
	for _, tt := range []struct {
		name string
		give limit.Domain
		want string
	}{
		{name: "bad shedding", give: limit.Domain{Name: "d", Shedding: &limit.Shedding{Scope: "x"}}, want: `domain "d": shedding: scope: "x" is not one of global|model`},
		{name: "bad breaker", give: limit.Domain{Name: "d", Breakers: []limit.BreakerConfig{{Key: "model"}}}, want: `domain "d": breakers[0]: breaker "model": failure_threshold: failure_threshold must be at least 1`},
		{name: "two breakers on a key", give: limit.Domain{Name: "d", Breakers: []limit.BreakerConfig{ok, ok}}, want: `domain "d": breakers[1]: key "model" has a breaker already (breakers[0])`},
		{name: "breaker on the tiers key", give: limit.Domain{Name: "d", Tiers: tiers, Breakers: []limit.BreakerConfig{{Key: "tier", FailureThreshold: 1, Window: time.Second, OpenFor: time.Second}}}, want: `domain "d": breakers[0]: key "tier" is the tiers key, whose entries are removed before matching`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := limit.NewRuleSet(&tt.give)
			if err == nil || !startsWith(err.Error(), tt.want) {
				t.Errorf("limit.NewRuleSet = %v, want %q", err, tt.want)
			}
		})
	}
}

func startsWith(s, prefix string) bool { return len(s) >= len(prefix) && s[:len(prefix)] == prefix }

// TestDecideSettles: a request of refunds and cost reports only (Envoy's
// apply_on_stream_done call) is charged or refunded whatever shedding and
// the breakers say, and never asks a breaker (so never takes a probe
// slot); a request with any other descriptor is a request as before.
func TestDecideSettles(t *testing.T) {
	t.Parallel()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:     "d",
		Tiers:    &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "free": 1}},
		Shedding: &limit.Shedding{Steps: []limit.ShedStep{{Above: 0.7, Shed: []string{"free"}}}},
		Breakers: []limit.BreakerConfig{{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute}},
		Descriptors: []*limit.Rule{
			{Key: "tenant", RateLimit: perMinute(100)},
			{Key: "model", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		refund  = limit.Descriptor{Entries: entries("model", "m"), Hits: 300, HitsSet: true, Negative: true}
		report  = limit.Descriptor{Entries: entries("model", "m"), Hits: 500, HitsSet: true}
		back    = limit.Descriptor{Entries: entries("tenant", "a"), Negative: true} // a refund of a request
		check   = limit.Descriptor{Entries: entries("model", "m"), HitsSet: true}   // hits_addend 0: a check
		weighed = limit.Descriptor{Entries: entries("tenant", "a"), Hits: 5, HitsSet: true}
		plain   = limit.Descriptor{Entries: entries("tenant", "a")}
	)
	open := map[string]limit.BreakerVerdict{"m": {RetryAfter: 20 * time.Second}}
	probe := map[string]limit.BreakerVerdict{"m": {Allowed: true, ProbeID: "p"}}
	shed := map[string]limit.ShedState{"free": {Shed: true}}
	shadow := map[string]limit.ShedState{"free": {Shed: true, Shadow: true}}
	tests := []struct {
		name       string
		give       []limit.Descriptor
		verdicts   map[string]limit.BreakerVerdict
		shed       map[string]limit.ShedState
		wantReason Reason
		wantCosts  []int64
		wantAsked  bool // the breaker was asked
		wantShadow bool
	}{
		{name: "refund, breaker open", give: []limit.Descriptor{refund}, verdicts: open, wantCosts: []int64{-300}},
		{name: "cost report, breaker open", give: []limit.Descriptor{report}, verdicts: open, wantCosts: []int64{500}},
		{name: "refund of a request, breaker open", give: []limit.Descriptor{back}, verdicts: open, wantCosts: []int64{-1}},
		{name: "refund and report, breaker open", give: []limit.Descriptor{refund, report}, verdicts: open, wantCosts: []int64{-300, 500}},
		{name: "refund, half-open", give: []limit.Descriptor{refund}, verdicts: probe, wantCosts: []int64{-300}},
		{name: "cost report, half-open", give: []limit.Descriptor{report}, verdicts: probe, wantCosts: []int64{500}},
		{name: "refund, shed", give: []limit.Descriptor{refund}, shed: shed, wantCosts: []int64{-300}},
		{name: "cost report, shed", give: []limit.Descriptor{report}, shed: shed, wantCosts: []int64{500}},
		{name: "cost report, shadow shedding", give: []limit.Descriptor{report}, shed: shadow, wantCosts: []int64{500}},
		{name: "a request, breaker open", give: []limit.Descriptor{plain}, verdicts: open, wantReason: ReasonBreaker, wantAsked: true},
		{name: "a request and a refund, breaker open", give: []limit.Descriptor{plain, refund}, verdicts: open, wantReason: ReasonBreaker, wantAsked: true},
		{name: "a check, breaker open", give: []limit.Descriptor{check}, verdicts: open, wantReason: ReasonBreaker, wantAsked: true},
		{name: "a weighed request, breaker open", give: []limit.Descriptor{weighed}, verdicts: open, wantReason: ReasonBreaker, wantAsked: true},
		{name: "a weighed request, shed", give: []limit.Descriptor{weighed}, shed: shed, wantReason: ReasonShed},
		{name: "a request and a report, shed", give: []limit.Descriptor{plain, report}, shed: shed, wantReason: ReasonShed},
		{name: "a request, shadow shedding", give: []limit.Descriptor{plain}, shed: shadow, wantCosts: []int64{1}, wantAsked: true, wantShadow: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			br := &fakeBreakers{verdict: tt.verdicts}
			l := NewLimiter(st, nil, rs, WithShedder(&fakeShedder{state: tt.shed}), WithBreakers(br))
			dec, err := l.Decide(context.Background(), &limit.Request{Domain: "d", Model: "m", Descriptors: slices.Clone(tt.give)})
			if err != nil {
				t.Fatal(err)
			}
			wantCode := limit.CodeOK
			if tt.wantReason != ReasonNone {
				wantCode = limit.CodeOverLimit
			}
			if dec.Code != wantCode || dec.Reason != tt.wantReason || dec.ShadowShed != tt.wantShadow {
				t.Errorf("decision = %v %v shadow %v; want %v %v shadow %v", dec.Code, dec.Reason, dec.ShadowShed, wantCode, tt.wantReason, tt.wantShadow)
			}
			var costs []int64
			for _, c := range st.charges {
				costs = append(costs, c.Cost)
			}
			if !slices.Equal(costs, tt.wantCosts) {
				t.Errorf("charged %v, want %v", costs, tt.wantCosts)
			}
			if asked := br.allows > 0; asked != tt.wantAsked {
				t.Errorf("breaker asked %d times, want asked %v", br.allows, tt.wantAsked)
			}
			if len(dec.Probes) > 0 {
				t.Errorf("probes %+v taken", dec.Probes)
			}
			if tt.wantReason == ReasonShed {
				for i, s := range dec.Statuses {
					if s.Rule != nil || s.Limit != nil {
						t.Errorf("shed status %d reports rule %v, limit %v", i, s.Rule, s.Limit)
					}
				}
			}
		})
	}
}

// TestBurstFloor: with bursts turned down a token bucket keeps what it
// refills in the floor, rounded up, at least 1 and at most its burst.
func TestBurstFloor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		give  limit.Limit
		floor time.Duration
		want  uint64
	}{
		{name: "one second of 100/s", give: limit.Limit{Amount: 100, Unit: limit.Second, Burst: 500}, floor: time.Second, want: 100},
		{name: "rounded up", give: limit.Limit{Amount: 21, Unit: limit.Second, Burst: 500}, floor: 100 * time.Millisecond, want: 3},
		{name: "never above the burst", give: limit.Limit{Amount: 100, Unit: limit.Second, Burst: 20}, floor: time.Second, want: 20},
		{name: "burst unset is the amount", give: limit.Limit{Amount: 100, Unit: limit.Second}, floor: 10 * time.Second, want: 100},
		{name: "at least 1", give: limit.Limit{Amount: 60, Unit: limit.Minute, Burst: 60}, floor: time.Millisecond, want: 1},
		{name: "per minute", give: limit.Limit{Amount: 600, Unit: limit.Minute, Burst: 600}, floor: time.Second, want: 10},
		{name: "multiplier", give: limit.Limit{Amount: 600, Unit: limit.Minute, Multiplier: 2, Burst: 600}, floor: time.Second, want: 5},
		{name: "huge", give: limit.Limit{Amount: 1 << 53, Unit: limit.Second, Burst: 1 << 60}, floor: time.Hour, want: 1 << 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := tt.give
			l.Algorithm = limit.TokenBucket
			got := adjust{micro: limit.MicroOne, noBurst: true, floor: tt.floor}.apply(&l)
			if got.Burst != tt.want || got.Amount != tt.give.Amount {
				t.Errorf("burst %d amount %d, want %d %d", got.Burst, got.Amount, tt.want, tt.give.Amount)
			}
		})
	}
}
