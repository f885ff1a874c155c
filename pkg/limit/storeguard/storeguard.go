// Package storeguard is a circuit in front of a limit.Store (the Redis
// store): when the store keeps failing, decisions stop waiting for it.
//
// Closed, every call goes through. Failures consecutive errors open it,
// timeouts included: a single slow call on a healthy but busy store (a
// 10ms budget is tight on a loaded node) must not turn every decision
// degraded for a whole backoff, while a store that is down or
// blackholed fails every call and opens it after Failures of them. Open, Apply fails at once with ErrOpen, without
// calling the store, so the Limiter's store_failure answers in
// microseconds rather than after the store timeout. After a backoff
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
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = time.Second
)

// Options tune a Guard; zero values take the defaults.
type Options struct {
	// Failures is how many consecutive errors, timeouts included, open
	// the circuit (Optional, default 3).
	Failures int
	// MinBackoff is how long the circuit stays open before the first
	// probe (Optional, default 100ms); each failed probe doubles it, up to
	// MaxBackoff (Optional, default 1s).
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
	fails     int           // consecutive errors while closed
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
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(o.MinBackoff, DefaultMaxBackoff)
	}
	if o.Clock == nil {
		o.Clock = limit.SystemClock{}
	}
	return &Guard{inner: inner, opt: o, backoff: o.MinBackoff}
}

// State is the circuit's state now.
func (g *Guard) State() State { return State(g.published.Load()) }

// Refused counts the calls refused while the circuit was open.
func (g *Guard) Refused() uint64 { return g.refused.Load() }

// Apply calls the inner store unless the circuit is open.
func (g *Guard) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	probe, ok := g.enter()
	if !ok {
		g.refused.Add(1)
		return false, ErrOpen
	}
	admitted, err := g.inner.Apply(ctx, now, charges, res)
	g.exit(ctx, probe, err)
	return admitted, err
}

// enter decides whether a call may go through, and whether it is the
// probe.
func (g *Guard) enter() (probe, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case Closed:
		return false, true
	case Open:
		if g.opt.Clock.Now().Before(g.openUntil) {
			return false, false
		}
		g.set(HalfOpen)
		g.probing = true
		return true, true
	default: // half-open
		if g.probing {
			return false, false
		}
		g.probing = true
		return true, true
	}
}

// exit records a call's outcome.
func (g *Guard) exit(ctx context.Context, probe bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
		g.fails++
		if g.fails >= g.opt.Failures {
			g.open()
		}
	}
}

// open opens the circuit for the current backoff. Callers hold mu.
func (g *Guard) open() {
	g.fails = 0
	g.openUntil = g.opt.Clock.Now().Add(g.backoff)
	g.set(Open)
}

func (g *Guard) set(s State) {
	g.state = s
	g.published.Store(int32(s))
}

// canceled reports whether err is the caller's cancellation, not the
// store's failure. A deadline is not: see the package doc.
func canceled(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled)
}
