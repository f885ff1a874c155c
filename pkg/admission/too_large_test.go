package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// tooLargeRules has one limit of each algorithm, a tenant with both a
// request limit and a token budget, and plans free x1 and premium x3.
func tooLargeRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:  "d",
		Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 1, "premium": 3}},
		Descriptors: []*limit.Rule{
			{Key: "sliding", RateLimit: &limit.Limit{Name: "sliding", Amount: 100, Unit: limit.Minute}},
			{Key: "fixed", RateLimit: &limit.Limit{Name: "fixed", Amount: 100, Unit: limit.Minute, Algorithm: limit.FixedWindow}},
			{Key: "bucket", RateLimit: &limit.Limit{Name: "bucket", Amount: 100, Unit: limit.Minute, Algorithm: limit.TokenBucket, Burst: 10}},
			{Key: "tenant", RateLimit: &limit.Limit{Name: "requests", Amount: 5, Unit: limit.Minute},
				TokenLimit: &limit.Limit{Name: "tokens", Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour}},
			{Key: "shadow", Shadow: true, RateLimit: &limit.Limit{Name: "shadow", Amount: 10, Unit: limit.Minute}},
			{Key: "other", RateLimit: &limit.Limit{Name: "other", Amount: 1000, Unit: limit.Minute}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestDecideTooLarge: a request whose cost is more than a limit's whole
// capacity (after overrides and the plan) is marked TooLarge, with its
// cost and the capacity, on every algorithm and store; one that fits the
// capacity but not the room left now is an ordinary denial; a shadow
// rule never marks it.
func TestDecideTooLarge(t *testing.T) {
	t.Parallel()
	one := func(kv ...string) []limit.Descriptor {
		var es []limit.Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, limit.Entry{Key: kv[i], Value: kv[i+1]})
		}
		return []limit.Descriptor{{Entries: es}}
	}
	type want struct {
		code     limit.Code
		tooLarge bool
		desc     int // the status to look at
		cost     uint64
		capacity uint64
		name     string
	}
	tests := []struct {
		name string
		pre  *limit.Request // sent first, to use some of the room
		give limit.Request
		want want
	}{
		{name: "sliding window: cost over the amount",
			give: limit.Request{Domain: "d", Descriptors: one("sliding", "a"), Hits: 101},
			want: want{code: limit.CodeOverLimit, tooLarge: true, cost: 101, capacity: 100, name: "sliding"}},
		{name: "sliding window: cost equal to the amount fits",
			give: limit.Request{Domain: "d", Descriptors: one("sliding", "a"), Hits: 100},
			want: want{code: limit.CodeOK}},
		{name: "sliding window: fits the amount but not the room left",
			pre:  &limit.Request{Domain: "d", Descriptors: one("sliding", "a"), Hits: 60},
			give: limit.Request{Domain: "d", Descriptors: one("sliding", "a"), Hits: 60},
			want: want{code: limit.CodeOverLimit}},
		{name: "fixed window",
			give: limit.Request{Domain: "d", Descriptors: one("fixed", "a"), Hits: 101},
			want: want{code: limit.CodeOverLimit, tooLarge: true, cost: 101, capacity: 100, name: "fixed"}},
		{name: "token bucket: the burst is the capacity",
			give: limit.Request{Domain: "d", Descriptors: one("bucket", "a"), Hits: 11},
			want: want{code: limit.CodeOverLimit, tooLarge: true, cost: 11, capacity: 10, name: "bucket"}},
		{name: "token bucket: within the burst, not the room left",
			pre:  &limit.Request{Domain: "d", Descriptors: one("bucket", "a"), Hits: 6},
			give: limit.Request{Domain: "d", Descriptors: one("bucket", "a"), Hits: 6},
			want: want{code: limit.CodeOverLimit}},
		{name: "the plan multiplier counts",
			give: limit.Request{Domain: "d", Descriptors: one("tier", "premium", "sliding", "a"), Hits: 300},
			want: want{code: limit.CodeOK}},
		{name: "over the plan's capacity",
			give: limit.Request{Domain: "d", Descriptors: one("tier", "premium", "sliding", "a"), Hits: 301},
			want: want{code: limit.CodeOverLimit, tooLarge: true, cost: 301, capacity: 300, name: "sliding"}},
		{name: "an override counts",
			give: limit.Request{Domain: "d", Descriptors: one("sliding", "a"), Hits: 150,
				Overrides: map[string]limit.Override{"sliding": {Amount: 200}}},
			want: want{code: limit.CodeOK}},
		{name: "the token budget of a rule that also counts requests",
			give: limit.Request{Domain: "d", Descriptors: one("tenant", "a"), Tokens: 1001, TokensSet: true},
			want: want{code: limit.CodeOverLimit, tooLarge: true, cost: 1001, capacity: 1000, name: "tokens"}},
		{name: "a shadow rule never marks it",
			give: limit.Request{Domain: "d", Descriptors: one("shadow", "a"), Hits: 11},
			want: want{code: limit.CodeOK}},
		{name: "all or nothing: the descriptor that can never fit is marked",
			give: limit.Request{Domain: "d", Descriptors: append(one("other", "a"), one("sliding", "a")...), Hits: 101},
			want: want{code: limit.CodeOverLimit, tooLarge: true, desc: 1, cost: 101, capacity: 100, name: "sliding"}},
	}
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			store := sk.Make(t)
			for i, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					// Each case its own domain values: one store serves all.
					rename := func(r limit.Request) *limit.Request {
						ds := make([]limit.Descriptor, len(r.Descriptors))
						for j, d := range r.Descriptors {
							es := append([]limit.Entry(nil), d.Entries...)
							for k := range es {
								if es[k].Key != "tier" {
									es[k].Value += "-" + string(rune('a'+i))
								}
							}
							ds[j] = limit.Descriptor{Entries: es}
						}
						r.Descriptors = ds
						return &r
					}
					l := admission.NewLimiter(store, storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000)), tooLargeRules(t))
					if tt.pre != nil {
						if dec, err := l.Decide(context.Background(), rename(*tt.pre)); err != nil || dec.Code != limit.CodeOK {
							t.Fatalf("first Decide = %+v, %v; want admitted", dec, err)
						}
					}
					dec, err := l.Decide(context.Background(), rename(tt.give))
					if err != nil {
						t.Fatal(err)
					}
					if dec.Code != tt.want.code {
						t.Errorf("Code = %v, want %v", dec.Code, tt.want.code)
					}
					st := dec.TooLarge()
					if (st != nil) != tt.want.tooLarge {
						t.Fatalf("TooLarge() = %+v, want one: %v", st, tt.want.tooLarge)
					}
					if (dec.Reason == admission.ReasonTooLarge) != tt.want.tooLarge {
						t.Errorf("Reason = %v, want too_large: %v", dec.Reason, tt.want.tooLarge)
					}
					if st == nil {
						return
					}
					if st != &dec.Statuses[tt.want.desc] || st.Code != limit.CodeOverLimit || st.Cost != tt.want.cost ||
						st.Capacity != tt.want.capacity || st.Limit == nil || st.Limit.Name != tt.want.name {
						t.Errorf("status %d = %+v, want too large: cost %d, capacity %d, limit %q",
							tt.want.desc, st, tt.want.cost, tt.want.capacity, tt.want.name)
					}
				})
			}
		})
	}
}

// halfLimits is a Shedder whose active step halves every limit.
type halfLimits struct{}

func (halfLimits) Shed(_, _, _ string) limit.ShedState { return limit.ShedState{Factor: 0.5} }

// TestDecideTooLargeUnderPressure: a limit factor passes, so a request
// that fits the limit but not the limit under pressure is an ordinary
// denial; one past the limit itself never fits.
func TestDecideTooLargeUnderPressure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give uint64 // hits on a limit of 100, halved
		want bool
	}{
		{name: "within the limit, past the halved limit", give: 60},
		{name: "past the limit", give: 101, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := limit.NewRuleSet(&limit.Domain{
				Name:        "d",
				Shedding:    &limit.Shedding{Steps: []limit.ShedStep{{Above: 0.8, LimitFactor: 0.5}}},
				Descriptors: []*limit.Rule{{Key: "k", RateLimit: &limit.Limit{Amount: 100, Unit: limit.Minute}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			l := admission.NewLimiter(memstore.New(), storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000)), rs, admission.WithShedder(halfLimits{}))
			dec, err := l.Decide(context.Background(), &limit.Request{Domain: "d", Hits: tt.give,
				Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "k", Value: "v"}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if dec.Code != limit.CodeOverLimit || dec.Statuses[0].Limit == nil || dec.Statuses[0].Limit.Amount != 50 {
				t.Fatalf("decision = %+v, want denied by the halved limit", dec)
			}
			if got := dec.TooLarge(); (got != nil) != tt.want {
				t.Errorf("TooLarge() = %+v, want one: %v", got, tt.want)
			}
		})
	}
}
