// Package pressure turns pressure, a score in [0,1] per scope ("global",
// and per model where configured), into tier shedding: which tiers are
// admitted now, and how far limits shrink.
//
// The parts, from the outside in:
//   - Signal: a local source of pressure; InFlight is the first, latency
//     and error rate from the access log plug in beside it. A replica's
//     local score is the largest of its signals (Signals).
//   - Combiner: every interval, publishes each scope's local score to a
//     limit.Board (shared by all replicas through the store), reads every
//     live replica's score back, combines them (max or mean), takes the
//     max with a pushed score, and feeds the scope's Evaluator.
//   - Evaluator: applies a Policy (pure data) with hysteresis and a hold
//     time, and keeps the Outcome that the decision path reads with one
//     atomic load.
//   - Handler: PUT /v1/pressure to push a score, GET to read the state.
//
// The package imports the standard library and pkg/limit only. Metrics
// are left to the composition root, which reads Combiner.Snapshot and
// Evaluator.Outcome from GaugeFuncs or a Collector:
//
//	tollgate_pressure_score{scope}         Snapshot().Combined
//	tollgate_pressure_level{scope}         Outcome().Level (-1: no step)
//	tollgate_shed_decisions_total{tier,reason}  counted by the decision
//	                                       path, reason shed|shadow
package pressure

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Step is one shedding threshold. Steps are cumulative: while step i is
// active, every step below it applies too, so a step names only what it
// adds (DESIGN.md's 0.8 step shrinks limits and keeps free shed).
type Step struct {
	// Above is the pressure at which the step starts to apply (Required),
	// in [0,1].
	Above float64
	// Shed are the tiers refused while the step is active (Optional).
	Shed []string
	// AdmitOnly, when set, are the only tiers admitted while the step is
	// active (Optional). Several active steps admit their intersection.
	AdmitOnly []string
	// LimitFactor scales every limit, in (0,1]; 0 means unchanged
	// (Optional). Several active steps give the smallest.
	LimitFactor float64
	// NoBurst turns token bucket bursts off: the decision path gives
	// every token bucket a burst of 1 while it is set (Optional).
	NoBurst bool
	// Continuous scales the step's factor by (1 - pressure), floored at
	// Policy.MinFactor: limit x LimitFactor x (1 - pressure) (Optional).
	Continuous bool
}

// Policy is the shedding configuration of a scope.
type Policy struct {
	// Steps, in ascending order of Above (Optional; none: never shed).
	Steps []Step
	// Hysteresis: an active step is left only once pressure falls below
	// its Above - Hysteresis (Optional, default 0), in [0,1).
	Hysteresis float64
	// Hold: a step is entered as soon as pressure reaches it, and left
	// no sooner than Hold after the last change of step (Optional,
	// default 0). So the admitted tiers loosen at most once per Hold.
	Hold time.Duration
	// Shadow reports what the policy would shed and applies nothing
	// (Optional).
	Shadow bool
	// MinFactor floors a Continuous step's factor (Required with a
	// Continuous step), in (0,1].
	MinFactor float64
}

// Validate checks the policy; its errors name the field, as in
// `steps[1].above: 0.6 is not above steps[0].above 0.7`.
func (p *Policy) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	in01 := func(v float64) bool { return !math.IsNaN(v) && v >= 0 && v <= 1 }
	continuous := false
	for i, s := range p.Steps {
		switch {
		case !in01(s.Above):
			bad("steps[%d].above: %v is not in [0,1]", i, s.Above)
		case i > 0 && s.Above <= p.Steps[i-1].Above:
			bad("steps[%d].above: %v is not above steps[%d].above %v", i, s.Above, i-1, p.Steps[i-1].Above)
		}
		if !in01(s.LimitFactor) {
			bad("steps[%d].limit_factor: %v is not in (0,1] (0: unchanged)", i, s.LimitFactor)
		}
		checkTiers := func(field string, tiers []string) {
			for j, t := range tiers {
				if t == "" {
					bad("steps[%d].%s[%d]: empty tier", i, field, j)
				} else if slices.Index(tiers, t) < j {
					bad("steps[%d].%s[%d]: tier %q listed twice", i, field, j, t)
				}
			}
		}
		checkTiers("shed", s.Shed)
		checkTiers("admit_only", s.AdmitOnly)
		if len(s.Shed) == 0 && len(s.AdmitOnly) == 0 && (s.LimitFactor == 0 || s.LimitFactor == 1) && !s.NoBurst && !s.Continuous {
			bad("steps[%d]: the step changes nothing (set shed, admit_only, limit_factor, burst or continuous)", i)
		}
		continuous = continuous || s.Continuous
	}
	if math.IsNaN(p.Hysteresis) || p.Hysteresis < 0 || p.Hysteresis >= 1 {
		bad("hysteresis: %v is not in [0,1)", p.Hysteresis)
	}
	if p.Hold < 0 {
		bad("hold: %v is negative", p.Hold)
	}
	switch {
	case continuous && (math.IsNaN(p.MinFactor) || p.MinFactor <= 0 || p.MinFactor > 1):
		bad("min_factor: %v is not in (0,1], as a continuous step needs", p.MinFactor)
	case !in01(p.MinFactor):
		bad("min_factor: %v is not in [0,1]", p.MinFactor)
	}
	return errors.Join(errs...)
}

// Outcome is what the active step does. It is immutable; Evaluator hands
// out copies.
type Outcome struct {
	// Level is the index of the active step, -1 when none is.
	Level int
	// Pressure is the score the outcome was computed for.
	Pressure float64
	// Shadow: the policy reports and does not apply (Admits is always
	// true, Applied gives 1 and false).
	Shadow bool
	// Factor is what the active steps scale limits by, in (0,1]; 1 with
	// no step. In shadow mode it is what would apply.
	Factor float64
	// NoBurst: an active step turns bursts off (would, in shadow mode).
	NoBurst bool

	shed       []string
	admitOnly  []string
	restricted bool // admitOnly applies (it may be empty: nothing admitted)
}

// Sheds reports whether the active steps refuse tier, shadow or not.
func (o *Outcome) Sheds(tier string) bool {
	if o.restricted && !slices.Contains(o.admitOnly, tier) {
		return true
	}
	return slices.Contains(o.shed, tier)
}

// Admits reports whether a request of tier is admitted: always in shadow
// mode (where Sheds says what would be refused).
func (o *Outcome) Admits(tier string) bool { return o.Shadow || !o.Sheds(tier) }

// Applied is the limit factor and burst switch to enforce: 1 and false in
// shadow mode.
func (o *Outcome) Applied() (factor float64, noBurst bool) {
	if o.Shadow {
		return 1, false
	}
	return o.Factor, o.NoBurst
}

// level is the precomputed effect of steps 0..i.
type level struct {
	shed       []string
	admitOnly  []string
	restricted bool
	factor     float64 // smallest static factor, 1 with none
	contBase   float64 // smallest Continuous step's factor; 0: no continuous step
	noBurst    bool
}

// Evaluator applies a Policy to a stream of pressure scores. Update and
// Outcome are safe for concurrent use; Outcome is one atomic load.
type Evaluator struct {
	policy Policy
	levels []level
	clock  limit.Clock

	mu    sync.Mutex // serializes Update
	cur   int        // active step, -1 none
	since time.Time  // when cur was entered or left

	out atomic.Pointer[Outcome]
}

// NewEvaluator returns an Evaluator of p (which it copies; Validate it
// first: NewEvaluator returns its error) at pressure 0.
func NewEvaluator(p *Policy, clock limit.Clock) (*Evaluator, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	e := &Evaluator{policy: *p, clock: clock, cur: -1, since: clock.Now()}
	e.policy.Steps = slices.Clone(p.Steps)
	var acc level
	acc.factor = 1
	for _, s := range e.policy.Steps {
		for _, t := range s.Shed {
			if !slices.Contains(acc.shed, t) {
				acc.shed = append(slices.Clip(acc.shed), t)
			}
		}
		if len(s.AdmitOnly) > 0 {
			if acc.restricted {
				acc.admitOnly = slices.DeleteFunc(slices.Clone(acc.admitOnly), func(t string) bool { return !slices.Contains(s.AdmitOnly, t) })
			} else {
				acc.admitOnly, acc.restricted = slices.Clone(s.AdmitOnly), true
			}
		}
		f := s.LimitFactor
		if f == 0 {
			f = 1
		}
		if s.Continuous {
			if acc.contBase == 0 || f < acc.contBase {
				acc.contBase = f
			}
		} else {
			acc.factor = min(acc.factor, f)
		}
		acc.noBurst = acc.noBurst || s.NoBurst
		e.levels = append(e.levels, acc)
	}
	e.publish(0)
	return e, nil
}

// Update feeds the current pressure (clamped to [0,1]; NaN is ignored).
// A step is entered at once when pressure reaches its Above; the active
// step is left for a lower one only when pressure is below its Above -
// Hysteresis and Hold has passed since the last change. Call it on every
// reading, not only on changes: leaving a step after Hold needs one.
func (e *Evaluator) Update(pressure float64) {
	if math.IsNaN(pressure) {
		return
	}
	pressure = min(max(pressure, 0), 1)
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	up, down := -1, -1 // the highest step reached, and held by hysteresis
	for i, s := range e.policy.Steps {
		if pressure >= s.Above {
			up = i
		}
		if pressure >= s.Above-e.policy.Hysteresis {
			down = i
		}
	}
	switch {
	case up > e.cur:
		e.cur, e.since = up, now
	case down < e.cur && now.Sub(e.since) >= e.policy.Hold:
		e.cur, e.since = down, now
	}
	e.publish(pressure)
}

// publish stores the outcome of e.cur at pressure; e.mu is held (or e is
// not yet shared).
func (e *Evaluator) publish(pressure float64) {
	o := &Outcome{Level: e.cur, Pressure: pressure, Shadow: e.policy.Shadow, Factor: 1}
	if e.cur >= 0 {
		l := &e.levels[e.cur]
		o.shed, o.admitOnly, o.restricted, o.NoBurst = l.shed, l.admitOnly, l.restricted, l.noBurst
		o.Factor = l.factor
		if l.contBase > 0 {
			o.Factor = min(o.Factor, max(e.policy.MinFactor, l.contBase*(1-pressure)))
		}
	}
	e.out.Store(o)
}

// Outcome returns the active step's effect.
func (e *Evaluator) Outcome() Outcome { return *e.out.Load() }
