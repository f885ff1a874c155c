package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// seeds are the property tests' random schedules; fixed, so a failure
// reproduces.
var seeds = []uint64{1, 2, 3}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x746f6c6c67617465)) }

func runProperties(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("SlidingWindow/seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			propWindow(t, newStore, seed, limit.SlidingWindow, false)
		})
		t.Run(fmt.Sprintf("SlidingWindowWithRefunds/seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			propWindow(t, newStore, seed, limit.SlidingWindow, true)
		})
		t.Run(fmt.Sprintf("FixedWindow/seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			propWindow(t, newStore, seed, limit.FixedWindow, false)
		})
		t.Run(fmt.Sprintf("TokenBucket/seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			propToken(t, newStore, seed)
		})
		t.Run(fmt.Sprintf("Concurrency/seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			propLeases(t, newStore, seed)
		})
	}
	t.Run("SlidingWindowLiveness", func(t *testing.T) { t.Parallel(); propSlidingLiveness(t, newStore) })
	t.Run("FixedWindowLiveness", func(t *testing.T) { t.Parallel(); propFixedLiveness(t, newStore) })
	t.Run("TokenBucketLiveness", func(t *testing.T) { t.Parallel(); propTokenLiveness(t, newStore) })
}

// windowGeometry is the contract's w and M, in ms, derived here on its own.
func windowGeometry(c limit.Charge) (w, m int64) {
	W := c.Window.Milliseconds()
	if c.Algorithm == limit.FixedWindow {
		return W, 0
	}
	n := int64(c.Buckets)
	if n == 0 {
		n = limit.DefaultBuckets
	}
	w = (W + n - 1) / n
	return w, (W + w - 1) / w
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// ledger is what the test itself saw kept on one window counter: charges
// at their times, less refunds, which it takes newest first from the
// counted buckets as the contract does. base-relative ms.
type ledger struct {
	c    limit.Charge
	w, m int64
	ent  []kept
}

type kept struct {
	at   int64
	cost uint64
}

func newLedger(c limit.Charge) *ledger {
	w, m := windowGeometry(c)
	return &ledger{c: c, w: w, m: m}
}

func (l *ledger) abs(ms int64) int64 { return base.UnixMilli() + ms }

func (l *ledger) add(at int64, cost uint64) { l.ent = append(l.ent, kept{at, cost}) }

func (l *ledger) refund(at int64, n uint64) {
	lo := floorDiv(l.abs(at), l.w) - l.m
	for i := len(l.ent) - 1; i >= 0 && n > 0; i-- {
		if floorDiv(l.abs(l.ent[i].at), l.w) < lo {
			break
		}
		take := min(n, l.ent[i].cost)
		l.ent[i].cost -= take
		n -= take
	}
}

// usage is the cost kept in the counted buckets [cur-M, cur] at at.
func (l *ledger) usage(at int64) uint64 {
	lo := floorDiv(l.abs(at), l.w) - l.m
	var u uint64
	for i := len(l.ent) - 1; i >= 0 && floorDiv(l.abs(l.ent[i].at), l.w) >= lo; i-- {
		u += l.ent[i].cost
	}
	return u
}

// inWindow is the cost kept in the interval (at-W, at], or in the epoch
// window of at for a fixed window.
func (l *ledger) inWindow(at int64) uint64 {
	W := l.c.Window.Milliseconds()
	from := at - W // exclusive
	if l.c.Algorithm == limit.FixedWindow {
		from = floorDiv(l.abs(at), W)*W - base.UnixMilli() - 1
	}
	var u uint64
	for i := len(l.ent) - 1; i >= 0 && l.ent[i].at > from; i-- {
		u += l.ent[i].cost
	}
	return u
}

// randCost draws a cost: mostly 1, some weighted, some checks, a few that
// never fit and, when refunds is set, some refunds.
func randCost(r *rand.Rand, amount uint64, refunds bool) int64 {
	switch x := r.IntN(20); {
	case x < 2:
		return 0
	case x < 4 && refunds:
		return -1 - r.Int64N(int64(amount)+1)
	case x < 5:
		return int64(amount) + 1 + r.Int64N(2)
	case x < 9:
		return 1 + r.Int64N(int64(max(1, amount/3)))
	}
	return 1
}

// randGap draws the time to the next decision: often none or less than a
// bucket, mostly about the rate that doubles demand, now and then idle.
func randGap(r *rand.Rand, w, scale, idle int64) int64 {
	switch x := r.IntN(20); {
	case x < 5:
		return 0
	case x < 10:
		return r.Int64N(max(1, min(w/8, scale)) + 1)
	case x < 19:
		return 1 + r.Int64N(2*scale)
	}
	return 1 + r.Int64N(idle)
}

// checkAdmitted fails unless admitted is what the results say it must be.
func checkAdmitted(tb testing.TB, step int, charges []limit.Charge, rs []limit.Result, admitted bool) {
	tb.Helper()
	want := true
	for i, c := range charges {
		if c.Cost < 0 && !rs[i].Fits {
			tb.Fatalf("step %d: refund %d reported Fits = false", step, i)
		}
		if c.Cost >= 0 && !c.Shadow && !c.Force && !rs[i].Fits {
			want = false
		}
		if !rs[i].Fits && rs[i].RetryAfter < 0 {
			tb.Fatalf("step %d: charge %d: negative RetryAfter %v", step, i, rs[i].RetryAfter)
		}
		if rs[i].Fits && rs[i].RetryAfter != 0 {
			tb.Fatalf("step %d: charge %d fits with RetryAfter %v", step, i, rs[i].RetryAfter)
		}
	}
	if admitted != want {
		tb.Fatalf("step %d: admitted = %v, want %v from the results %v", step, admitted, want, rs)
	}
}

// propWindow runs a random schedule on two window counters charged alone
// or together and checks, at every step:
//   - the promise: the cost kept in every interval of length W ending at a
//     decision (for a fixed window: in every epoch window) is <= Amount;
//     intervals ending at decisions are the ones that can hold the most;
//   - Remaining = Amount - the cost kept in [cur-M, cur], exactly;
//   - admitted agrees with Fits, Shadow and Cost;
//   - after a lone charge of 1 is denied with RetryAfter R, a check at R-1
//     does not fit and one at R does.
//
// With refunds the kept cost is net: the test takes refunds from its own
// record newest first within the counted buckets, as the store does.
func propWindow(t *testing.T, newStore func(testing.TB) limit.Store, seed uint64, alg limit.Algorithm, refunds bool) {
	r := newRand(seed)
	e := newEnv(t, newStore)
	buckets := []uint16{1, 4, 6, 7, 20}
	amounts := []uint64{1, 7, 50}
	a := e.charge("a", limit.Charge{Algorithm: alg, Amount: amounts[r.IntN(3)], Window: time.Minute, Buckets: buckets[r.IntN(5)]})
	b := e.charge("b", limit.Charge{Algorithm: alg, Amount: amounts[r.IntN(3)] + 3, Window: time.Minute, Buckets: buckets[r.IntN(5)]})
	t.Logf("a: amount %d, buckets %d; b: amount %d, buckets %d", a.Amount, a.Buckets, b.Amount, b.Buckets)
	ledgers := map[string]*ledger{a.Key: newLedger(a), b.Key: newLedger(b)}
	w, _ := windowGeometry(a)
	scale := a.Window.Milliseconds() / int64(2*a.Amount)

	now, admittedN := int64(0), 0
	defer func() { t.Logf("%d of 1500 decisions admitted", admittedN) }()
	for step := 0; step < 1500; step++ {
		now += randGap(r, w, scale, 2*a.Window.Milliseconds())
		e.at(now)
		charges := []limit.Charge{cost(a, randCost(r, a.Amount, refunds))}
		if r.IntN(3) == 0 {
			cb := cost(b, randCost(r, b.Amount, refunds))
			cb.Shadow = r.IntN(5) == 0
			charges = append(charges, cb)
			if r.IntN(2) == 0 {
				charges[0], charges[1] = charges[1], charges[0]
			}
		}
		admitted, rs := e.apply(charges...)
		checkAdmitted(t, step, charges, rs, admitted)
		if admitted {
			admittedN++
		}
		for i, c := range charges {
			l := ledgers[c.Key]
			switch {
			case c.Cost < 0:
				l.refund(now, uint64(-c.Cost))
			case c.Cost > 0 && admitted && rs[i].Fits:
				l.add(now, uint64(c.Cost))
			}
		}
		for i, c := range charges {
			l := ledgers[c.Key]
			if got := l.inWindow(now); got > c.Amount {
				t.Fatalf("step %d at %dms: %d kept within one window on %d, limit %d", step, now, got, i, c.Amount)
			}
			u := l.usage(now)
			if want := c.Amount - min(u, c.Amount); rs[i].Remaining != want {
				t.Fatalf("step %d at %dms: charge %d (cost %d): Remaining = %d, want %d", step, now, i, c.Cost, rs[i].Remaining, want)
			}
		}
		if len(charges) == 1 && charges[0].Cost == 1 && !rs[0].Fits {
			now = checkRetry(t, e, step, a, now, rs[0].RetryAfter)
		}
	}
}

// checkRetry checks that a denied charge of 1 fits first at RetryAfter,
// and returns the time it moved to. It asks without charging: beside a
// charge on a limit of 0, which denies the decision, so nothing is kept
// and the charge's Result still says whether it fit. (A check, cost 0,
// answers another question: whether the counter is over its limit.)
func checkRetry(tb testing.TB, e *env, step int, c limit.Charge, now int64, retry time.Duration) int64 {
	tb.Helper()
	R := retry.Milliseconds()
	if R < 1 {
		tb.Fatalf("step %d: denied with RetryAfter %v", step, retry)
	}
	never := e.charge("never", withAmount(sliding, 0))
	e.at(now + R - 1)
	if _, rs := e.apply(cost(c, 1), cost(never, 1)); rs[0].Fits {
		tb.Fatalf("step %d at %dms: a charge of 1 fits at RetryAfter-1ms (RetryAfter %dms)", step, now, R)
	}
	e.at(now + R)
	if _, rs := e.apply(cost(c, 1), cost(never, 1)); !rs[0].Fits {
		tb.Fatalf("step %d at %dms: a charge of 1 does not fit at RetryAfter (%dms): %s", step, now, R, fmtResult(rs[0]))
	}
	return now + R
}

// propSlidingLiveness: a stream of single requests at exactly the limit
// rate, Amount/W, gets at least Amount*M/(M+1) per window: over K whole
// buckets at least K*Amount/(M+1). (Why: take the last bucket with a
// denial; the M+1 buckets ending there hold exactly Amount; repeat before
// them; buckets between such blocks had no denial and got all of their
// Amount/M. Requests before the stream's start count as none.)
func propSlidingLiveness(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	c := e.charge("stream", limit.Charge{Algorithm: limit.SlidingWindow, Amount: 60, Window: time.Minute, Buckets: 6, Cost: 1})
	w, m := windowGeometry(c)
	gap := c.Window.Milliseconds() / int64(c.Amount)
	const K = 180 // buckets: 30 windows
	var got uint64
	for at := int64(0); at < K*w; at += gap {
		e.at(at)
		if ok, _ := e.apply(c); ok {
			got++
		}
	}
	t.Logf("a stream at the limit rate got %d in %d buckets (M = %d)", got, K, m)
	if want := (K*c.Amount + uint64(m)) / uint64(m+1); got < want {
		t.Fatalf("a stream at the limit rate got %d in %d buckets, want at least %d", got, K, want)
	}
}

// propFixedLiveness: demand above the limit gets exactly Amount in every
// epoch window.
func propFixedLiveness(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	c := e.charge("stream", limit.Charge{Algorithm: limit.FixedWindow, Amount: 40, Window: time.Minute, Cost: 1})
	W := c.Window.Milliseconds()
	gap := W / int64(3*c.Amount) // three times the rate
	for win := int64(0); win < 10; win++ {
		var got uint64
		for at := win * W; at < (win+1)*W; at += gap {
			e.at(at)
			if ok, _ := e.apply(c); ok {
				got++
			}
		}
		if got != c.Amount {
			t.Fatalf("window %d admitted %d, want %d", win, got, c.Amount)
		}
	}
}

// propToken runs a random schedule on a token bucket and checks the
// promise, in every interval [s, u] between two admissions, that the cost
// admitted is <= B + (u-s)/T; Remaining never above B; admitted against
// Fits; and RetryAfter as propWindow does.
func propToken(t *testing.T, newStore func(testing.TB) limit.Store, seed uint64) {
	r := newRand(seed)
	e := newEnv(t, newStore)
	amounts := []uint64{3, 10, 60}
	bursts := []uint64{0, 1, 5}
	c := e.charge("k", limit.Charge{Algorithm: limit.TokenBucket, Amount: amounts[r.IntN(3)], Burst: bursts[r.IntN(3)], Window: 1000 * time.Second})
	B := c.Burst
	if B == 0 {
		B = c.Amount
	}
	T := float64(c.Window.Milliseconds()) / float64(c.Amount)
	t.Logf("amount %d, burst %d: T = %gms", c.Amount, B, T)
	scale := int64(T / 2)

	var times []int64
	var sums []uint64 // prefix sums of admitted cost
	sums = append(sums, 0)
	now := int64(0)
	defer func() { t.Logf("%d of 1500 decisions admitted", len(times)) }()
	for step := 0; step < 1500; step++ {
		now += randGap(r, scale, scale, 10*int64(T))
		e.at(now)
		ch := cost(c, randCost(r, B, false))
		admitted, rs := e.apply(ch)
		checkAdmitted(t, step, []limit.Charge{ch}, rs, admitted)
		if rs[0].Remaining > B {
			t.Fatalf("step %d: Remaining %d above burst %d", step, rs[0].Remaining, B)
		}
		if ch.Cost > int64(B) && rs[0].Fits {
			t.Fatalf("step %d: cost %d above burst %d fits", step, ch.Cost, B)
		}
		if admitted && ch.Cost > 0 {
			times = append(times, now)
			sums = append(sums, sums[len(sums)-1]+uint64(ch.Cost))
			j := len(times) - 1
			for i := 0; i <= j; i++ {
				got := float64(sums[j+1] - sums[i])
				if bound := float64(B) + float64(times[j]-times[i])/T; got > bound+1e-6 {
					t.Fatalf("step %d: %v admitted in [%d, %d]ms, bound %g", step, got, times[i], times[j], bound)
				}
			}
		}
		if ch.Cost == 1 && !rs[0].Fits {
			now = checkRetry(t, e, step, c, now, rs[0].RetryAfter)
		}
	}
}

// propTokenLiveness: after its burst, a stream at exactly the rate is
// always admitted, and twice the rate gets the rate.
func propTokenLiveness(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	for _, amount := range []uint64{10, 3, 7} {
		c := e.charge(fmt.Sprintf("stream%d", amount), limit.Charge{Algorithm: limit.TokenBucket, Amount: amount, Window: 1000 * time.Second, Cost: int64(amount)})
		T := float64(c.Window.Milliseconds()) / float64(amount)
		e.at(0)
		if ok, _ := e.apply(c); !ok {
			t.Fatal("full burst denied")
		}
		c.Cost = 1
		for i := 1; i <= 300; i++ {
			at := int64(float64(i)*T + 0.999999) // the first whole ms at or after i*T
			e.at(at)
			if ok, rs := e.apply(c); !ok {
				t.Fatalf("amount %d: request %d at %dms, on the rate, denied: %s", amount, i, at, fmtResult(rs[0]))
			}
		}
	}
}

// propLeases runs a random schedule of lease acquisitions, renewals,
// releases and checks on one Concurrency counter, alone or beside a fixed
// window that now and then denies the decision, with leases expiring as
// time moves. The test keeps its own record of the leases held (kept
// acquisitions at their deadlines, less releases) and checks, at every
// step:
//   - the cap: the live leases never exceed Amount;
//   - Fits, RetryAfter, Remaining and ResetAfter, exactly, from that
//     record: an acquisition fits when its member holds a live lease or
//     fewer than Amount are live, counting the earlier charges of the
//     decision;
//   - admitted agrees with Fits.
func propLeases(t *testing.T, newStore func(testing.TB) limit.Store, seed uint64) {
	r := newRand(seed)
	e := newEnv(t, newStore)
	amounts := []uint64{1, 3, 5}
	c := e.charge("c", limit.Charge{Algorithm: limit.Concurrency, Amount: amounts[r.IntN(3)], Window: 10 * time.Second})
	f := e.charge("f", limit.Charge{Algorithm: limit.FixedWindow, Amount: 3, Window: 10 * time.Second})
	W := c.Window.Milliseconds()
	t.Logf("amount %d", c.Amount)

	held := leaseRecord{} // member -> deadline, ms after base
	now, admittedN, fullN := int64(0), 0, 0
	defer func() { t.Logf("%d of 1000 decisions admitted, %d found the cap full", admittedN, fullN) }()
	for step := 0; step < 1000; step++ {
		if r.IntN(3) > 0 {
			now += r.Int64N(W / 4)
		}
		e.at(now)
		charges := leaseCharges(r, c, f)
		admitted, rs := e.apply(charges...)
		checkAdmitted(t, step, charges, rs, admitted)
		if admitted {
			admittedN++
		}
		fullN += held.checkFits(t, step, now, c, charges, rs)
		held.keep(c, charges, rs, admitted, now)
		held.checkReport(t, step, now, c, charges, rs)
	}
}

// leaseCharges is one random decision of propLeases: one to three
// acquisitions, releases or checks of Concurrency charge c by a few
// members, and now and then fixed window f.
func leaseCharges(r *rand.Rand, c, f limit.Charge) []limit.Charge {
	var charges []limit.Charge
	for range 1 + r.IntN(3) {
		ch := c
		ch.Member = fmt.Sprintf("m%d", r.IntN(2*int(c.Amount)+2))
		ch.Cost = []int64{1, 1, 1, -1, 0}[r.IntN(5)]
		charges = append(charges, ch)
	}
	if r.IntN(3) == 0 {
		charges = append(charges, cost(f, 1))
	}
	return charges
}

// leaseRecord is propLeases' own record of the leases held: member ->
// deadline, ms after base.
type leaseRecord map[string]int64

// live is how many leases of m are live at now, and how long until the
// first of them ends.
func (m leaseRecord) live(now int64) (n uint64, first int64) {
	for _, d := range m {
		if d > now {
			if n == 0 || d-now < first {
				first = d - now
			}
			n++
		}
	}
	return n, first
}

// checkFits checks each charge on c's key against what it saw: the
// record, with the decision's earlier charges applied. It returns how
// many found the cap full.
func (m leaseRecord) checkFits(tb testing.TB, step int, now int64, c limit.Charge, charges []limit.Charge, rs []limit.Result) (full int) {
	tb.Helper()
	W := c.Window.Milliseconds()
	seen := leaseRecord{}
	for mem, d := range m {
		if d > now {
			seen[mem] = d
		}
	}
	for i, ch := range charges {
		if ch.Key != c.Key {
			continue
		}
		n, first := seen.live(now)
		_, isHeld := seen[ch.Member]
		var fits bool
		switch {
		case ch.Cost < 0:
			fits = true
			delete(seen, ch.Member)
		case ch.Cost == 0:
			fits = n < c.Amount
		default:
			fits = isHeld || n < c.Amount
			if fits {
				seen[ch.Member] = now + W
			}
		}
		if !fits {
			full++
		}
		want := limit.Result{Fits: fits}
		if !fits {
			want.RetryAfter = ms(first)
		}
		if rs[i].Fits != want.Fits || rs[i].RetryAfter != want.RetryAfter {
			tb.Fatalf("step %d at %dms: charge %d (%s cost %d): %s, want Fits %v RetryAfter %v", step, now, i, ch.Member, ch.Cost, fmtResult(rs[i]), want.Fits, want.RetryAfter)
		}
	}
	return full
}

// keep records what the store kept: all of it when admitted, the
// releases otherwise.
func (m leaseRecord) keep(c limit.Charge, charges []limit.Charge, rs []limit.Result, admitted bool, now int64) {
	for i, ch := range charges {
		switch {
		case ch.Key != c.Key:
		case ch.Cost < 0:
			delete(m, ch.Member)
		case ch.Cost > 0 && admitted && rs[i].Fits:
			m[ch.Member] = now + c.Window.Milliseconds()
		}
	}
}

// checkReport checks the cap, and each charge's Remaining and ResetAfter
// on c's key, against the record after the decision.
func (m leaseRecord) checkReport(tb testing.TB, step int, now int64, c limit.Charge, charges []limit.Charge, rs []limit.Result) {
	tb.Helper()
	n, first := m.live(now)
	if n > c.Amount {
		tb.Fatalf("step %d at %dms: %d live leases, cap %d", step, now, n, c.Amount)
	}
	for i, ch := range charges {
		if ch.Key != c.Key {
			continue
		}
		if rs[i].Remaining != c.Amount-n || rs[i].ResetAfter != ms(first) {
			tb.Fatalf("step %d at %dms: charge %d: %s, want Remaining %d ResetAfter %dms", step, now, i, fmtResult(rs[i]), c.Amount-n, first)
		}
	}
}

// testConcurrent hammers one key from several goroutines at one instant:
// exactly Amount is admitted (one lease per member; one Once mark). Then
// two keys at once: all or nothing holds.
func testConcurrent(t *testing.T, newStore func(testing.TB) limit.Store) {
	const goroutines, each = 8, 40
	e := newEnv(t, newStore)
	e.at(0)
	now := e.clock.Now()
	hammer := func(charges ...limit.Charge) (admitted uint64) {
		var n atomic.Uint64
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := make([]limit.Result, len(charges))
				mine := append([]limit.Charge(nil), charges...)
				for i := 0; i < each; i++ {
					for j := range mine {
						if mine[j].Algorithm == limit.Concurrency {
							mine[j].Member = fmt.Sprintf("g%d-%d", g, i)
						}
					}
					ok, err := e.store.Apply(context.Background(), now, mine, res)
					if err != nil {
						t.Errorf("Apply: %v", err)
						return
					}
					if ok {
						n.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return n.Load()
	}
	for _, tc := range []struct {
		name string
		give limit.Charge
		want uint64
	}{
		{name: "sliding", give: cost(withAmount(sliding, 100), 1), want: 100},
		{name: "fixed", give: cost(withAmount(fixed, 100), 1), want: 100},
		{name: "token", give: cost(withAmount(token, 100), 1), want: 100},
		{name: "sliding weighted", give: cost(withAmount(sliding, 100), 3), want: 33},
		{name: "token weighted", give: cost(withAmount(token, 100), 7), want: 14},
		{name: "concurrency", give: cost(withAmount(conc, 100), 1), want: 100},
		{name: "once", give: cost(once, 1), want: 1},
	} {
		c := e.charge(tc.name, tc.give)
		if got := hammer(c); got != tc.want {
			t.Errorf("%s: admitted %d decisions, want %d", tc.name, got, tc.want)
		}
	}

	a := cost(e.charge("pair-a", withAmount(sliding, 100)), 1)
	b := cost(e.charge("pair-b", withAmount(fixed, 1000)), 1)
	if got := hammer(b, a); got != 100 {
		t.Errorf("pair: admitted %d decisions, want 100", got)
	}
	_, rs := e.apply(cost(a, 0), cost(b, 0))
	if rs[0].Remaining != 0 || rs[1].Remaining != 900 {
		t.Errorf("pair: Remaining %d and %d, want 0 and 900: a denied decision kept a charge", rs[0].Remaining, rs[1].Remaining)
	}
}
