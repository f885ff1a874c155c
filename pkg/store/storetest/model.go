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
	// voids and denials count the decisions of each outcome.
	voids, denials int
}

func clone(c *limit.Counter) *limit.Counter {
	if c == nil {
		return &limit.Counter{}
	}
	d := *c
	d.Buckets = append([]limit.Bucket(nil), c.Buckets...)
	d.Leases = append([]limit.Lease(nil), c.Leases...)
	return &d
}

// extension is what a decision of the model does beyond the counters
// (the fair model's gates and states), in working state of its own that
// a void decision drops by not calling keep.
type extension interface {
	// gate is asked before charge ch steps its working counter c. A
	// denial answers as a charge that does not fit, with RetryAfter retry
	// ms, and leaves c as the gate left it.
	gate(ch *limit.Charge, c *limit.Counter, at int64) (fits bool, retry int64)
	// keep is called once the outcome of a decision that is not void is
	// known, with every charge's result, to record and keep its state.
	keep(charges []limit.Charge, res []limit.Result, admitted bool, at int64)
}

func (md *model) apply(now time.Time, charges []limit.Charge) (bool, []limit.Result) {
	return md.decide(now, charges, nil)
}

// decide is apply with ext's work (none when ext is nil) done where a
// store does it.
func (md *model) decide(now time.Time, charges []limit.Charge, ext extension) (bool, []limit.Result) {
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
	admitted, void := true, false
	for i := range charges {
		ch := &charges[i]
		c := get(ch.Key)
		fits, retry := true, int64(0)
		if ext != nil {
			fits, retry = ext.gate(ch, c, at)
		}
		if fits {
			fits, retry = c.Step(ch, at)
		}
		res[i] = limit.Result{Fits: fits, RetryAfter: limit.Millis(retry)}
		if ch.Cost >= 0 && !fits {
			if ch.Algorithm == limit.Once {
				void = true
			}
			if !ch.Shadow && !ch.Force {
				admitted = false
			}
		}
	}
	if void {
		// A Once charge that does not fit: nothing is kept.
		md.voids++
		clear(work)
		admitted = false
	} else if !admitted {
		md.denials++
		// Start over from the stored state: keep the refunds, the Force
		// charges and the Once marks, and the time the other charges saw
		// (the windows' high-water marks, the leases that expired).
		clear(work)
		for i := range charges {
			if ch := &charges[i]; ch.Cost < 0 || (ch.Cost > 0 && (ch.Force || ch.Algorithm == limit.Once)) {
				get(ch.Key).Step(ch, at)
			} else {
				get(ch.Key).Touch(ch, at)
			}
		}
	}
	if !void {
		if ext != nil {
			ext.keep(charges, res, admitted, at)
		}
		for k, c := range work {
			md.counters[k] = c
		}
	}
	for i := range charges {
		ch := &charges[i]
		rem, reset := get(ch.Key).Report(ch, at)
		res[i].Remaining = rem
		res[i].ResetAfter = limit.Millis(reset)
	}
	return admitted, res
}

// testModel runs random decisions of one to four charges (a key may
// repeat; refunds, refunds at a time, checks, shadow, Force and oversized
// charges, lease acquisitions, renewals and releases, Once marks that
// void the decision included) over counters of every algorithm, and
// requires the store's every answer to equal the model's to the
// millisecond.
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
				e.charge("c3", limit.Charge{Algorithm: limit.Concurrency, Amount: 3, Window: 20 * time.Second}),
				e.charge("c1", limit.Charge{Algorithm: limit.Concurrency, Amount: 1, Window: 7 * time.Second}),
				e.charge("once", limit.Charge{Algorithm: limit.Once, Window: 30 * time.Second}),
			}
			md := &model{counters: map[string]*limit.Counter{}}
			now := int64(0)
			const steps = 1500
			defer func() {
				t.Logf("%d decisions: %d void, %d denied", steps, md.voids, md.denials)
				if md.voids < steps/50 || md.denials < steps/10 {
					t.Errorf("%d void and %d denied decisions: the schedule misses them", md.voids, md.denials)
				}
			}()
			for step := 0; step < steps; step++ {
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
					switch {
					case c.Algorithm == limit.Concurrency:
						c.Member = fmt.Sprintf("m%d", r.IntN(5))
						c.Cost = []int64{1, 1, 1, -1, -1, 0}[r.IntN(6)]
					case c.Algorithm == limit.Once:
						c.Cost = []int64{1, 1, 1, 1, 0, -1}[r.IntN(6)]
					case c.Amount > 0 && r.IntN(4) == 0:
						c.Cost = 1 + r.Int64N(int64(c.Amount))
					default:
						c.Cost = randCost(r, max(1, c.Amount), true)
					}
					if c.Cost < 0 && c.Algorithm != limit.Concurrency && r.IntN(2) == 0 {
						// Mostly a counted bucket, now and then one that
						// has left the count or is ahead of cur.
						c.At = at.UnixMilli() - 150000 + r.Int64N(200000)
					}
					c.Shadow = r.IntN(7) == 0
					c.Force = c.Cost > 0 && r.IntN(9) == 0
					charges[i] = c
				}
				e.sameAsModel(step, now, charges, md.apply, func(c *limit.Charge) string {
					return fmt.Sprintf("%v %q amount %d cost %d at %d member %q shadow %v force %v", c.Algorithm, c.Key[len(c.Key)-6:], c.Amount, c.Cost, c.At, c.Member, c.Shadow, c.Force)
				})
			}
		})
	}
}

// sameAsModel applies charges to the store at the clock's time and fails
// the test, at step (now ms), unless its answer is the one model gives,
// listing each charge as describe has it.
func (e *env) sameAsModel(step int, now int64, charges []limit.Charge, model func(time.Time, []limit.Charge) (bool, []limit.Result), describe func(*limit.Charge) string) {
	e.tb.Helper()
	gotOK, got := e.apply(charges...)
	wantOK, want := model(e.clock.Now(), charges)
	if gotOK == wantOK && equal(got, want) {
		return
	}
	var b strings.Builder
	for i := range charges {
		fmt.Fprintf(&b, "\n  %d: %s: got %s, want %s", i, describe(&charges[i]), fmtResult(got[i]), fmtResult(want[i]))
	}
	e.tb.Fatalf("step %d at %dms: admitted %v, want %v%s", step, now, gotOK, wantOK, b.String())
}

func equal(a, b []limit.Result) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
