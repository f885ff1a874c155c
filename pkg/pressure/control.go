package pressure

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The control law of the overload controller (limit.Control): a pure
// function from one upstream's state and a reading to its next state, so
// that it is tested on a fake clock and every replica computes it alike.
// Controller is the I/O around it.
//
// Every tick, with I the requests in flight cluster-wide, C the capacity,
// T = target x C, the offered rate lambda_t of each tier and the admitted
// rate alpha of all tiers over the window:
//
//   - L = mean(I) / theta estimates the latency by Little's law, with
//     theta the completion rate (alpha less the growth of I) and both
//     measured over the window (smoothed; the last estimate stands while
//     nothing completes or is in flight);
//   - R = max(T / L, theta) - max(0, mean(I) - T) / window: the rate
//     the upstream takes with T in flight (what it completes, scaled to
//     T, and at least what it completes), less what drains the excess
//     over T within a window;
//   - R goes to the tiers by priority: the tiers not sheddable get their
//     demand first, then the sheddable ones from the highest; tier t is
//     then shed by 1 - alloc_t / lambda_t, rounded up to the quantum;
//   - a fraction rises at once; it falls only when I <= T, Dwell has
//     passed since the last change and it is at least a quantum above
//     what is wanted at 80% of R (or nothing is wanted): by one quantum,
//     four dwells after the last change, while what is wanted is above
//     half of it, and else to what is
//     wanted but no lower than half of itself (rounded down to the
//     quantum; a half of two quanta or less does not hold it), so a
//     spike's end re-admits in two or three moves (Little's law extrapolates a light load's
//     latency to T, and a GPU batch serves each request more slowly the
//     fuller it is: the headroom keeps a noisy or optimistic R from
//     loosening into an overload).
//
// The drain term stands in for "push the lowest tier a quantum further
// every tick the queue builds": pushing per tick would count a change
// every tick until the queue drained, far past the four a minute the
// laws allow, and overshoot by the queue's drain time. (The drain is
// over two windows: over one it overshot in TestLawHoldsASpike.) T / L alone
// counts the queue twice above T, and theta alone lags a spike by a
// window; each overshot (shedding all of free at a spike's start, then
// loosening it a dwell later: two changes more, in TestLawHoldsASpike).
// The 10% headroom of loosening keeps a fraction on a quantum's edge from
// rising and falling every dwell.

// ControlState is one upstream's controller state, the record replicas
// share through limit.Cells.
type ControlState struct {
	// Fractions are the shed fractions of the Control's Sheddable tiers,
	// in its order, each a multiple of the quantum in [0,1].
	Fractions []float64 `json:"f"`
	// Changed is when a fraction last changed.
	Changed time.Time `json:"c"`
	// Changes counts the changes since the record was made.
	Changes uint64 `json:"n"`
	// At is when the state was computed; zero: never.
	At time.Time `json:"at"`
	// InFlight is the count it was computed from.
	InFlight int64 `json:"i"`
	// Counts are the in-flight counts of the last recent ticks and the
	// one before, newest last: the mean of the recent ones is the I of
	// Little's law, over the span the rates are measured on, and the
	// first and last give what stayed in flight. An instant count would swing the
	// estimate with every burst; a longer or otherwise weighted mean lags
	// differently from the rate and makes L jump as a queue drains.
	Counts []int64 `json:"h"`
	// Latency is the Little's law estimate, in seconds; 0: none yet.
	// Mean and Done are the mean in flight and the completion rate it
	// was computed from.
	Latency float64 `json:"l"`
	Mean    float64 `json:"m"`
	Done    float64 `json:"d"`
	// Rate is R, the admission rate aimed at, requests/s; +Inf is written
	// as -1 (no estimate yet).
	Rate float64 `json:"r"`
	// Since is when the record began: rates are measured over a whole
	// window only after it, so no latency is estimated before.
	Since time.Time `json:"s"`
	// By names the replica that computed it.
	By string `json:"by,omitempty"`
}

// ControlReading is what one tick measured.
type ControlReading struct {
	// InFlight is the requests in flight cluster-wide.
	InFlight int64
	// Offered is, per tier, the requests/s that reached the decision,
	// shed or not (Rates.Offered); Admitted is the requests/s admitted,
	// of all tiers, over the recent ticks (half a window).
	Offered  map[string]float64
	Admitted float64
}

// law is a Control's law for one upstream.
type law struct {
	cfg      limit.Control // with defaults
	capacity int64
}

// loosenHeadroom is the share of the rate R a loosening may count on.
const loosenHeadroom = 0.8

// creepDwells is how many dwells a fraction that is still wanted near
// where it is waits before it falls by a quantum: probing for capacity
// during a sustained overload is slow, re-admitting once demand has
// fallen is not.
const creepDwells = 4

// eps absorbs float error in comparisons of quantised fractions.
const eps = 1e-9

func newLaw(c limit.Control, capacity int64) (law, error) {
	c = c.WithDefaults()
	if f := c.Check(); len(f) > 0 {
		return law{}, fmt.Errorf("control: %w", f[0])
	}
	if capacity < 1 {
		return law{}, fmt.Errorf("control: capacity %d is not at least 1", capacity)
	}
	return law{cfg: c, capacity: capacity}, nil
}

// recentTicks is how many ticks the latency estimate spans: a window.
func (w law) recentTicks() int {
	return max(2, int(w.cfg.Window/w.cfg.Interval))
}

// target is T, the in-flight aimed at.
func (w law) target() float64 { return w.cfg.Target * float64(w.capacity) }

// next is the state after prev given reading r at now.
func (w law) next(prev ControlState, r ControlReading, now time.Time) ControlState {
	prev = w.afterGap(prev, now)
	out, cur := w.carry(prev, r, now)
	w.measure(&out, r, now)
	rate := w.rate(&out)
	out.Rate = rate
	over := float64(max(r.InFlight, 0)) > w.target()
	if w.tighten(&out, cur, w.allocate(rate, r.Offered), over) {
		out.Changed, out.Changes = now, out.Changes+1
		return out
	}
	if over || now.Sub(prev.Changed) < w.cfg.Dwell {
		return out
	}
	// A fraction falls only to what is wanted at loosenHeadroom of the
	// rate, and a quantum or more: on a quantum's edge it neither falls
	// and rises every dwell nor falls into an overload a noisy rate
	// estimate did not see.
	if w.loosen(&out, cur, w.allocate(rate*loosenHeadroom, r.Offered), now.Sub(prev.Changed)) {
		out.Changed, out.Changes = now, out.Changes+1
	}
	return out
}

// afterGap is prev with its measurement restarted if no state was
// computed for a window (the store was down): the in-flight counts kept
// are of another time, and flights begun meanwhile were never counted,
// while the rates read now hold their admissions. Measured together they
// read a latency far too high (0.41 s for 0.25 s after 20 s without
// Redis, which shed half of free at 24 of 32 in flight). The measurement
// starts again, as at start-up; the last estimate stands until it has a
// window.
func (w law) afterGap(prev ControlState, now time.Time) ControlState {
	if !prev.At.IsZero() && now.Sub(prev.At) > w.cfg.Window {
		prev.Counts, prev.Since = nil, time.Time{}
	}
	return prev
}

// carry starts the state after prev: its fractions, changes and estimate
// carried over, reading r's count appended to the recent ones. cur is
// prev's fractions, one for each Sheddable tier.
func (w law) carry(prev ControlState, r ControlReading, now time.Time) (out ControlState, cur []float64) {
	cur = prev.Fractions
	if n := len(w.cfg.Sheddable); len(cur) != n {
		cur = make([]float64, n)
	}
	out = ControlState{
		Fractions: slices.Clone(cur), Changed: prev.Changed, Changes: prev.Changes,
		At: now, InFlight: r.InFlight, Latency: prev.Latency, Mean: prev.Mean, Done: prev.Done, Since: prev.Since,
	}
	if out.Since.IsZero() {
		out.Since = now
	}
	k := w.recentTicks()
	out.Counts = append(slices.Clone(prev.Counts), max(r.InFlight, 0))
	if len(out.Counts) > k+1 {
		out.Counts = out.Counts[len(out.Counts)-k-1:]
	}
	return out, cur
}

// measure updates out's mean in flight, completion rate and latency
// estimate from its counts and r's admitted rate.
func (w law) measure(out *ControlState, r ControlReading, now time.Time) {
	k := w.recentTicks()
	// Before a whole window of counts, the admitted rate reads low and
	// the latency high: an estimate then would shed at start-up. With
	// nothing completed the last estimate stands.
	if len(out.Counts) != k+1 || now.Sub(out.Since) < w.cfg.Window {
		return
	}
	var sum int64
	for _, c := range out.Counts[1:] {
		sum += c
	}
	mean := float64(sum) / float64(k)
	// Completions are admissions less what stayed in flight: by
	// Little's law over admissions, L would soar the moment
	// shedding cuts them while a queue still drains.
	span := float64(k) * w.cfg.Interval.Seconds()
	done := r.Admitted - float64(out.Counts[k]-out.Counts[0])/span
	out.Done, out.Mean = max(done, 0), mean
	if done > 0 && mean > 0 {
		// Smoothed over about two ticks: in the tick a spike's
		// queue lands, the mean already holds it and the completions
		// do not yet, and L would read as if the upstream had slowed.
		l := mean / done
		if out.Latency > 0 {
			l = out.Latency + min(1, 2*w.cfg.Interval.Seconds()/w.cfg.Window.Seconds())*(l-out.Latency)
		}
		out.Latency = l
	}
}

// rate is R, the admission rate aimed at given out's estimate; +Inf while
// there is none.
func (w law) rate(out *ControlState) float64 {
	t := w.target()
	switch {
	case out.Done == 0 && out.Mean > t:
		// More than T in flight and nothing completes: the upstream
		// takes nothing (or every completion is lost and the leases
		// will tell).
		return 0
	case out.Latency > 0:
		// T / L is what the upstream completes now, scaled to T in
		// flight; not less than what it completes now, as a smoothed L
		// can still hold a drained queue's wait, and a completion rate
		// over the window still holds the time before a spike. Above T
		// the excess drains within a window.
		rate := max(t/out.Latency, out.Done) - max(0, out.Mean-t)/(2*w.cfg.Window.Seconds())
		return max(rate, 0)
	}
	return math.Inf(1)
}

// tighten raises at once each fraction of out that want is above cur,
// and says whether one rose. over says a queue is building (more than T
// in flight).
func (w law) tighten(out *ControlState, cur, want []float64, over bool) bool {
	tightened := false
	for i := range want {
		if want[i] > cur[i]+eps {
			f := want[i]
			if over {
				// A queue is building, which the drain term sees only
				// as the window's mean catches up: a quantum more now
				// is one change, where catching up tick by tick is two
				// or three (and one more to loosen a dwell later).
				f = min(1, f+w.cfg.Quantum)
			}
			out.Fractions[i], tightened = f, true
		}
	}
	return tightened
}

// loosen lowers the fractions of out that are a quantum or more above
// want, the fractions wanted at loosenHeadroom of the rate, and says
// whether one fell; since is the time since the last change.
func (w law) loosen(out *ControlState, cur, want []float64, since time.Duration) bool {
	q := w.cfg.Quantum
	loosened := false
	for i := range want {
		if want[i] > 0 && want[i]+q > cur[i]+eps {
			continue
		}
		if want[i] >= cur[i]-eps {
			continue
		}
		// To what is wanted, but no less than half of itself (rounded
		// down to the quantum; a half of two quanta or less does not
		// hold it), so a spike's end re-admits in two or three moves.
		half := floorQ(cur[i]/2, q)
		if half <= 2*q+eps {
			half = 0
		}
		f := max(want[i], half)
		if want[i] > half {
			// Still wanted near where it is (the spike goes on): one
			// quantum a move, and no sooner than creepDwells dwells
			// after the last change. A quantum of a spiking tier is a
			// large share of capacity, and R extrapolated from a light
			// load reads high (a batch serves faster the emptier it is):
			// such a probe may run into an overload and tighten back,
			// two changes, which must stay rare.
			if since < creepDwells*w.cfg.Dwell {
				continue
			}
			f = max(want[i], cur[i]-q)
		}
		if f < cur[i]-eps {
			out.Fractions[i], loosened = f, true
		}
	}
	return loosened
}

// Rates are one tier's counts at a tick: over the window (Win requests
// in WinSecs), over its recent half (Half in HalfSecs) and over the last
// tick (Last in LastSecs).
type Rates struct {
	Win, WinSecs   float64
	Half, HalfSecs float64
	Last, LastSecs float64
}

// Offered is the tier's offered rate: the window's mean, unless the last
// tick's count is more than five Poisson deviations off what that mean
// predicts (a spike's start or end: the last tick's rate), or the recent
// half's is as far below it (a spike's end: the half's rate).
// The window alone would take a window to see a spike come or go, in as
// many changes; the last tick alone, or the larger of the two, would
// shed on noise (a tick of 9 requests at 38/s is one deviation off in
// three). The recent half sees an end the last tick no longer does while
// the window still holds the spike.
func (r Rates) Offered() float64 {
	if r.WinSecs <= 0 {
		return 0
	}
	mean := r.Win / r.WinSecs
	far := func(n, secs float64) float64 {
		if secs <= 0 {
			return 0
		}
		expect := mean * secs
		if d := n - expect; math.Abs(d) > 5*math.Sqrt(max(expect, 1)) {
			return d
		}
		return 0
	}
	switch {
	case far(r.Last, r.LastSecs) != 0:
		return r.Last / r.LastSecs
	case far(r.Half, r.HalfSecs) < 0:
		return r.Half / r.HalfSecs
	}
	return mean
}

// allocate gives rate to the tiers by priority and returns the shed
// fraction each sheddable tier needs, rounded up to the quantum.
func (w law) allocate(rate float64, offered map[string]float64) []float64 {
	want := make([]float64, len(w.cfg.Sheddable))
	if math.IsInf(rate, 1) {
		return want
	}
	left := rate
	for tier, l := range offered {
		if !slices.Contains(w.cfg.Sheddable, tier) && l > 0 {
			left -= l
		}
	}
	for i := len(w.cfg.Sheddable) - 1; i >= 0; i-- {
		l := offered[w.cfg.Sheddable[i]]
		if !(l > 0) {
			continue
		}
		alloc := min(max(left, 0), l)
		left -= alloc
		want[i] = ceilQ(1-alloc/l, w.cfg.Quantum)
	}
	return want
}

// ceilQ rounds f in [0,1] up to a multiple of q.
func ceilQ(f, q float64) float64 {
	if f <= eps {
		return 0
	}
	return min(1, math.Ceil(f/q-eps)*q)
}

// floorQ rounds f in [0,1] down to a multiple of q.
func floorQ(f, q float64) float64 { return max(0, math.Floor(f/q+eps)*q) }

// fraction is tier's shed fraction in s, 0 for a tier not sheddable.
func (w law) fraction(s *ControlState, tier string) float64 {
	i := slices.Index(w.cfg.Sheddable, tier)
	if i < 0 || i >= len(s.Fractions) {
		return 0
	}
	return s.Fractions[i]
}

// encodeState is the Cells record of s.
func encodeState(s ControlState) []byte {
	if math.IsInf(s.Rate, 0) || math.IsNaN(s.Rate) {
		s.Rate = -1
	}
	b, _ := json.Marshal(s) // no value of ControlState fails to encode
	return b
}

// errBadState is a Cells record that is not a ControlState of this law.
var errBadState = errors.New("control: bad state record")

// decodeState reads a record encodeState wrote for a law with n
// sheddable tiers; anything else is errBadState, and a replica then
// computes afresh rather than shed by a corrupt record.
func decodeState(b []byte, n int) (ControlState, error) {
	var s ControlState
	if len(b) == 0 || len(b) > 8<<10 {
		return s, errBadState
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return ControlState{}, fmt.Errorf("%w: %w", errBadState, err)
	}
	if len(s.Fractions) != n || s.At.IsZero() || !(s.Latency >= 0) || !(s.Mean >= 0) || !(s.Done >= 0) || s.InFlight < 0 || len(s.Counts) > 200 || slices.ContainsFunc(s.Counts, func(c int64) bool { return c < 0 }) {
		return ControlState{}, errBadState
	}
	for _, f := range s.Fractions {
		if math.IsNaN(f) || f < 0 || f > 1 {
			return ControlState{}, errBadState
		}
	}
	if s.Rate < 0 {
		s.Rate = math.Inf(1)
	}
	return s, nil
}
