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
//     atomic load. With limit.Cells the Combiner shares each scope's step
//     and hold among the replicas (steps.go), so they step alike.
//   - Handler: PUT /v1/pressure to push a score, GET to read the state.
//
// The package imports the standard library and pkg/limit only. Metrics
// are left to the composition root, which reads Combiner.Snapshot and
// Evaluator.Outcome from GaugeFuncs or a Collector:
//
//	tollgate_pressure_score{scope}         Snapshot().Combined
//	tollgate_pressure_level{scope}         Outcome().Level (-1: no step)
//
// Shed decisions are counted by the adapters that answer them, in their
// decision counters' result label (shed, shadow_shed, breaker_open):
// tollgate_rls_decisions_total and tollgate_authz_checks_total.
package pressure

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Step is one shedding threshold; see limit.ShedStep. The type lives in
// pkg/limit so that pkg/config fills it and a limit.Domain holds it.
type Step = limit.ShedStep

// Policy is the shedding configuration of a scope; see limit.Shedding,
// whose Validate checks it. Its Scope field says which pressure a
// request reads (the decision path's business); an Evaluator ignores it.
type Policy = limit.Shedding

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
	// NoBurst: an active step turns bursts down to the policy's burst
	// floor (would, in shadow mode).
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

	mu sync.Mutex // serializes Update and adopt
	st StepState  // the step in force

	out atomic.Pointer[Outcome]
	// fallbacks counts the readings a Combiner with Cells evaluated
	// here alone, the shared step being out of reach.
	fallbacks atomic.Uint64
}

// StepState is a scope's active step and its hold: what an Evaluator
// keeps, and what the replicas share through a Combiner's Cells so that
// they step alike.
type StepState struct {
	// Level is the active step, -1 when none is.
	Level int `json:"level"`
	// Since is when Level was entered or left: the hold runs from it.
	Since time.Time `json:"since"`
	// Pressure is the score Level was computed from.
	Pressure float64 `json:"pressure"`
	// At is when the state was computed; zero before the first reading.
	At time.Time `json:"at"`
	// By is the replica that computed it, when shared.
	By string `json:"by,omitempty"`
}

// NewEvaluator returns an Evaluator of p (which it copies; Validate it
// first: NewEvaluator returns its error) at pressure 0.
func NewEvaluator(p *Policy, clock limit.Clock) (*Evaluator, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	e := &Evaluator{policy: *p, clock: clock, st: StepState{Level: -1, Since: clock.Now()}}
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
	e.publish()
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
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.st = e.next(e.st, pressure, now)
	e.publish()
}

// next is the state that follows prev at pressure (not NaN) and now, by
// Update's rules. It reads only the immutable policy.
func (e *Evaluator) next(prev StepState, pressure float64, now time.Time) StepState {
	pressure = min(max(pressure, 0), 1)
	up, down := -1, -1 // the highest step reached, and held by hysteresis
	for i, s := range e.policy.Steps {
		if pressure >= s.Above {
			up = i
		}
		if pressure >= s.Above-e.policy.Hysteresis {
			down = i
		}
	}
	st := StepState{Level: prev.Level, Since: prev.Since, Pressure: pressure, At: now}
	switch {
	case up > prev.Level:
		st.Level, st.Since = up, now
	case down < prev.Level && now.Sub(prev.Since) >= e.policy.Hold:
		st.Level, st.Since = down, now
	}
	return st
}

// state returns the step in force.
func (e *Evaluator) state() StepState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st
}

// adopt puts st in force as it is (validStep checked it).
func (e *Evaluator) adopt(st StepState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.st = st
	e.publish()
}

// validStep reports whether st can be this policy's state: a level it
// has, a pressure in [0,1], and a hold that starts no later than the
// state was computed.
func (e *Evaluator) validStep(st StepState) bool {
	return st.Level >= -1 && st.Level < len(e.policy.Steps) && st.Pressure >= 0 && st.Pressure <= 1 &&
		!st.At.IsZero() && !st.Since.IsZero() && !st.Since.After(st.At)
}

// Fallbacks counts the readings a Combiner with Cells evaluated on this
// replica alone because the shared step could not be read or written
// (Combiner's doc says when).
func (e *Evaluator) Fallbacks() uint64 { return e.fallbacks.Load() }

// publish stores the outcome of e.st; e.mu is held (or e is not yet
// shared).
func (e *Evaluator) publish() {
	pressure := e.st.Pressure
	o := &Outcome{Level: e.st.Level, Pressure: pressure, Shadow: e.policy.Shadow, Factor: 1}
	if e.st.Level >= 0 {
		l := &e.levels[e.st.Level]
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
