package limit

import (
	"context"
	"time"
)

// Charge is one limit applied to one counter in a decision.
//
// The semantics below are the contract every Store keeps; the shared
// conformance suite in storetest checks them. All arithmetic is in integer
// milliseconds except the token bucket, whose state is a float64 of
// milliseconds so Go and Redis Lua (whose numbers are doubles) agree.
//
// Cost > 0 charges, Cost == 0 checks without charging, Cost < 0 refunds.
//
// Time never goes backwards for a key. Replicas' clocks differ by a few
// milliseconds, and a decision can reach the store after a later one; a
// caller whose now is behind must neither miss the bucket a caller ahead
// of it filled, nor have the oldest bucket it still counts deleted under
// it. So each window key keeps a high-water bucket index hw (the largest
// cur any caller has used on it, kept with the counts and written on every
// Apply that touches the key, checks included), and cur below is
// max(floor(now/w), hw).
//
// Sliding window (Buckets = N, Window = W ms): bucket width w = ceil(W/N),
// M = ceil(W/w), cur = max(floor(now/w), hw). usage = the sum of bucket counts with
// index in [cur-M, cur]. Counting M+1 buckets makes the promise hold for
// every interval of length W, wherever it starts: an interval of length W
// touches at most M+1 buckets. A charge fits when usage+Cost <= Amount and
// then adds Cost to bucket cur; a check fits when usage <= Amount and
// Amount > 0: it asks whether the counter is over its limit, as
// envoyproxy/ratelimit answers hits_addend 0, so at the limit it fits with
// Remaining 0 (a limit of 0 refuses everything, checks too). A refund
// subtracts from the newest buckets first, each floored at zero. State
// older than cur-M is dropped. Remaining = Amount-usage (after the charge),
// floored at 0. ResetAfter = the time until the newest nonzero counted
// bucket b leaves the count: (b+M+1)*w - now, 0 with no usage. RetryAfter
// (only when the charge does not fit) = the earliest time at which, with
// the oldest buckets dropping out one by one at (b+M+1)*w, the charge
// would fit; when Cost > Amount it never fits and RetryAfter = ResetAfter.
// TTL = (cur+M+1)*w - now: until the newest bucket leaves the count.
//
// Fixed window (Window = W ms): the sliding window with one bucket of
// width W and M = 0, so usage is the count of window cur (aligned to the
// Unix epoch, as envoyproxy/ratelimit counts, and never behind hw).
// ResetAfter and RetryAfter are both the time to the end of window cur,
// (cur+1)*W - now, even with no usage. TTL = the same.
//
// Token bucket (GCRA): T = W/Amount ms as float64, B = Burst (0 means
// Amount), state tat (absent = now; stored as integer ms plus a float64
// debt, with a tolerance of B*T/2^32: see Counter for why and for the exact
// operations every Store repeats to the bit). t = max(tat, now).
// A charge: n = t + Cost*T fits when n - now <= B*T, then tat = n.
// A check fits when t + T - now <= B*T. A refund: tat = max(now, t - |Cost|*T).
// Remaining = floor((B*T - (tat' - now)) / T) with tat' the state after
// the decision, floored at 0. ResetAfter = tat' - now (the time until the
// bucket is full again). RetryAfter = n - now - B*T, rounded up to a whole
// millisecond (for a check, t + T - now - B*T); when Cost > B it never fits
// and RetryAfter = ResetAfter. TTL = ceil(tat' - now), at least 1 ms.
//
// Refunds at a time (At set, window algorithms): the refund is taken first
// from the bucket holding At, floor(At/w), as far as that bucket is still
// counted and holds anything, then from the newest buckets as above. This
// gives a reservation's unused part back to the window it was reserved in.
// The token bucket and fixed window ignore At (a fixed window's refund
// comes from window cur, the only one counted).
//
// Concurrency (Amount = the cap, Window = the lease): the state is a set
// of members, each with a deadline; members whose deadline <= now are
// gone. Cost 1 with Member m: fits when m is already held or fewer than
// Amount members are live; then m's deadline becomes now + Window. Cost -1
// releases m (always fits; releasing an absent member is a no-op). Cost 0
// fits when fewer than Amount are live. Remaining = Amount - live members,
// floored at 0; ResetAfter = the time until the earliest live deadline (0
// when none); RetryAfter = the same as ResetAfter. TTL = the latest
// deadline - now. Member is required for Cost != 0.
//
// Once (Window = how long the mark lives): Cost 1 fits when the key holds
// no live mark, and then sets the mark until now + Window. A Once charge
// that does not fit voids the whole Apply: nothing is kept, refunds and
// Force charges included, and admitted is false. Reconciling a
// reservation puts its refund behind a Once mark, so a report delivered
// twice is counted once. Remaining, ResetAfter and RetryAfter are 0 for
// Once.
//
// Fair share (Fair.Policy set, Cost >= 0, not Force, and a sliding
// window, fixed window or token bucket; on any other charge Fair is
// ignored): the state is a FairState at FairStateKey(Key). In charge
// order, before the counter steps, FairState.Gate(policy, now ms, member,
// weight, Cost, room) runs with room = the counter's Remaining at that
// point (after the earlier charges of the Apply). The charge fits only
// when the gate passes and the counter fits it. A charge the gate stops
// leaves the counter unstepped (its hw still moves) and reports
// Fits=false, the counter's Remaining and ResetAfter, and RetryAfter =
// the soonest a share can free: the end of the current bucket (sliding
// window), the end of window cur (fixed window), ceil(T) (token bucket),
// at least 1 ms. Once admitted is known, every gated charge records in
// the same atomic step, in charge order: FairDenied when the charge itself
// did not fit (gate or counter; Shadow charges too), else FairAdmitted
// when the decision is admitted, else FairElsewhere. The state is written
// even when the decision is denied; an Apply a Once charge voids writes
// none. TTL of the state = Backlog + Window, renewed by every record.
// storetest.RunFair checks all of it against a reference.
//
// Durations are reported rounded up to whole milliseconds.
type Charge struct {
	// Key is the counter's store key from Key; it carries a Redis hash tag.
	Key       string
	Algorithm Algorithm
	// Amount is the limit per Window.
	Amount uint64
	Window time.Duration
	// Burst is the token bucket capacity (0 means Amount).
	Burst uint64
	// Buckets is the sliding window precision (0 means DefaultBuckets).
	Buckets uint16
	Cost    int64
	// Shadow charges report over-limit without blocking the decision.
	Shadow bool
	// Force charges record cost already spent (a usage report sent after
	// the response): a positive Force charge is kept whatever the usage,
	// even past the limit and even when the decision is denied, and it
	// never blocks the decision. Its Result says whether it fit.
	Force bool
	// At, for a refund on a window (Unix ms; 0 means unset), names the
	// bucket to refund first: the one the refunded cost was charged in.
	At int64
	// Member names the holder of a Concurrency lease (the request ID).
	Member string
	// Fair, when Fair.Policy is set, makes this charge's counter a limit
	// that fairness members share by weight (the Fair share paragraph above).
	Fair FairCharge
}

// Result is what a Store says about one Charge. Remaining and ResetAfter
// describe the counter after Apply: a charge that was not kept is not in
// them.
type Result struct {
	// Fits reports whether this charge alone was within its limit. For a
	// refund it is always true.
	Fits       bool
	Remaining  uint64
	ResetAfter time.Duration
	// RetryAfter is set when Fits is false.
	RetryAfter time.Duration
}

// Store applies a decision's charges at one instant, all or nothing.
//
// Charges are evaluated in order, each seeing the ones before it on the
// same key. When any charge with Cost >= 0 that is neither Shadow nor
// Force does not fit, no positive charge is kept (refunds and Force
// charges still apply) and Apply returns admitted == false. Otherwise
// every positive charge that fits is kept; a Shadow charge that does not
// fit is reported and not kept.
// res must have len(charges) elements; Apply fills it. Apply must not keep
// charges or res once it returns: the Limiter reuses them.
type Store interface {
	Apply(ctx context.Context, now time.Time, charges []Charge, res []Result) (admitted bool, err error)
}

// Clock is the time source; tests inject a fake one.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
