package admission

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The workings of the shedding and breaker stages that pipeline.go
// lists: the interfaces they call (pkg/pressure and pkg/breaker implement
// them) and the steps that refuse and give probes back.

// Shedder reports the shedding in force; pkg/pressure's Gate is one. It
// is read once per decision of a domain with a Shedding policy, so it
// must be cheap (an atomic load) and never block on a store.
type Shedder interface {
	// Shed is the state of domain's policy at the pressure of scope
	// (ScopeGlobal, or a model's name) for a request of tier. The zero
	// limit.ShedState, for a domain or scope it knows nothing of, changes
	// nothing.
	Shed(domain, scope, tier string) limit.ShedState
}

// Breakers are the circuit breakers of the domains' BreakerConfigs;
// pkg/breaker's Set is one.
type Breakers interface {
	// Allow asks domain's breaker on key whether the upstream name may be
	// called now. A half-open breaker admits a bounded number of probes.
	Allow(ctx context.Context, now time.Time, domain, key, name string) (limit.BreakerVerdict, error)
	// Release frees a probe slot Allow gave to a request that then did
	// not go upstream (a limit refused it), without counting an outcome.
	Release(ctx context.Context, now time.Time, domain, key, name, probeID string) error
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithShedder makes the Limiter shed by pressure, for domains with a
// Shedding policy.
func WithShedder(s Shedder) Option { return func(l *Limiter) { l.shedder = s } }

// WithBreakers makes the Limiter consult circuit breakers, for domains
// with Breakers.
func WithBreakers(b Breakers) Option { return func(l *Limiter) { l.breakers = b } }

// maySettle says whether every descriptor of req is a refund or carries
// its own hits_addend: only such a request can be all refunds and cost
// reports (build tells, from the rules). It keeps shedding's refusal
// from matching rules for any other request.
func maySettle(req *limit.Request) bool {
	for i := range req.Descriptors {
		if d := &req.Descriptors[i]; !d.Negative && !d.HitsSet {
			return false
		}
	}
	return true
}

// releaseTimeout bounds giving probes back, which runs even when the
// caller has given up.
const releaseTimeout = time.Second

// adjust is what pressure does to the limits of an admitted request.
type adjust struct {
	micro   uint64 // factor in millionths; MicroOne: unchanged
	noBurst bool
	floor   time.Duration // with noBurst: Shedding.EffectiveBurstFloor
}

var noAdjust = adjust{micro: limit.MicroOne}

// apply returns l scaled by a, or l itself when a changes nothing.
func (a adjust) apply(l *limit.Limit) *limit.Limit {
	if l == nil || (a.micro == limit.MicroOne && (!a.noBurst || l.Algorithm != limit.TokenBucket)) {
		return l
	}
	c := *limit.Scaled(l, a.micro)
	if c.Algorithm == limit.TokenBucket && a.noBurst {
		c.Burst = burstFloor(&c, a.floor)
	}
	return &c
}

// burstFloor is the burst l keeps with bursts turned down: what it
// refills in floor (rounded up), at least 1, at most its burst.
func burstFloor(l *limit.Limit, floor time.Duration) uint64 {
	b := l.EffectiveBurst()
	w := l.Window()
	if w <= 0 || floor <= 0 {
		return 1
	}
	// A float: Amount x floor can pass 2^64 ns; the rounding cannot
	// matter at the sizes where float64 rounds.
	f := math.Ceil(float64(l.Amount) * float64(floor) / float64(w))
	if f >= float64(b) {
		return b
	}
	return max(uint64(f), 1)
}

// shed runs the shedding step: it reports whether the request is
// refused, and otherwise how its limits change.
func (l *Limiter) shed(dom *limit.Domain, req *limit.Request, dec *Decision) (adjust, bool) {
	if l.shedder == nil || dom.Shedding == nil {
		return noAdjust, false
	}
	scope := limit.ScopeGlobal
	if c := dom.Shedding.Control; c != nil {
		// The controller's fractions are per upstream; the Gate falls
		// back to the global steps for an upstream without its own.
		if u := req.Value(c.KeyName()); u != "" {
			scope = u
		}
	} else if dom.Shedding.Scope == limit.ScopeModel {
		if m := req.Value(limit.ModelKey); m != "" {
			scope = m
		}
	}
	tier, _ := dom.Plan(req)
	st := l.shedder.Shed(dom.Name, scope, tier)
	if st.Shadow {
		dec.ShadowShed = st.Shed
		return noAdjust, false
	}
	if st.Shed {
		return noAdjust, true
	}
	a := adjust{micro: limit.MicroOne, noBurst: st.NoBurst, floor: dom.Shedding.EffectiveBurstFloor()}
	if st.Factor > 0 && st.Factor < 1 {
		a.micro = max(uint64(st.Factor*limit.MicroOne), 1)
	}
	return a, false
}

// refuse marks dec as refused for reason before any limit: every
// descriptor over limit, with no limit to report.
func refuse(dec *Decision, reason Reason, retry time.Duration) {
	dec.Code, dec.Reason, dec.RetryAfter = limit.CodeOverLimit, reason, retry
	for i := range dec.Statuses {
		dec.Statuses[i].Code = limit.CodeOverLimit
		dec.Statuses[i].RetryAfter = retry
	}
}

// allowBreakers runs the breaker step: each of dom's breakers whose key
// the request carries. It returns the probes taken, or refuses dec (and
// gives back the probes taken before the refusal).
func (l *Limiter) allowBreakers(ctx context.Context, now time.Time, dom *limit.Domain, req *limit.Request, dec *Decision) (bool, error) {
	if l.breakers == nil {
		return true, nil
	}
	for _, b := range dom.Breakers {
		name := req.Value(b.Key)
		if name == "" {
			continue
		}
		v, err := l.breakers.Allow(ctx, now, dom.Name, b.Key, name)
		if err != nil {
			l.release(ctx, now, dom, dec)
			return false, fmt.Errorf("breaker %s: %w", b.Key, err)
		}
		if !v.Allowed {
			l.release(ctx, now, dom, dec)
			refuse(dec, ReasonBreaker, v.RetryAfter)
			return false, nil
		}
		if v.ProbeID != "" {
			dec.Probes = append(dec.Probes, limit.Probe{Key: b.Key, Name: name, ID: v.ProbeID})
		}
	}
	return true, nil
}

// release gives back the probes dec holds: the request will not go
// upstream, so its probe would otherwise hold a half-open slot for the
// whole ProbeLease (and a tenant at its limit could keep a breaker from
// closing). Releasing counts neither success nor failure. A release that
// fails is left to the lease, which bounds it; the decision stands.
func (l *Limiter) release(ctx context.Context, now time.Time, dom *limit.Domain, dec *Decision) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	for _, p := range dec.Probes {
		_ = l.breakers.Release(ctx, now, dom.Name, p.Key, p.Name, p.ID)
	}
	dec.Probes = nil
}
