package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// bucketTierRules is the shipped gpt-4o bucket (config/inference.yaml:
// 10,000 a minute, burst 500) under the shipped plans. Every tier may owe
// the bucket 3 s (B x T: 500 x 6 ms free, 1,500 x 2 ms premium), but a
// premium unit costs a third of a free one.
func bucketTierRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:  "g",
		Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "standard": 2, "free": 1}},
		Descriptors: []*limit.Rule{{Key: "model", RateLimit: &limit.Limit{
			Kind: limit.Requests, Amount: 10_000, Unit: limit.Minute, Algorithm: limit.TokenBucket, Burst: 500}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// sharedStores are the stores a write-back reaches: the in-process one
// and a real redis-server.
func sharedStores(t *testing.T) []struct {
	name  string
	store limit.Store
} {
	t.Helper()
	srv := redistest.Start(t)
	c, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatalf("NewClient(%q): %v", srv.URL(), err)
	}
	rs := redisstore.New(c)
	t.Cleanup(func() { _ = rs.Close() })
	if err := rs.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	return []struct {
		name  string
		store limit.Store
	}{{"memstore", memstore.New()}, {"redis", rs}}
}

// TestDegradedTokenBucketWriteBack: what replicas admitted locally on a
// token bucket is written back at what it cost when it was admitted (its
// own tier's price per unit), less what the bucket refilled since, and
// converted into units at the price of the tier whose request carries it.
// Three replicas share the store; each keeps 0.1/3 of the bucket while it
// cannot reach it (premium: 1,000 a minute, burst 50; free: 333, burst
// 16). When the store answers again, one request of the carrier's tier on
// each replica writes its debt back, then the first replica asks at the
// same instant until refused: want is every admission the store made then.
// Before the rule, the units went back as units: premium ones carried by
// free requests cost three times their price, free ones carried by premium
// a third, and a whole outage's units came back at once.
func TestDegradedTokenBucketWriteBack(t *testing.T) {
	t.Parallel()
	const replicas = 3
	tests := []struct {
		name    string
		local   string        // the tier admitted while the store is down
		outage  time.Duration // how long the store is down; 0: one instant
		gap     time.Duration // between the last local decision and the store's return
		carrier string
		want    int
	}{
		{
			// 50 premium each, 100 ms of debt each: 17 free units each
			// (16.7, rounded up), 51 of the 500.
			name: "premium admissions carried by free", local: "premium", carrier: "free", want: 500 - 51,
		},
		{
			// The same 100 ms each is 50 premium units each.
			name: "premium admissions carried by premium", local: "premium", carrier: "premium", want: 1500 - 150,
		},
		{
			// 16 free each, 96 ms of debt each: 48 premium units each, not
			// 16.
			name: "free admissions carried by premium", local: "free", carrier: "premium", want: 1500 - 144,
		},
		{
			// 60 ms of the 100 refilled: 40 ms each, 7 free units each
			// (6.7, rounded up).
			name: "the refill since is credited", local: "premium", gap: 60 * time.Millisecond, carrier: "free",
			want: 500 - 21,
		},
		{
			// The worked example: a premium request every 10 ms on
			// each replica for 20 s, about 1,150 admitted locally. Each
			// admission's 2 ms is refilled before the next one: nothing is
			// owed. Units written back as free ones were 6.9 s of debt
			// against 3 s, refusing every tier for about 4 s.
			name: "20 s of premium admissions carried by free", local: "premium", outage: 20 * time.Second,
			gap: 10 * time.Millisecond, carrier: "free", want: 500,
		},
	}
	for _, st := range sharedStores(t) {
		for i, tt := range tests {
			t.Run(st.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				clk := storetest.NewFakeClock(t0)
				model := fmt.Sprintf("gpt-4o-%d", i) // a key of its own on the shared redis
				stores := make([]*flakyStore, replicas)
				lims := make([]*admission.Limiter, replicas)
				for k := range lims {
					stores[k] = &flakyStore{shared: st.store, down: true}
					lims[k] = admission.NewLimiter(stores[k], clk, bucketTierRules(t), admission.WithStoreFailure(admission.FailurePolicy{
						Timeout: time.Second, Local: memstore.New(), Replicas: func() int { return replicas },
					}))
				}
				decide := func(t *testing.T, l *admission.Limiter, tier string) *admission.Decision {
					t.Helper()
					r := req("g", []string{"model", model})
					r.Tier = tier
					dec, err := l.Decide(context.Background(), r)
					if err != nil {
						t.Fatal(err)
					}
					return dec
				}
				local := 0
				for end := clk.Now().Add(tt.outage); ; clk.Advance(10 * time.Millisecond) {
					for _, l := range lims {
						// An instant's outage asks until refused: the
						// local burst, at most 100 calls.
						for n := 0; n < 100; n++ {
							dec := decide(t, l, tt.local)
							if !dec.Degraded {
								t.Fatal("a decision from the store while it is down")
							}
							if dec.Code != limit.CodeOK {
								break
							}
							local++
							if tt.outage > 0 {
								break
							}
						}
					}
					if !clk.Now().Before(end) {
						break
					}
				}
				if local == 0 {
					t.Fatal("nothing admitted locally: the test shows nothing")
				}
				clk.Advance(tt.gap)
				for _, s := range stores {
					s.down = false
				}
				got := 0
				for k := 0; k < replicas+2000; k++ {
					dec := decide(t, lims[min(k, replicas-1)], tt.carrier)
					if dec.Degraded {
						t.Fatal("a degraded decision with the store up")
					}
					if dec.Code != limit.CodeOK {
						if k < replicas {
							continue // a carrier refused: its write-back still counted
						}
						break
					}
					got++
				}
				if got != tt.want {
					t.Errorf("the store admitted %d %s requests at once after %d local %s admissions, want %d",
						got, tt.carrier, local, tt.local, tt.want)
				}
			})
		}
	}
}
