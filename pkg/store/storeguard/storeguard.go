// Package storeguard is a circuit in front of a limit.Store (the Redis
// store): when the store keeps failing, decisions stop waiting for it.
//
// Closed, every call goes through. A run of consecutive errors, timeouts
// included, opens it once it has Failures errors and has lasted FailFor,
// from the first error to the latest. A store that is down or blackholed
// fails every call and opens it within about FailFor. A process that
// stalls (a CPU-throttled pod is paused for tens of milliseconds at a
// time) makes every call in flight time out at once, when it resumes:
// that run is long in calls but short in time, says nothing about the
// store, and must not turn every decision degraded for a whole backoff;
// the calls after the stall succeed and end the run. Open, Apply fails at
// once with ErrOpen, without calling the store, so the Limiter's
// store_failure answers in microseconds rather than after the store
// timeout. After a backoff
// (MinBackoff, doubling on each failed probe up to MaxBackoff) the next
// call is let through as the one probe (half-open; calls meanwhile are
// refused); its success closes the circuit, its failure opens it again.
// So a store that comes back serves decisions again within about
// MaxBackoff.
//
// A call the caller canceled says nothing about the store and changes
// nothing. A deadline that passes does count, as a timeout: the Limiter
// bounds each call by its store timeout, and a store slower than that is
// the failure this guards against.
package storeguard

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// ErrOpen is Apply's error while the circuit is open.
var ErrOpen = errors.New("store circuit open")

// State is the circuit's state; the values are the
// tollgate_store_circuit_state gauge's.
type State int32

const (
	Closed   State = 0
	HalfOpen State = 1
	Open     State = 2
)

func (s State) String() string {
	switch s {
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return "closed"
}

// Defaults of Options.
const (
	DefaultFailures   = 3
	DefaultFailFor    = 50 * time.Millisecond
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 250 * time.Millisecond
)

// Options tune a Guard; zero values take the defaults.
type Options struct {
	// Failures is how many consecutive errors, timeouts included, open
	// the circuit, once they span FailFor (Optional, default 3).
	Failures int
	// FailFor is how long a run of consecutive errors must last, from the
	// first to the latest, to open the circuit (Optional, default 50ms;
	// negative: no minimum). It is longer than the stalls a throttled pod
	// sees often, and a few store timeouts long.
	FailFor time.Duration
	// OnChange, when set, is told of every change of state, with the
	// error that opened the circuit (nil otherwise). It is called after
	// the change, outside the Guard's lock, and must not block.
	OnChange func(from, to State, err error)
	// MinBackoff is how long the circuit stays open before the first
	// probe (Optional, default 100ms); each failed probe doubles it, up to
	// MaxBackoff (Optional, default 250ms: a store that comes back serves
	// decisions again within about that, and a probe that fails costs a
	// call that fails fast while the Redis client knows the store down).
	MinBackoff, MaxBackoff time.Duration
	// Clock is the time source (Optional, default the wall clock).
	Clock limit.Clock
}

// Guard is a limit.Store that opens a circuit on its inner store.
type Guard struct {
	inner limit.Store
	opt   Options

	mu        sync.Mutex
	state     State
	since     time.Time     // when state began
	fails     int           // consecutive errors while closed
	firstFail time.Time     // when the first of them was seen
	backoff   time.Duration // the current open period
	openUntil time.Time     // when open: the earliest probe
	probing   bool          // half-open: the probe is in flight

	published atomic.Int32 // state, for State without the lock
	refused   atomic.Uint64
}

var _ limit.Store = (*Guard)(nil)

// New returns a closed Guard around inner.
func New(inner limit.Store, o Options) *Guard {
	if o.Failures <= 0 {
		o.Failures = DefaultFailures
	}
	switch {
	case o.FailFor == 0:
		o.FailFor = DefaultFailFor
	case o.FailFor < 0:
		o.FailFor = 0
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(o.MinBackoff, DefaultMaxBackoff)
	}
	if o.Clock == nil {
		o.Clock = limit.SystemClock{}
	}
	return &Guard{inner: inner, opt: o, backoff: o.MinBackoff, since: o.Clock.Now()}
}

// State is the circuit's state now.
func (g *Guard) State() State { return State(g.published.Load()) }

// Since returns the state now and when the circuit entered it.
func (g *Guard) Since() (State, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state, g.since
}

// Retry lets the next call probe at once when the circuit is open: the
// store is known to answer again (the Redis client's own probe saw it
// back), so waiting out the backoff, up to MaxBackoff, would only delay
// recovery. The probe still decides: if it fails, the circuit opens again
// with the next backoff.
func (g *Guard) Retry() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state == Open {
		g.openUntil = g.opt.Clock.Now()
	}
}

// Refused counts the calls refused while the circuit was open.
func (g *Guard) Refused() uint64 { return g.refused.Load() }

// Apply calls the inner store unless the circuit is open.
func (g *Guard) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	probe, ok, from := g.enter()
	if !ok {
		g.refused.Add(1)
		return false, ErrOpen
	}
	if probe {
		g.changed(from, HalfOpen, nil)
	}
	admitted, err := g.inner.Apply(ctx, now, charges, res)
	if from, to, changed := g.exit(ctx, probe, err); changed {
		g.changed(from, to, err)
	}
	return admitted, err
}

// changed tells OnChange of a change, with the error when it opened.
func (g *Guard) changed(from, to State, err error) {
	if g.opt.OnChange == nil {
		return
	}
	if to != Open {
		err = nil
	}
	g.opt.OnChange(from, to, err)
}

// enter decides whether a call may go through, and whether it is the
// probe; from is the state before a probe turned the circuit half-open.
func (g *Guard) enter() (probe, ok bool, from State) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case Closed:
		return false, true, Closed
	case Open:
		if g.opt.Clock.Now().Before(g.openUntil) {
			return false, false, Open
		}
		g.set(HalfOpen)
		g.probing = true
		return true, true, Open
	default: // half-open
		if g.probing {
			return false, false, HalfOpen
		}
		g.probing = true
		return true, true, HalfOpen
	}
}

// exit records a call's outcome and reports a change of state.
func (g *Guard) exit(ctx context.Context, probe bool, err error) (from, to State, changed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	from = g.state
	if probe {
		g.probing = false
	}
	switch {
	case err == nil:
		if probe || g.state == Closed {
			g.fails = 0
			g.backoff = g.opt.MinBackoff
			g.set(Closed)
		}
	case canceled(ctx, err):
		// The caller gave up: the store said nothing. A canceled probe
		// leaves the circuit half-open, and the next call probes.
	case probe:
		g.backoff = min(2*g.backoff, g.opt.MaxBackoff)
		g.open()
	case g.state == Closed:
		now := g.opt.Clock.Now()
		if g.fails == 0 {
			g.firstFail = now
		}
		g.fails++
		if g.fails >= g.opt.Failures && now.Sub(g.firstFail) >= g.opt.FailFor {
			g.open()
		}
	}
	return from, g.state, g.state != from
}

// open opens the circuit for the current backoff. Callers hold mu.
func (g *Guard) open() {
	g.fails = 0
	g.openUntil = g.opt.Clock.Now().Add(g.backoff)
	g.set(Open)
}

func (g *Guard) set(s State) {
	if s != g.state {
		g.since = g.opt.Clock.Now()
	}
	g.state = s
	g.published.Store(int32(s))
}

// canceled reports whether err is the caller's cancellation, not the
// store's failure. A deadline is not: see the package doc.
func canceled(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled)
}
