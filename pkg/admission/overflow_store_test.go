package admission_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func overflowRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "o", Descriptors: []*limit.Rule{
		{Key: "budget", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 500, Unit: limit.Day}},
		{Key: "tenant", RateLimit: &limit.Limit{Kind: limit.Requests, Amount: 100, Unit: limit.Minute}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestOverflowReported runs the two reported overflows through a Limiter
// on the in-process store and on a real redis-server: cost reports of
// 2^64-1 must leave a token budget spent (2^11 of them wrapped its uint64
// usage back to 0), and an override of 3 per day with unit_multiplier
// 616385997 must still deny a second later (its window wrapped to 524ms).
func TestOverflowReported(t *testing.T) {
	t.Parallel()
	for _, s := range sharedStores(t) {
		t.Run(s.name+"/cost reports", func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewFakeClock(time.UnixMilli(1_800_000_000_000))
			l := admission.NewLimiter(s.store, clk, overflowRules(t))
			tenant := []limit.Entry{{Key: "budget", Value: t.Name()}}
			report := limit.Request{Domain: "o", Descriptors: []limit.Descriptor{{Entries: tenant, Hits: math.MaxUint64, HitsSet: true}}}
			for i := range 1 << 11 {
				if _, err := l.Decide(context.Background(), &report); err != nil {
					t.Fatalf("report %d: %v", i, err)
				}
			}
			ask := limit.Request{Domain: "o", Descriptors: []limit.Descriptor{{Entries: tenant}}}
			dec, err := l.Decide(context.Background(), &ask)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Code != limit.CodeOverLimit || dec.Statuses[0].Remaining != 0 {
				t.Fatalf("after 2^11 reports of 2^64-1: code %v, remaining %d; want over limit, 0", dec.Code, dec.Statuses[0].Remaining)
			}
		})
		t.Run(s.name+"/override multiplier", func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewFakeClock(time.UnixMilli(1_800_000_000_000))
			l := admission.NewLimiter(s.store, clk, overflowRules(t))
			req := limit.Request{Domain: "o", Descriptors: []limit.Descriptor{{
				Entries:  []limit.Entry{{Key: "tenant", Value: t.Name()}},
				Override: &limit.Override{Amount: 3, Unit: limit.Day, Multiplier: 616385997},
			}}}
			tests := []struct {
				name  string
				after time.Duration
				want  limit.Code
			}{
				{name: "1st", want: limit.CodeOK},
				{name: "2nd", want: limit.CodeOK},
				{name: "3rd", want: limit.CodeOK},
				{name: "4th", want: limit.CodeOverLimit},
				{name: "a second later", after: time.Second, want: limit.CodeOverLimit},
				{name: "a year later", after: 365 * 24 * time.Hour, want: limit.CodeOverLimit},
			}
			for _, tt := range tests {
				clk.Advance(tt.after)
				dec, err := l.Decide(context.Background(), &req)
				if err != nil {
					t.Fatalf("%s: %v", tt.name, err)
				}
				if dec.Code != tt.want {
					t.Errorf("%s: code %v, want %v", tt.name, dec.Code, tt.want)
				}
			}
		})
	}
}
