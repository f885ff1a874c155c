package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// model is the reference Store: one goroutine, no expiry (expired state is
// equivalent to fresh state), and store.go's orchestration written
// plainly over limit.Counter, which holds the arithmetic.
type model struct {
	counters map[string]*limit.Counter
}

func clone(c *limit.Counter) *limit.Counter {
	if c == nil {
		return &limit.Counter{}
	}
	d := *c
	d.Buckets = append([]limit.Bucket(nil), c.Buckets...)
	return &d
}

func (md *model) apply(now time.Time, charges []limit.Charge) (bool, []limit.Result) {
	at := now.UnixMilli()
	work := map[string]*limit.Counter{}
	get := func(key string) *limit.Counter {
		c, ok := work[key]
		if !ok {
			c = clone(md.counters[key])
			work[key] = c
		}
		return c
	}
	res := make([]limit.Result, len(charges))
	admitted := true
	for i := range charges {
		ch := &charges[i]
		fits, retry := get(ch.Key).Step(ch, at)
		res[i] = limit.Result{Fits: fits, RetryAfter: time.Duration(retry) * time.Millisecond}
		if ch.Cost >= 0 && !ch.Shadow && !ch.Force && !fits {
			admitted = false
		}
	}
	if !admitted {
		// Start over from the stored state: keep the refunds and the Force
		// charges, and the
		// time the other charges saw (the windows' high-water marks).
		clear(work)
		for i := range charges {
			if ch := &charges[i]; ch.Cost < 0 || (ch.Cost > 0 && ch.Force) {
				get(ch.Key).Step(ch, at)
			} else {
				get(ch.Key).Touch(ch, at)
			}
		}
	}
	for k, c := range work {
		md.counters[k] = c
	}
	for i := range charges {
		ch := &charges[i]
		rem, reset := get(ch.Key).Report(ch, at)
		res[i].Remaining = rem
		res[i].ResetAfter = time.Duration(reset) * time.Millisecond
	}
	return admitted, res
}

// testModel runs random decisions of one to four charges (a key may
// repeat; refunds, checks, shadow and oversized charges included) over
// counters of every algorithm, and requires the store's every answer to
// equal the model's to the millisecond.
func testModel(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			r := newRand(seed)
			e := newEnv(t, newStore)
			counters := []limit.Charge{
				e.charge("s6", limit.Charge{Algorithm: limit.SlidingWindow, Amount: 20, Window: time.Minute, Buckets: 6}),
				e.charge("s20", limit.Charge{Algorithm: limit.SlidingWindow, Amount: 5, Window: time.Minute}),
				e.charge("s7", limit.Charge{Algorithm: limit.SlidingWindow, Amount: 1000, Window: time.Hour, Buckets: 7}),
				e.charge("f", limit.Charge{Algorithm: limit.FixedWindow, Amount: 10, Window: time.Minute}),
				e.charge("k7", limit.Charge{Algorithm: limit.TokenBucket, Amount: 7, Burst: 3, Window: 1000 * time.Second}),
				e.charge("k50", limit.Charge{Algorithm: limit.TokenBucket, Amount: 50, Window: 1000 * time.Second}),
				e.charge("zero", limit.Charge{Algorithm: limit.TokenBucket, Amount: 0, Window: time.Minute}),
			}
			md := &model{counters: map[string]*limit.Counter{}}
			now := int64(0)
			for step := 0; step < 1500; step++ {
				switch x := r.IntN(20); {
				case x < 8:
				case x < 16:
					now += r.Int64N(5000)
				case x < 19:
					now += r.Int64N(60000)
				default:
					now += r.Int64N(1000000)
				}
				at := e.at(now)
				charges := make([]limit.Charge, 1+r.IntN(4))
				for i := range charges {
					c := counters[r.IntN(len(counters))]
					if c.Amount > 0 && r.IntN(4) == 0 {
						c.Cost = 1 + r.Int64N(int64(c.Amount))
					} else {
						c.Cost = randCost(r, max(1, c.Amount), true)
					}
					c.Shadow = r.IntN(7) == 0
					c.Force = c.Cost > 0 && r.IntN(9) == 0
					charges[i] = c
				}
				gotOK, got := e.apply(charges...)
				wantOK, want := md.apply(at, charges)
				if gotOK == wantOK && equal(got, want) {
					continue
				}
				var b strings.Builder
				for i, c := range charges {
					fmt.Fprintf(&b, "\n  %d: %v amount %d cost %d shadow %v force %v: got %s, want %s", i, c.Algorithm, c.Amount, c.Cost, c.Shadow, c.Force, fmtResult(got[i]), fmtResult(want[i]))
				}
				t.Fatalf("step %d at %dms: admitted %v, want %v%s", step, now, gotOK, wantOK, b.String())
			}
		})
	}
}

func equal(a, b []limit.Result) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
