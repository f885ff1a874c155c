package pressure

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Gate is the admission.Shedder of a process: it maps each domain's pressure
// scopes to the Evaluator that applies the domain's policy there, and
// answers the Limiter with one atomic load and one map lookup.
//
// A domain with Shedding.Scope model asks for the request's model; a model
// the Gate has no Evaluator for falls back to the domain's global one, so
// per-model scopes can be added for the models that need them.
//
// With a Controller (SetController), a request the steps admit is shed
// with its tier's fraction for the request's upstream (the scope the
// Limiter passes for a domain with a Control): one more atomic load and
// a random draw, no lock.
type Gate struct {
	m    atomic.Pointer[map[gateKey]*Evaluator]
	ctl  atomic.Pointer[Controller]
	draw func() float64 // in [0,1)
}

type gateKey struct{ domain, scope string }

// NewGate returns a Gate that sheds nothing until Set.
func NewGate() *Gate { return NewGateRand(rand.Float64) }

// NewGateRand is NewGate drawing the controller's shedding from draw
// (safe for concurrent use, in [0,1)): tests seed it.
func NewGateRand(draw func() float64) *Gate {
	g := &Gate{draw: draw}
	m := map[gateKey]*Evaluator{}
	g.m.Store(&m)
	return g
}

// GateEntry places an Evaluator: the policy of Domain at the pressure of
// Scope (limit.ScopeGlobal, or a model's name).
type GateEntry struct {
	Domain, Scope string
	Evaluator     *Evaluator
}

// Set replaces every entry at once (a rules reload); the decisions in
// flight finish on the old ones.
func (g *Gate) Set(entries ...GateEntry) {
	m := make(map[gateKey]*Evaluator, len(entries))
	for _, e := range entries {
		if e.Evaluator != nil {
			m[gateKey{e.Domain, e.Scope}] = e.Evaluator
		}
	}
	g.m.Store(&m)
}

// SetController makes the Gate shed by c's fractions too (nil: not).
func (g *Gate) SetController(c *Controller) { g.ctl.Store(c) }

// Shed implements admission.Shedder. A tier the steps shed stays shed; one
// they admit is shed with the controller's fraction, in shadow mode when
// the steps' policy is.
func (g *Gate) Shed(domain, scope, tier string) limit.ShedState {
	m := *g.m.Load()
	e := m[gateKey{domain, scope}]
	if e == nil && scope != limit.ScopeGlobal {
		e = m[gateKey{domain, limit.ScopeGlobal}]
	}
	var st limit.ShedState
	if e != nil {
		o := e.out.Load()
		st = limit.ShedState{Shed: o.Sheds(tier), Shadow: o.Shadow, Factor: o.Factor, NoBurst: o.NoBurst}
	}
	if c := g.ctl.Load(); c != nil && !st.Shed {
		if f := c.Fraction(domain, scope, tier); f >= 1 || (f > 0 && g.draw() < f) {
			st.Shed = true
		}
	}
	return st
}
