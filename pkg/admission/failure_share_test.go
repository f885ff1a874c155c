package admission_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// shareRules are one rule of each kind, in their own descriptors.
func shareRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	d := &limit.Domain{Name: "s", Descriptors: []*limit.Rule{
		{Key: "req", RateLimit: perMinute(100)},
		{Key: "small", RateLimit: perMinute(20)},
		{Key: "tok", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 10_000, Unit: limit.Hour}},
		{Key: "bucket", RateLimit: &limit.Limit{Kind: limit.Requests, Amount: 6000, Unit: limit.Minute, Algorithm: limit.TokenBucket, Burst: 20}},
		{Key: "slots", MaxConcurrent: 20, Lease: time.Minute},
	}}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestDegradedAutomaticShare: with no fixed fraction, a replica keeps
// DefaultOvershoot/N of each window limit and 1/N of a concurrency cap,
// rounded down, N the replicas the Replicas func reports.
func TestDegradedAutomaticShare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		replicas int
		give     func(i int) *limit.Request
		want     int // admitted of 30 calls
	}{
		{name: "requests, one replica: a tenth", replicas: 1, want: 10,
			give: func(int) *limit.Request { return req("s", []string{"req", "a"}) }},
		{name: "requests, three replicas: a thirtieth each", replicas: 3, want: 3,
			give: func(int) *limit.Request { return req("s", []string{"req", "a"}) }},
		{name: "no Replicas func counts one", replicas: 0, want: 10,
			give: func(int) *limit.Request { return req("s", []string{"req", "a"}) }},
		{name: "a limit too small to split admits nothing", replicas: 3, want: 0,
			give: func(int) *limit.Request { return req("s", []string{"small", "a"}) }},
		{name: "tokens: a share smaller than one estimate admits nothing", replicas: 3, want: 0,
			give: func(int) *limit.Request {
				r := req("s", []string{"tok", "a"})
				r.Tokens, r.TokensSet = 400, true // 333 tokens is this replica's share
				return r
			}},
		{name: "tokens: small estimates fit the share", replicas: 3, want: 3,
			give: func(int) *limit.Request {
				r := req("s", []string{"tok", "a"})
				r.Tokens, r.TokensSet = 100, true
				return r
			}},
		{name: "a token bucket whose burst share is under one admits nothing", replicas: 3, want: 0,
			give: func(int) *limit.Request { return req("s", []string{"bucket", "a"}) }},
		{name: "a concurrency cap is split, not cut to the overshoot", replicas: 3, want: 6,
			give: func(i int) *limit.Request {
				r := req("s", []string{"slots", "a"})
				r.ID = fmt.Sprintf("r%d", i)
				return r
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := admission.FailurePolicy{Timeout: time.Second, Local: memstore.New()}
			if tt.replicas > 0 {
				n := tt.replicas
				p.Replicas = func() int { return n }
			}
			l := admission.NewLimiter(&downStore{}, fixedClock{t0}, shareRules(t), admission.WithStoreFailure(p))
			admitted := 0
			for i := range 30 {
				dec, err := l.Decide(context.Background(), tt.give(i))
				if err != nil {
					t.Fatal(err)
				}
				if !dec.Degraded || dec.Policy != limit.FailureLocal {
					t.Fatalf("decision: degraded %v, policy %v; want degraded by local, the default", dec.Degraded, dec.Policy)
				}
				switch {
				case dec.Code == limit.CodeOK:
					admitted++
				case dec.Statuses[0].RetryAfter <= 0:
					t.Errorf("call %d denied with RetryAfter %v", i, dec.Statuses[0].RetryAfter)
				}
			}
			if admitted != tt.want {
				t.Errorf("admitted %d of 30, want %d", admitted, tt.want)
			}
		})
	}
}

// TestDegradedShareFollowsReplicas: the share is read at each degraded
// decision, and what was admitted locally still counts when it shrinks.
func TestDegradedShareFollowsReplicas(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	n.Store(1)
	l := admission.NewLimiter(&downStore{}, fixedClock{t0}, shareRules(t), admission.WithStoreFailure(admission.FailurePolicy{
		Timeout: time.Second, Local: memstore.New(), Replicas: func() int { return int(n.Load()) },
	}))
	count := func(calls int) int {
		ok := 0
		for range calls {
			if dec, _ := l.Decide(context.Background(), req("s", []string{"req", "a"})); dec.Code == limit.CodeOK {
				ok++
			}
		}
		return ok
	}
	if got := count(5); got != 5 {
		t.Fatalf("alone: %d of 5 admitted, want 5 (a share of 10)", got)
	}
	n.Store(2) // a share of 5, already spent
	if got := count(5); got != 0 {
		t.Errorf("with a second replica: %d admitted, want 0", got)
	}
	n.Store(1)
	if got := count(10); got != 5 {
		t.Errorf("alone again: %d admitted, want the 5 left of 10", got)
	}
}

// flakyStore is one replica's view of a shared store: while down is set,
// its calls fail; when charged is set, a failed call is still applied
// first and fails with a timeout, as a call whose reply came too late.
type flakyStore struct {
	shared  limit.Store
	down    bool
	charged bool
}

var errFlaky = errors.New("connection refused")

func (s *flakyStore) Apply(ctx context.Context, now time.Time, cs []limit.Charge, res []limit.Result) (bool, error) {
	if !s.down {
		return s.shared.Apply(ctx, now, cs, res)
	}
	if s.charged {
		_, _ = s.shared.Apply(ctx, now, cs, res)
		return false, context.DeadlineExceeded
	}
	return false, errFlaky
}

// TestDegradedBoundAcrossReplicas is the automatic share's promise, on
// random schedules: N replicas on one store, each losing it and getting
// it back at random (some calls charged though they failed), never admit
// more than the limit plus DefaultOvershoot of it in any window, on a
// sliding window, a fixed window, a sliding window of tokens, and a token
// bucket under mixed plans. A token bucket's limit is in time: in any
// interval of length d, the admissions' costs (T = Window/Amount of the
// plan each was admitted under, which the multiplier scales) add up to at
// most B x T + d, the same for every plan.
func TestDegradedBoundAcrossReplicas(t *testing.T) {
	t.Parallel()
	const (
		limitAmount = 200
		window      = time.Minute
		replicas    = 3
		calls       = 6000
		seeds       = 20
	)
	tests := []struct {
		name string
		lim  *limit.Limit
		cost uint64 // tokens per call; 0: a request limit
		// tiers draws each call's plan: premium x3, standard x2, free x1.
		tiers bool
	}{
		{name: "sliding window", lim: &limit.Limit{Kind: limit.Requests, Amount: limitAmount, Unit: limit.Minute}},
		{name: "fixed window", lim: &limit.Limit{Kind: limit.Requests, Amount: limitAmount, Unit: limit.Minute, Algorithm: limit.FixedWindow}},
		{name: "tokens", lim: &limit.Limit{Kind: limit.Tokens, Amount: 100 * limitAmount, Unit: limit.Minute}, cost: 70},
		// 6.7/s free, burst 60 (9 s): each replica keeps 13 a minute,
		// burst 2, and the calls come at about 50/s.
		{name: "token bucket, mixed plans", tiers: true, lim: &limit.Limit{Kind: limit.Requests, Amount: 2 * limitAmount,
			Unit: limit.Minute, Algorithm: limit.TokenBucket, Burst: 60}},
	}
	for _, tt := range tests {
		for seed := range uint64(seeds) {
			t.Run(fmt.Sprintf("%s/seed=%d", tt.name, seed), func(t *testing.T) {
				t.Parallel()
				rule := &limit.Rule{Key: "tenant"}
				if tt.cost > 0 {
					rule.TokenLimit = tt.lim
				} else {
					rule.RateLimit = tt.lim
				}
				dom := &limit.Domain{Name: "b", Descriptors: []*limit.Rule{rule}}
				plans := map[string]float64{"premium": 3, "standard": 2, "free": 1}
				names := []string{"premium", "standard", "free"}
				if tt.tiers {
					dom.Tiers = &limit.Tiers{Key: "tier", Default: "free", Plans: plans}
				}
				rs, err := limit.NewRuleSet(dom)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(seed, 7))
				clk := storetest.NewFakeClock(t0)
				shared := memstore.New()
				stores := make([]*flakyStore, replicas)
				lims := make([]*admission.Limiter, replicas)
				for i := range lims {
					stores[i] = &flakyStore{shared: shared}
					lims[i] = admission.NewLimiter(stores[i], clk, rs, admission.WithStoreFailure(admission.FailurePolicy{
						Timeout: time.Second, Local: memstore.New(), Replicas: func() int { return replicas },
					}))
				}
				var admitted []time.Time // with their cost, for tokens
				var costs []float64
				degraded := 0
				// T is a token bucket's price of one request under a plan, ms.
				T := func(m float64) float64 { return float64(window.Milliseconds()) / (float64(tt.lim.Amount) * m) }
				for range calls {
					i := rng.IntN(replicas)
					if rng.IntN(20) == 0 { // a replica loses or regains the store
						stores[i].down = !stores[i].down
						stores[i].charged = rng.IntN(2) == 0
					}
					r := req("b", []string{"tenant", "acme"})
					c := uint64(1)
					if tt.cost > 0 {
						c = tt.cost/2 + rng.Uint64N(tt.cost)
						r.Tokens, r.TokensSet = c, true
					}
					w := float64(c)
					if tt.tiers {
						r.Tier = names[rng.IntN(len(names))]
						w = T(plans[r.Tier])
					}
					dec, err := lims[i].Decide(context.Background(), r)
					if err != nil {
						t.Fatal(err)
					}
					if dec.Degraded {
						degraded++
					}
					if dec.Code == limit.CodeOK {
						admitted = append(admitted, clk.Now())
						costs = append(costs, w)
					}
					clk.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
				}
				// The goal (issue 12): the limit plus a tenth, whatever
				// fails where. DefaultOvershoot is what keeps it.
				bound := func(time.Duration) float64 { return float64(tt.lim.Amount + tt.lim.Amount/10) }
				if tt.lim.Algorithm == limit.TokenBucket {
					// B x T + d, and a tenth of it, in ms; and one free
					// request's price for where the interval's ends fall.
					bound = func(d time.Duration) float64 {
						return 1.1*(float64(tt.lim.Burst)*T(1)+float64(d.Milliseconds())) + T(1)
					}
				}
				// A sliding window and a token bucket promise every
				// interval of a window; a fixed window, each window aligned
				// to the epoch.
				worst, over := 0.0, 0.0 // the largest sum over its bound, and the most by which one passed it
				for a := range admitted {
					var sum float64
					for b := a; b < len(admitted) && admitted[b].Sub(admitted[a]) < window; b++ {
						if tt.lim.Algorithm == limit.FixedWindow && admitted[b].UnixMilli()/window.Milliseconds() != admitted[a].UnixMilli()/window.Milliseconds() {
							break
						}
						sum += costs[b]
						worst = max(worst, sum/bound(admitted[b].Sub(admitted[a])))
						over = max(over, sum-bound(admitted[b].Sub(admitted[a])))
					}
				}
				if over > 0 {
					t.Errorf("one interval admitted %.0f over its bound, the worst %.3f of it (%d calls, %d degraded)", over, worst, calls, degraded)
				}
				if degraded == 0 || len(admitted) == 0 {
					t.Errorf("%d degraded, %d admitted: the schedule shows nothing", degraded, len(admitted))
				}
			})
		}
	}
}

// TestDegradedLocalAdmissionsWrittenBack: what replicas admitted locally
// goes to the store with their next decision on the key, once, so a
// window where the store came back admits the limit, not the limit plus
// the local admissions; a write-back that fails is sent again; units whose
// window has passed are dropped.
func TestDegradedLocalAdmissionsWrittenBack(t *testing.T) {
	t.Parallel()
	const replicas = 3
	newCluster := func(t *testing.T) (*storetest.FakeClock, limit.Store, []*flakyStore, []*admission.Limiter) {
		t.Helper()
		clk := storetest.NewFakeClock(t0)
		shared := memstore.New()
		stores := make([]*flakyStore, replicas)
		lims := make([]*admission.Limiter, replicas)
		for i := range lims {
			stores[i] = &flakyStore{shared: shared}
			lims[i] = admission.NewLimiter(stores[i], clk, shareRules(t), admission.WithStoreFailure(admission.FailurePolicy{
				Timeout: time.Second, Local: memstore.New(), Replicas: func() int { return replicas },
			}))
		}
		return clk, shared, stores, lims
	}
	decide := func(t *testing.T, l *admission.Limiter) *admission.Decision {
		t.Helper()
		dec, err := l.Decide(context.Background(), req("s", []string{"req", "a"}))
		if err != nil {
			t.Fatal(err)
		}
		return dec
	}
	// remaining is what the shared store has left on the key.
	remaining := func(t *testing.T, clk *storetest.FakeClock, shared limit.Store) uint64 {
		t.Helper()
		res := make([]limit.Result, 1)
		ch := limit.Charge{Key: limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "s", []limit.Entry{{Key: "req", Value: "a"}}),
			Algorithm: limit.SlidingWindow, Amount: 100, Window: time.Minute}
		if _, err := shared.Apply(context.Background(), clk.Now(), []limit.Charge{ch}, res); err != nil {
			t.Fatal(err)
		}
		return res[0].Remaining
	}

	t.Run("a window admits the limit", func(t *testing.T) {
		t.Parallel()
		clk, _, stores, lims := newCluster(t)
		local, fromStore := 0, 0
		for i, l := range lims {
			stores[i].down = true
			for range 5 {
				if dec := decide(t, l); dec.Code == limit.CodeOK {
					local++
				}
				clk.Advance(time.Millisecond)
			}
			stores[i].down = false
		}
		for more := true; more; {
			more = false
			for _, l := range lims {
				dec := decide(t, l)
				if dec.Degraded {
					t.Fatal("a degraded decision with the store up")
				}
				if dec.Code == limit.CodeOK {
					fromStore++
					more = true
				}
				clk.Advance(time.Millisecond)
			}
		}
		if local != 9 || local+fromStore != 100 {
			t.Errorf("admitted %d locally and %d by the store, want 9 and 91: the limit, the local ones counted once", local, fromStore)
		}
	})

	t.Run("a failed write-back is sent again", func(t *testing.T) {
		t.Parallel()
		clk, shared, stores, lims := newCluster(t)
		stores[0].down = true
		for range 3 {
			decide(t, lims[0])
		}
		decide(t, lims[0]) // fails, and with it the write-back
		stores[0].down = false
		if dec := decide(t, lims[0]); dec.Degraded || dec.Code != limit.CodeOK {
			t.Fatalf("with the store back: degraded %v, %v", dec.Degraded, dec.Code)
		}
		if got := remaining(t, clk, shared); got != 100-3-1 {
			t.Errorf("the store has %d left, want %d: the 3 local admissions and the decision", got, 100-3-1)
		}
		decide(t, lims[0])
		if got := remaining(t, clk, shared); got != 100-3-2 {
			t.Errorf("after another decision the store has %d left, want %d: the units sent once", got, 100-3-2)
		}
	})

	t.Run("a write-back that timed out is taken as counted", func(t *testing.T) {
		t.Parallel()
		clk, shared, stores, lims := newCluster(t)
		stores[0].down = true
		for range 3 {
			decide(t, lims[0])
		}
		stores[0].charged = true // the store runs calls, their replies come too late
		for range 5 {
			decide(t, lims[0])
		}
		stores[0].down, stores[0].charged = false, false
		decide(t, lims[0])
		// 3 local admissions sent once, 5 timed-out calls (none admitted
		// by the store: it counted them, then the local share refused
		// them), and the last decision.
		if got := remaining(t, clk, shared); got != 100-3-5-1 {
			t.Errorf("the store has %d left, want %d: the units sent once, not with every call that timed out", got, 100-3-5-1)
		}
	})

	t.Run("units whose window passed are dropped", func(t *testing.T) {
		t.Parallel()
		clk, shared, stores, lims := newCluster(t)
		stores[0].down = true
		for range 3 {
			decide(t, lims[0])
		}
		stores[0].down = false
		clk.Advance(time.Minute)
		decide(t, lims[0])
		if got := remaining(t, clk, shared); got != 99 {
			t.Errorf("the store has %d left, want 99: units a minute old count in no window", got)
		}
	})
}
