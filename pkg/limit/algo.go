package limit

import (
	"math"
	"slices"
	"time"
)

// Millis is ms milliseconds as a Duration, saturating at MaxWindow: a
// window's reset time can pass it by a bucket.
func Millis(ms int64) time.Duration {
	const most = int64(MaxWindow / time.Millisecond)
	return time.Duration(min(ms, most)) * time.Millisecond
}

// Counter is the state a Store keeps for one key, and the algorithms as
// pure functions of it. The zero Counter is a fresh counter.
//
// A Store runs a decision with it so: Step each charge in order on working
// copies of the counters (so a charge sees the earlier ones on its key).
// When a Once charge with Cost >= 0 does not fit, the Apply is void: keep
// nothing at all (not even the windows' high-water marks) and report the
// stored counters. Otherwise, when a charge that is neither Shadow nor
// Force and has Cost >= 0 does not fit, start again from the stored
// counters and, in order, Step the refunds, the Force charges and the
// Once charges with Cost > 0, and Touch the other charges (a denied
// decision still moves the windows' high-water marks and drops expired
// leases). Store the result (Expiry says when it may be dropped); then
// fill every Result's Remaining and ResetAfter with Report on its counter
// as it now stands. So Results describe the counters after the whole
// Apply: two charges on one key report the same Remaining.
//
// The arithmetic is the one documented on Charge, with these readings
// (the storetest suite checks them, and the Redis scripts do the same):
//
//   - All times are integer Unix milliseconds; a Window under 1 ms counts
//     as 1 ms, and Buckets above MaxBuckets as MaxBuckets.
//   - A window counter keeps the contract's high-water mark hw (High) and
//     every Step or Touch writes it, so cur = max(floor(now/w), hw) never
//     goes back and every bucket is at or below cur. Buckets older than
//     cur-M are dropped then too, which can no longer change any answer.
//   - A window counter's buckets are counted in one width. State made with
//     another width (the rule's Buckets changed) is a fresh counter, and
//     the first Step or Touch in the new width replaces it.
//   - State of another algorithm is a fresh counter too.
//   - A check (Cost 0) needs room for 1: it fits when usage < Amount (for
//     the token bucket, when t + T - now is within the burst), and its
//     RetryAfter is that of a charge of 1. Against Amount 0 it never fits.
//   - RetryAfter for a charge that never fits is ResetAfter as the charge
//     saw it, which is 0 for an empty sliding window.
//   - The token bucket keeps tat as At + Debt: At is the integer ms of the
//     last write and Debt the float64 ms the bucket was then short of
//     full (tat - At). A single float64 tat near 1.7e12 ms keeps only
//     2^-12 ms, which with a T like 1000/6 ms rejects the first request
//     of a fresh bucket with burst 1 and loses the last token of many
//     bursts; Debt keeps 52 bits of the part that matters. Comparisons
//     allow eps = B*T / 2^32: B charges of 1 then fill a burst of B
//     exactly, and a bucket kept at its limit for a million decisions in
//     a row does not drift past it; eps is less than a token below 2^32
//     tokens. See tokenStep.
//   - Amount 0 in a token bucket admits nothing (T would be infinite):
//     nothing with Cost >= 0 fits, refunds change nothing, and Remaining,
//     ResetAfter and RetryAfter are 0.
//   - At counts only on a sliding window's refund: there the bucket
//     floor(At/w) is drained first when it lies in [cur-M, cur], then the
//     newest buckets as usual. On a charge, a check, a fixed window or a
//     token bucket At changes nothing.
//   - Concurrency reads Cost by its sign: any Cost > 0 takes (or renews)
//     Member's one lease, any Cost < 0 releases it; a check ignores
//     Member. Stores reject a Concurrency charge with Cost != 0 and no
//     Member. A renewal sets the deadline to now + Window even when that
//     is earlier than the one held (a lagging replica can shorten a lease
//     by its lag). Amount 0 admits only a member already held.
//   - A Force acquisition is a Force charge like any other: it takes the
//     lease even past Amount (reporting Fits false) and is kept in a
//     denied decision. So the cap holds for everything but Force. A
//     Shadow acquisition that does not fit is reported and not kept.
//   - Leases expire lazily: every Step and Touch of a Concurrency counter
//     drops the leases whose deadline is at or before now, and Report
//     counts only live ones. RetryAfter of a denied acquisition or check
//     is ResetAfter as the charge saw it: the time until the earliest
//     live deadline, 0 with none (Amount 0). Expiry is the latest deadline.
//   - Once ignores Shadow and Force: any Once charge with Cost >= 0 that
//     does not fit voids the Apply. A check (Cost 0) fits when no mark is
//     live and sets none. Cost < 0 removes the mark (it always fits) and
//     applies like a refund: in a denied decision too, never in a void.
//   - A Once mark that fits is kept in a denied decision, as a Force
//     charge is: a denial keeps the refunds and Force charges, and the
//     mark is what stops a second delivery of the same report from
//     applying them again.
//   - Once reports Remaining, ResetAfter and RetryAfter 0. Its mark lives
//     until now + Window (Expiry); a mark whose time has come is no mark.
//   - A key holds one algorithm's state. Every write of one algorithm
//     clears the fields of the others, so at most one set is in use and
//     each algorithm reads the others' state as a fresh counter.
type Counter struct {
	// Width is the bucket width in ms the Buckets and High were counted
	// in; 0 when the counter holds no window state.
	Width int64
	// High is the window's high-water bucket index hw: the largest cur any
	// decision on the counter has used.
	High int64
	// Buckets are the window's nonzero counts, in ascending Index order,
	// none above High.
	Buckets []Bucket
	// At (Unix ms) and Debt (ms) are the token bucket's state: tat =
	// At + Debt. Debt <= 0 means a full bucket.
	At   int64
	Debt float64
	// Leases are a Concurrency counter's members, in the order they were
	// first taken; those whose Deadline <= now are gone.
	Leases []Lease
	// Marked and Until are a Once counter's mark, live while now < Until.
	Marked bool
	Until  int64
}

// Lease is one Concurrency member and its deadline (Unix ms).
type Lease struct {
	Member   string
	Deadline int64
}

// Bucket is one window bucket: Index is floor(time/width).
type Bucket struct {
	Index int64
	Count uint64
}

// MaxCount is the largest count a window keeps and the largest cost or
// refund a charge counts: 2^53, exact in a float64, as Lua counts. A
// bucket's count, a window's usage and a charge's |Cost| saturate there
// rather than wrap: uint64 usage of 2^64 reports of usage would wrap to
// 0 and reopen a spent budget, and Lua rounds past 2^53.
const MaxCount = 1 << 53

// maxDebt caps a token bucket's Debt and its RetryAfter (ms) at
// MaxWindow: Force charges of MaxCount x a long T push the debt past
// anything an int64 of ms, let alone of ns, can hold.
const maxDebt = float64(MaxWindow / time.Millisecond)

// tbEps sets the token bucket's tolerance: eps = B*T / 2^32 (a power of
// two, so B*T*tbEps is exact).
const tbEps = 1.0 / (1 << 32)

// Geometry returns a window charge's bucket width w and M, in ms: the one
// derivation of a window's buckets in Go (redisstore passes w and M to
// apply.lua, which keeps the bucket arithmetic that follows from them; a
// test there checks it agrees with Counter's).
func Geometry(ch *Charge) (w, m int64) {
	W := WindowMillis(ch)
	if ch.Algorithm == FixedWindow {
		return W, 0
	}
	n := int64(ch.Buckets)
	if n == 0 {
		n = DefaultBuckets
	}
	if n > MaxBuckets {
		n = MaxBuckets
	}
	w = (W + n - 1) / n
	m = (W + w - 1) / w
	return w, m
}

// BucketEnd is when (Unix ms) the bucket holding instant at ends, for a
// window charge: a sliding window's bucket, or the whole fixed window,
// with the geometry every Store uses. Decorators that act per bucket
// (lease, overlimit) read it here rather than repeat the arithmetic.
func BucketEnd(ch *Charge, at int64) int64 {
	w, _ := Geometry(ch)
	return (floorDiv(at, w) + 1) * w
}

// BucketWidth is the width in ms of a window charge's bucket (see
// BucketEnd).
func BucketWidth(ch *Charge) int64 {
	w, _ := Geometry(ch)
	return w
}

// WindowMillis is ch's Window in ms, at least 1: a window under 1ms
// counts as 1ms.
func WindowMillis(ch *Charge) int64 {
	if W := ch.Window.Milliseconds(); W >= 1 {
		return W
	}
	return 1
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Step applies ch to c at now (Unix ms) and reports whether it fits and,
// when it does not, the RetryAfter in ms. A positive charge counts only
// when it fits, unless it is Force, which counts whatever the usage; a
// check never counts, and a refund always applies (and fits). Whatever
// the charge, a window or Concurrency counter records now as Touch does.
func (c *Counter) Step(ch *Charge, now int64) (fits bool, retryAfter int64) {
	switch ch.Algorithm {
	case TokenBucket:
		return c.tokenStep(ch, now)
	case Concurrency:
		return c.leaseStep(ch, now)
	case Once:
		return c.markStep(ch, now)
	}
	return c.windowStep(ch, now)
}

// Touch records that a decision at now involved ch without counting it:
// a window counter's high-water mark moves up to now's bucket and the
// buckets that left the count are dropped; a Concurrency counter drops
// the leases that expired. A token bucket or a Once mark needs nothing.
func (c *Counter) Touch(ch *Charge, now int64) {
	switch ch.Algorithm {
	case TokenBucket, Once:
	case Concurrency:
		c.live(now)
	default:
		w, m := Geometry(ch)
		c.touch(w, m, now)
	}
}

// Report returns Remaining and ResetAfter (ms) for ch as c stands at now.
func (c *Counter) Report(ch *Charge, now int64) (remaining uint64, resetAfter int64) {
	switch ch.Algorithm {
	case TokenBucket:
		return c.tokenReport(ch, now)
	case Concurrency:
		n, first, _ := c.leaseSpan(now, "")
		if n < ch.Amount {
			remaining = ch.Amount - n
		}
		return remaining, first
	case Once:
		return 0, 0
	}
	w, m := Geometry(ch)
	v := c.view(w, m, now)
	u := v.usage()
	if u < ch.Amount {
		remaining = ch.Amount - u
	}
	return remaining, v.resetAfter(ch.Algorithm == FixedWindow, now)
}

// Expiry returns the Unix ms from which c, charged as ch describes, is
// equivalent to a fresh counter, so a Store may drop it; ok is false when
// c is fresh already.
func (c *Counter) Expiry(ch *Charge) (at int64, ok bool) {
	switch ch.Algorithm {
	case TokenBucket:
		if c.Width != 0 || c.Debt <= 0 {
			return 0, false
		}
		return c.At + int64(math.Ceil(c.Debt)), true
	case Concurrency:
		if len(c.Leases) == 0 {
			return 0, false
		}
		at = c.Leases[0].Deadline
		for _, l := range c.Leases[1:] {
			at = max(at, l.Deadline)
		}
		return at, true
	case Once:
		return c.Until, c.Marked
	}
	w, m := Geometry(ch)
	if c.Width != w {
		return 0, false
	}
	// Until then the newest bucket may count, or hw still moves cur.
	return (c.High + m + 1) * w, true
}

// window is a counter's buckets as seen by one charge at one instant.
type window struct {
	w, m, cur int64
	b         []Bucket // all stored buckets in the charge's width
	lo, hi    int      // b[lo:hi] are the counted ones, [cur-M, cur]
}

func (c *Counter) view(w, m, now int64) window {
	v := window{w: w, m: m, cur: floorDiv(now, w)}
	if c.Width != w {
		return v
	}
	v.cur = max(v.cur, c.High)
	v.b = c.Buckets
	for v.lo < len(v.b) && v.b[v.lo].Index < v.cur-m {
		v.lo++
	}
	v.hi = v.lo
	for v.hi < len(v.b) && v.b[v.hi].Index <= v.cur {
		v.hi++
	}
	return v
}

// usage is the counted buckets' sum, at most MaxCount.
func (v *window) usage() uint64 {
	// At most MaxBuckets+1 counts of at most MaxCount each: the sum stays
	// below 2^63, so it can be taken whole and then capped.
	var u uint64
	for _, b := range v.b[v.lo:v.hi] {
		u += b.Count
	}
	return min(u, MaxCount)
}

// resetAfter is the time until the newest nonzero counted bucket leaves
// the count; for a fixed window, the time to the end of the window.
func (v *window) resetAfter(fixed bool, now int64) int64 {
	if fixed {
		return (v.cur+1)*v.w - now
	}
	if v.hi == v.lo {
		return 0
	}
	return (v.b[v.hi-1].Index+v.m+1)*v.w - now
}

// retryAfter is the earliest time at which a charge of need (> 0) fits as
// the oldest counted buckets leave one by one.
func (v *window) retryAfter(fixed bool, need, amount uint64, now int64) int64 {
	if need > amount {
		return v.resetAfter(fixed, now)
	}
	u := v.usage()
	for _, b := range v.b[v.lo:v.hi] {
		// A saturated usage can be less than the counts; Lua goes
		// negative there, and any u below amount-need answers alike.
		u -= min(u, b.Count)
		if u <= amount-need {
			return (b.Index+v.m+1)*v.w - now
		}
	}
	return v.resetAfter(fixed, now)
}

func (c *Counter) windowStep(ch *Charge, now int64) (bool, int64) {
	w, m := Geometry(ch)
	c.touch(w, m, now)
	v := c.view(w, m, now)
	fixed := ch.Algorithm == FixedWindow
	switch {
	case ch.Cost < 0:
		r := min(uint64(-ch.Cost), MaxCount) // two's complement: right for MinInt64 too
		if ch.At != 0 && !fixed {
			// The bucket the refunded cost was charged in, while it counts.
			at := floorDiv(ch.At, w)
			for i := v.lo; i < v.hi; i++ {
				if v.b[i].Index == at {
					take := min(r, v.b[i].Count)
					v.b[i].Count -= take
					r -= take
					break
				}
			}
		}
		for i := v.hi - 1; i >= v.lo && r > 0; i-- {
			take := min(r, v.b[i].Count)
			v.b[i].Count -= take
			r -= take
		}
		c.compact()
		return true, 0
	case ch.Cost == 0:
		// A check asks whether the counter is over its limit, as
		// envoyproxy/ratelimit answers hits_addend 0: at the limit it
		// is not. A limit of 0 refuses every request, checks included.
		if u := v.usage(); ch.Amount > 0 && u <= ch.Amount {
			return true, 0
		}
		// It fits again once the usage is back at the limit; with a
		// limit of 0 never (a need above the amount answers the reset).
		need := uint64(0)
		if ch.Amount == 0 {
			need = 1
		}
		return false, v.retryAfter(fixed, need, ch.Amount, now)
	}
	cost := min(uint64(ch.Cost), MaxCount)
	fits, retry := true, int64(0)
	if cost > ch.Amount || v.usage() > ch.Amount-cost {
		fits, retry = false, v.retryAfter(fixed, cost, ch.Amount, now)
		if !ch.Force {
			return false, retry
		}
	}
	// touch left every bucket at or below cur = High.
	if n := len(c.Buckets); n > 0 && c.Buckets[n-1].Index == v.cur {
		c.Buckets[n-1].Count = min(c.Buckets[n-1].Count+cost, MaxCount)
	} else {
		c.Buckets = append(c.Buckets, Bucket{Index: v.cur, Count: cost})
	}
	return fits, retry
}

// touch makes c a window counter of width w whose high-water mark is at
// least now's bucket, and drops the buckets older than High-M.
func (c *Counter) touch(w, m, now int64) {
	cur := floorDiv(now, w)
	if c.Width != w {
		// Fresh, or state of another width or algorithm: start over.
		c.clear()
		c.Width, c.High = w, cur
	}
	c.High = max(c.High, cur)
	i := 0
	for i < len(c.Buckets) && c.Buckets[i].Index < c.High-m {
		i++
	}
	if i > 0 {
		n := copy(c.Buckets, c.Buckets[i:])
		c.Buckets = c.Buckets[:n]
	}
}

// clear makes c a fresh counter, keeping its buffers.
func (c *Counter) clear() {
	c.Width, c.High, c.Buckets = 0, 0, c.Buckets[:0]
	c.At, c.Debt = 0, 0
	c.Leases, c.Marked, c.Until = c.Leases[:0], false, 0
}

// compact drops the buckets a refund emptied.
func (c *Counter) compact() {
	out := c.Buckets[:0]
	for _, b := range c.Buckets {
		if b.Count > 0 {
			out = append(out, b)
		}
	}
	c.Buckets = out
}

// bucketParams returns the GCRA's T, B*T and the fit limit B*T + eps, in
// float64 ms, computed in this order so that every Store agrees to the bit.
func bucketParams(ch *Charge) (T, BT, lim float64, burst uint64) {
	burst = ch.Burst
	if burst == 0 {
		burst = ch.Amount
	}
	T = float64(WindowMillis(ch)) / float64(ch.Amount)
	BT = float64(burst) * T
	lim = BT + float64(BT*tbEps)
	return T, BT, lim, burst
}

// EmissionMillis is a token bucket charge's emission interval T in
// float64 ms, exactly as every Store computes it (see bucketParams).
func EmissionMillis(ch *Charge) float64 {
	T, _, _, _ := bucketParams(ch)
	return T
}

// debt is how far (ms) the bucket is from full at now: max(tat, now) - now.
func (c *Counter) debt(now int64) float64 {
	if c.Width != 0 || c.Debt <= 0 {
		return 0
	}
	d := c.Debt - float64(now-c.At)
	if d < 0 {
		return 0
	}
	return d
}

func (c *Counter) setDebt(now int64, d float64) {
	c.clear()
	if d > 0 {
		c.At, c.Debt = now, min(d, maxDebt)
	}
}

// tokenStep is GCRA with tat = now + d:
//
//	d    = max(0, Debt - (now - At))        the debt at now, ms
//	n    = d + Cost*T                        a charge fits when n <= lim
//	x    = d + T                             a check fits when x <= lim
//	d'   = max(0, d - |Cost|*T)              a refund
//	lim  = B*T + eps, eps = B*T/2^32
//	RetryAfter = max(1, ceil(n - lim))       (x for a check)
//
// A charge with Cost > B never fits; its RetryAfter is max(0, ceil(d - eps)).
func (c *Counter) tokenStep(ch *Charge, now int64) (bool, int64) {
	if ch.Amount == 0 {
		return ch.Cost < 0, 0
	}
	T, BT, lim, burst := bucketParams(ch)
	d := c.debt(now)
	cost := max(min(ch.Cost, MaxCount), -MaxCount)
	switch {
	case cost < 0:
		nd := d - float64(float64(-cost)*T)
		c.setDebt(now, nd)
		return true, 0
	case cost == 0:
		x := d + T
		if x <= lim {
			return true, 0
		}
		return false, max(1, int64(min(math.Ceil(x-lim), maxDebt)))
	}
	// The product is rounded on its own (float64(...)) so the compiler
	// cannot fuse it into a multiply-add: Lua rounds it, and the two must
	// agree to the bit at the fit boundary.
	n := d + float64(float64(cost)*T)
	if uint64(cost) > burst {
		if ch.Force {
			c.setDebt(now, n)
		}
		return false, max(0, int64(math.Ceil(d-float64(BT*tbEps))))
	}
	if n <= lim {
		c.setDebt(now, n)
		return true, 0
	}
	if ch.Force {
		c.setDebt(now, n)
	}
	return false, max(1, int64(min(math.Ceil(n-lim), maxDebt)))
}

// tokenReport: Remaining = floor((lim - d) / T) within [0, B], and
// ResetAfter = max(0, ceil(d - eps)), with d the debt at now.
func (c *Counter) tokenReport(ch *Charge, now int64) (uint64, int64) {
	if ch.Amount == 0 {
		return 0, 0
	}
	T, BT, lim, burst := bucketParams(ch)
	d := c.debt(now)
	r := math.Floor((lim - d) / T)
	var remaining uint64
	switch {
	case r >= float64(burst):
		remaining = burst
	case r > 0:
		remaining = uint64(r)
	}
	return remaining, max(0, int64(math.Ceil(d-float64(BT*tbEps))))
}

// live makes c a Concurrency counter holding its live leases at now: the
// state of another algorithm is a fresh counter, and the leases whose
// deadline has come are dropped.
func (c *Counter) live(now int64) {
	if c.Width != 0 || c.Debt > 0 || c.Marked {
		c.clear()
	}
	c.Leases = slices.DeleteFunc(c.Leases, func(l Lease) bool { return l.Deadline <= now })
}

// leaseSpan returns the number of live leases at now, the time (ms) until
// the earliest live deadline (0 with none) and the index of member's live
// lease (-1 when it holds none), without changing c.
func (c *Counter) leaseSpan(now int64, member string) (n uint64, first int64, held int) {
	held = -1
	for i, l := range c.Leases {
		if l.Deadline <= now {
			continue
		}
		if n == 0 || l.Deadline-now < first {
			first = l.Deadline - now
		}
		n++
		if l.Member == member {
			held = i
		}
	}
	return n, first, held
}

// leaseStep is a Concurrency charge: see Charge and the readings above.
func (c *Counter) leaseStep(ch *Charge, now int64) (bool, int64) {
	c.live(now)
	n, first, held := c.leaseSpan(now, ch.Member)
	switch {
	case ch.Cost < 0:
		if held >= 0 {
			c.Leases = slices.Delete(c.Leases, held, held+1)
		}
		return true, 0
	case ch.Cost == 0:
		if n < ch.Amount {
			return true, 0
		}
		return false, first
	}
	fits := held >= 0 || n < ch.Amount
	if !fits && !ch.Force {
		return false, first
	}
	deadline := now + WindowMillis(ch)
	if held >= 0 {
		c.Leases[held].Deadline = deadline
	} else {
		c.Leases = append(c.Leases, Lease{Member: ch.Member, Deadline: deadline})
	}
	if fits {
		return true, 0
	}
	return false, first
}

// markStep is a Once charge: see Charge and the readings above.
func (c *Counter) markStep(ch *Charge, now int64) (bool, int64) {
	switch {
	case ch.Cost < 0:
		c.clear()
		return true, 0
	case c.Marked && c.Until > now:
		return false, 0
	case ch.Cost > 0:
		c.clear()
		c.Marked, c.Until = true, now+WindowMillis(ch)
	}
	return true, 0
}
