package pressure

import (
	"sync/atomic"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Gate is the limit.Shedder of a process: it maps each domain's pressure
// scopes to the Evaluator that applies the domain's policy there, and
// answers the Limiter with one atomic load and one map lookup.
//
// A domain with Shedding.Scope model asks for the request's model; a model
// the Gate has no Evaluator for falls back to the domain's global one, so
// per-model scopes can be added for the models that need them.
type Gate struct {
	m atomic.Pointer[map[gateKey]*Evaluator]
}

type gateKey struct{ domain, scope string }

var _ limit.Shedder = (*Gate)(nil)

// NewGate returns a Gate that sheds nothing until Set.
func NewGate() *Gate {
	g := &Gate{}
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

// Shed implements limit.Shedder.
func (g *Gate) Shed(domain, scope, tier string) limit.ShedState {
	m := *g.m.Load()
	e := m[gateKey{domain, scope}]
	if e == nil && scope != limit.ScopeGlobal {
		e = m[gateKey{domain, limit.ScopeGlobal}]
	}
	if e == nil {
		return limit.ShedState{}
	}
	o := e.out.Load()
	return limit.ShedState{Shed: o.Sheds(tier), Shadow: o.Shadow, Factor: o.Factor, NoBurst: o.NoBurst}
}
