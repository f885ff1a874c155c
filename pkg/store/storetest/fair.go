package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// RunFair runs the conformance subtests of fair-shared charges
// (Charge.Fair) against stores made by newStore, as Run does for the rest
// of the contract. It is separate from Run so that a store can pass Run
// before it shares limits fairly.
//
// The fair gate's arithmetic is limit.FairState's; these subtests pin what
// a Store adds: the gate asked with the counter's room before the charge,
// Record with the decision's outcome (denied decisions included, voided
// ones not), the state's lifetime, the answer a gate denial gets, and the
// laws through the Store API; Model compares every answer with a
// reference built on limit.Counter and limit.FairState.
func RunFair(t *testing.T, newStore func(t testing.TB) limit.Store) {
	for _, st := range fairSuite {
		t.Run(st.name, func(t *testing.T) { t.Parallel(); st.run(t, newStore) })
	}
}

var fairSuite = []struct {
	name string
	run  func(t *testing.T, newStore func(testing.TB) limit.Store)
}{
	{"GateDeniesMemberAhead", testFairGate},
	{"GateOnAmountZero", testFairAmountZero},
	{"FairElsewhereIsNotWaiting", testFairElsewhere},
	{"OnceVoidWritesNothing", testFairVoid},
	{"StateOutlivesBacklog", testFairTTL},
	{"HostileInputs", testFairHostile},
	{"HardCap", testFairHardCap},
	{"ProportionalShare", testFairProportional},
	{"Model", testFairModel},
}

// fairPolicy is the suite's policy: a key waits for two minutes after a
// denial, runs at most 1 ahead of a waiting key and is owed at most 10.
var fairPolicy = limit.FairPolicy{Backlog: 2 * time.Minute, Quantum: 1, Credit: 10}

// fair returns c shared by member (a raw value; FairMember hashes it).
func fair(c limit.Charge, p *limit.FairPolicy, member string, weight float64) limit.Charge {
	c.Fair = limit.FairCharge{Policy: p, Member: limit.FairMember(member), Weight: weight}
	return c
}

// fairAlgs are the shared limits the gate tests run on: each holds 10 per
// minute. refill is when the 10 that member a takes at 0 are all free
// again (sliding: bucket 0 leaves the count at (M+1)*w = 70s; fixed: the
// next window; token: the bucket is full again); deny is the answer to a's
// sixth ask then, gated with 5 left: Remaining 5, the counter's
// ResetAfter, and RetryAfter the time to when room next frees (the end of
// the bucket, or one emission interval).
var fairAlgs = []struct {
	name   string
	give   limit.Charge
	refill int64
	deny   limit.Result
}{
	{"sliding", sliding, 73_000, res(false, 5, 67_000, 7_000)},
	{"fixed", limit.Charge{Algorithm: limit.FixedWindow, Amount: 10, Window: time.Minute}, 63_000, res(false, 5, 57_000, 57_000)},
	{"token", limit.Charge{Algorithm: limit.TokenBucket, Amount: 10, Window: time.Minute}, 63_000, res(false, 5, 30_000, 6_000)},
}

// asks charges c (cost 1) n times at the clock's time, alone or with
// others, and returns how many were admitted and the last Result of c.
func (e *env) asks(n int, c limit.Charge, others ...limit.Charge) (int, limit.Result) {
	e.tb.Helper()
	got := 0
	var last limit.Result
	for range n {
		ok, r := e.apply(append([]limit.Charge{cost(c, 1)}, others...)...)
		if ok {
			got++
		}
		last = r[0]
	}
	return got, last
}

// fairSetup has member a take the whole limit at 0, and member b ask for
// 20 at 1ms, in a decision with others; then it moves the clock to refill.
// The gate holds for b no more than b asked lately (20, decayed with
// Backlog: 10.9 at 73s, 7.4 at 119s), so b asks for more than the 5 it is
// owed.
func fairSetup(e *env, give limit.Charge, refill int64, others ...limit.Charge) (a, b limit.Charge) {
	e.tb.Helper()
	shared := e.charge("shared", give)
	a = fair(shared, &fairPolicy, "a", 1)
	b = fair(shared, &fairPolicy, "b", 1)
	e.at(0)
	if got, _ := e.asks(10, a); got != 10 {
		e.tb.Fatalf("a admitted %d of 10 on an empty limit", got)
	}
	e.at(1)
	e.apply(append([]limit.Charge{cost(b, 20)}, others...)...)
	e.at(refill)
	return a, b
}

// testFairGate: b, denied once by the full counter, is waiting when room
// frees; a, alone so far, may run only so far ahead of b that the room
// left covers b's catching up: 5 each. Without the gate a takes all 10;
// without recording b's denied decision (the state written on a denial) b
// is not waiting and a takes all 10.
func testFairGate(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, alg := range fairAlgs {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			a, b := fairSetup(e, alg.give, alg.refill)
			got, last := e.asks(6, a)
			if got != 5 {
				t.Fatalf("a admitted %d of 6 while b waits, want 5", got)
			}
			checkResult(t, "a's sixth ask, gated", last, alg.deny)
			got, last = e.asks(6, b)
			if got != 5 {
				t.Errorf("b admitted %d of 6 after a was gated, want the 5 left", got)
			}
			if last.Fits || last.Remaining != 0 {
				t.Errorf("b's sixth ask = %s, want denied by the counter with 0 left", fmtResult(last))
			}
		})
	}
}

// testFairAmountZero: a token bucket whose amount is cut to 0 has an
// emission interval of +Inf; a gate denial's RetryAfter then saturates at
// MaxWindow (Go's conversion of +Inf to an integer is the platform's to
// pick: memstore said 1 ms on amd64 where Lua said MaxWindow). The
// counter's own denial would say 0, so this is the gate's answer.
func testFairAmountZero(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	p := &limit.FairPolicy{Backlog: 10 * time.Second, Quantum: 1, Credit: 100}
	shared := e.charge("shared", limit.Charge{Algorithm: limit.TokenBucket, Amount: 10, Window: time.Second})
	a, b := fair(shared, p, "a", 1), fair(shared, p, "b", 1)
	e.at(0)
	// b takes 1 and a 9, so a runs 8 ahead; b's next ask is denied and b
	// waits.
	for i, st := range []struct {
		give   limit.Charge
		wantOK bool
	}{{cost(b, 1), true}, {cost(a, 9), true}, {cost(b, 1), false}} {
		if ok, _ := e.apply(st.give); ok != st.wantOK {
			t.Fatalf("step %d: admitted = %v, want %v", i, ok, st.wantOK)
		}
	}
	e.at(1)
	zero := cost(a, 1)
	zero.Amount = 0
	ok, r := e.apply(zero)
	want := limit.Millis(int64(limit.MaxWindow / time.Millisecond))
	if ok || r[0].Fits || r[0].RetryAfter != want {
		t.Errorf("a on Amount 0: admitted %v, %s; want a gate denial with RetryAfter %v", ok, fmtResult(r[0]), want)
	}
}

// testFairElsewhere: once a's 10 are free again, b's ask fits the limit
// but another charge denies the decision; that says nothing of b's share, so b
// is not waiting and a takes the whole limit when it frees. A store that
// recorded it as b's denial would gate a at 5.
func testFairElsewhere(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, alg := range fairAlgs {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			shared := e.charge("shared", alg.give)
			a := fair(shared, &fairPolicy, "a", 1)
			b := fair(shared, &fairPolicy, "b", 1)
			closed := e.charge("closed", withAmount(sliding, 0))
			e.at(0)
			if got, _ := e.asks(10, a); got != 10 {
				t.Fatalf("a admitted %d of 10 on an empty limit", got)
			}
			e.at(alg.refill)
			// b fits the freed room; the closed limit denies the decision.
			ok, r := e.apply(cost(b, 1), cost(closed, 1))
			if ok || !r[0].Fits || r[1].Fits {
				t.Fatalf("b with a closed limit: admitted %v, results %s %s; want denied by the closed limit only", ok, fmtResult(r[0]), fmtResult(r[1]))
			}
			if got, _ := e.asks(10, a); got != 10 {
				t.Errorf("a admitted %d of 10 after b's decision was denied elsewhere, want 10", got)
			}
		})
	}
}

// testFairVoid: b's denied ask comes in a decision a Once mark voids, so
// nothing of it is kept: b is not waiting and a takes all 10. The control
// (the same ask, not voided) gates a at 5.
func testFairVoid(t *testing.T, newStore func(testing.TB) limit.Store) {
	tests := []struct {
		name string
		give bool // whether the Once mark is set before b's ask
		want int
	}{
		{name: "voided", give: true, want: 10},
		{name: "kept", give: false, want: 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			once := e.charge("once", limit.Charge{Algorithm: limit.Once, Window: time.Hour})
			if tc.give {
				e.at(0)
				if ok, _ := e.apply(cost(once, 1)); !ok {
					t.Fatal("the first Once mark was not set")
				}
			}
			a, _ := fairSetup(e, sliding, 73_000, cost(once, 1))
			if got, _ := e.asks(10, a); got != tc.want {
				t.Errorf("a admitted %d of 10, want %d", got, tc.want)
			}
		})
	}
}

// testFairTTL: the state lives at least Backlog + the window after the
// last decision that recorded into it (a Store with real-clock TTLs adds
// its margin). b waits from its denial at 1ms until Backlog later, and a,
// far ahead, stays gated while it does, across the window's refills.
func testFairTTL(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	a, _ := fairSetup(e, sliding, 73_000)
	if got, _ := e.asks(10, a); got != 5 {
		t.Fatalf("a admitted %d of 10 at 73s, want 5", got)
	}
	// 119s: b's denial at 1ms is still within Backlog (2m); the 5 a took
	// at 73s still count, and a stays gated.
	e.at(119_000)
	if got, _ := e.asks(1, a); got != 0 {
		t.Errorf("a admitted at 119s while b still waits")
	}
	// 121s: b stopped waiting; a takes the 5 left.
	e.at(121_000)
	if got, _ := e.asks(10, a); got != 5 {
		t.Errorf("a admitted %d at 121s, want the 5 left once b stopped waiting", got)
	}
}

// testFairHostile: weights that are NaN, 0, negative, infinite or huge,
// the empty member and costs up to MaxInt64 are answered without an
// error, never admit past the limit, and leave the state usable.
func testFairHostile(t *testing.T, newStore func(testing.TB) limit.Store) {
	tests := []struct {
		name   string
		member string
		weight float64
		cost   int64
	}{
		{name: "nan weight", member: "a", weight: math.NaN(), cost: 1},
		{name: "zero weight", member: "a", weight: 0, cost: 1},
		{name: "negative weight", member: "a", weight: -5, cost: 1},
		{name: "infinite weight", member: "a", weight: math.Inf(1), cost: 1},
		{name: "huge weight", member: "a", weight: math.MaxFloat64, cost: 1},
		{name: "tiny weight", member: "a", weight: math.SmallestNonzeroFloat64, cost: 1},
		{name: "empty member", member: "", weight: 1, cost: 1},
		{name: "huge cost", member: "a", weight: 1, cost: math.MaxInt64},
		{name: "cost past the limit", member: "a", weight: 1, cost: 11},
		{name: "check", member: "a", weight: 1, cost: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, alg := range fairAlgs {
				e := newEnv(t, newStore)
				shared := e.charge("shared", alg.give)
				h := fair(shared, &fairPolicy, tc.member, tc.weight)
				total := int64(0)
				for i := range 30 {
					e.at(int64(i) * 100)
					ok, r := e.apply(cost(h, tc.cost), cost(fair(shared, &fairPolicy, "b", 1), 1))
					if ok {
						total += tc.cost + 1
					}
					if ok != (r[0].Fits && r[1].Fits) {
						t.Errorf("%s step %d: admitted %v with results %s %s", alg.name, i, ok, fmtResult(r[0]), fmtResult(r[1]))
					}
				}
				if total > 10 {
					t.Errorf("%s: admitted %d in 3s on a limit of 10 a minute", alg.name, total)
				}
				if tc.cost <= 1 && total == 0 {
					t.Errorf("%s: nothing admitted on an empty limit", alg.name)
				}
				// The state still serves an ordinary member.
				e.at(10 * time.Hour.Milliseconds())
				if got, _ := e.asks(1, fair(shared, &fairPolicy, "c", 1)); got != 1 {
					t.Errorf("%s: an ordinary member was denied on a fresh limit afterwards", alg.name)
				}
			}
		})
	}
}

// fairAdmission is one admitted fair charge: when, whose, how much.
type fairAdmission struct {
	at     int64
	member int
	cost   int64
}

// fairMix runs steps random decisions on one shared limit by members with
// weights ws, each asking cost 1..maxCost at times moving by 0..gap ms,
// and returns the admissions.
func fairMix(e *env, give limit.Charge, p *limit.FairPolicy, ws []float64, steps int, gap, maxCost int64, rng *rand.Rand) []fairAdmission {
	shared := e.charge("shared", give)
	var out []fairAdmission
	now := int64(0)
	for range steps {
		now += rng.Int64N(gap + 1)
		e.at(now)
		m := rng.IntN(len(ws))
		c := rng.Int64N(maxCost) + 1
		if ok, _ := e.apply(cost(fair(shared, p, fmt.Sprint("m", m), ws[m]), c)); ok {
			out = append(out, fairAdmission{at: now, member: m, cost: c})
		}
	}
	return out
}

// testFairHardCap: the gate can deny more, never admit more. Random
// members, weights, policies and interleavings on each algorithm; the
// admitted cost never exceeds the limit's own promise.
func testFairHardCap(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, alg := range fairAlgs {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			seed := rand.Uint64()
			rng := rand.New(rand.NewPCG(seed, 1))
			for round := range 4 {
				e := newEnv(t, newStore)
				ws := make([]float64, 2+rng.IntN(5))
				for i := range ws {
					ws[i] = float64(1 + rng.IntN(8))
				}
				p := &limit.FairPolicy{
					MinShare: float64(rng.IntN(3)) / 10,
					Backlog:  time.Duration(1+rng.IntN(120)) * time.Second,
					Quantum:  float64(1 + rng.IntN(3)),
					Credit:   float64(3 + rng.IntN(20)),
				}
				adm := fairMix(e, alg.give, p, ws, 400, 1_500, 3, rng)
				if err := checkCap(alg.give, adm); err != nil {
					t.Fatalf("seed %d round %d (weights %v, policy %+v): %v", seed, round, ws, *p, err)
				}
			}
		})
	}
}

// checkCap checks the admissions against the limit's promise: at most
// Amount in every interval of length W (sliding), in every epoch window
// (fixed), and at most Burst + elapsed/T between any two instants
// (token).
func checkCap(give limit.Charge, adm []fairAdmission) error {
	W := give.Window.Milliseconds()
	amount := int64(give.Amount)
	for i, x := range adm {
		var sum int64
		for _, y := range adm[i:] {
			switch give.Algorithm {
			case limit.SlidingWindow:
				if y.at-x.at >= W {
					continue
				}
			case limit.FixedWindow:
				if y.at/W != x.at/W {
					continue
				}
			}
			sum += y.cost
			if give.Algorithm == limit.TokenBucket {
				allowed := float64(amount) + float64(y.at-x.at)*float64(amount)/float64(W)
				if float64(sum) > allowed+1e-6 {
					return fmt.Errorf("token bucket: %d admitted in [%d, %d] ms, at most %g", sum, x.at, y.at, allowed)
				}
			} else if sum > amount {
				return fmt.Errorf("%v: %d admitted in the window from %d ms, limit %d", give.Algorithm, sum, x.at, amount)
			}
		}
	}
	return nil
}

// fairSpreadBound is the most that admitted/weight may spread, as
// (max-min)/mean over the members, when three members of weights 1, 2, 4
// are all backlogged on one sliding window for 20 windows (the first left
// out: nobody is denied until it fills). Measured on memstore, seeds 0
// to 199: worst 0.065, mean 0.057; with the gate forced open, mean 1.28
// (everyone gets about the same count). The bound leaves room for other
// seeds and stores (docs/fair-share-stores.md).
const fairSpreadBound = 0.15

// testFairProportional: all members backlogged, weights 1:2:4; each gets
// its weight's share of the limit.
func testFairProportional(t *testing.T, newStore func(testing.TB) limit.Store) {
	seed := rand.Uint64()
	spread, err := FairSpread(newStore(t), seed)
	if err != nil {
		t.Fatal(err)
	}
	if spread > fairSpreadBound {
		t.Errorf("seed %d: admitted/weight spreads by %.3f, want at most %.2f", seed, spread, fairSpreadBound)
	}
}

// FairSpread runs the proportional-share case on s with seed: members of
// weights 1, 2 and 4 ask cost 1 in random order, several asks every 100ms,
// on one sliding window of 100 a second in 10 buckets, for 21 seconds;
// it returns (max-min)/mean of admitted/weight after the first second.
func FairSpread(s limit.Store, seed uint64) (float64, error) {
	e := &env{tb: nil, store: s, clock: NewFakeClock(base), domain: fmt.Sprintf("storetest-fair-%016x", rand.Uint64())}
	give := limit.Charge{Algorithm: limit.SlidingWindow, Amount: 100, Window: time.Second, Buckets: 10}
	p := &limit.FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 10}
	ws := []float64{1, 2, 4}
	shared := e.charge("shared", give)
	rng := rand.New(rand.NewPCG(seed, 2))
	got := make([]float64, len(ws))
	res := make([]limit.Result, 1)
	for now := int64(0); now < 21_000; now += 100 {
		t := e.at(now)
		for range 30 {
			m := rng.IntN(len(ws))
			ch := []limit.Charge{cost(fair(shared, p, fmt.Sprint("m", m), ws[m]), 1)}
			ok, err := s.Apply(context.Background(), t, ch, res)
			if err != nil {
				return 0, fmt.Errorf("apply at %d ms: %w", now, err)
			}
			if ok && now >= 1_000 {
				got[m]++
			}
		}
	}
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	for i, w := range ws {
		x := got[i] / w
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	return (hi - lo) / (sum / float64(len(ws))), nil
}
