package accesslog

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
)

// BreakerTimeout bounds each breaker store call of an outcome.
const BreakerTimeout = outcome.DefaultTimeout

// BreakerObserver is an Observer that feeds each outcome to the circuit
// breakers of its domain: each breaker of the outcome's ticket
// (Outcome.Breakers) under the name the decision gave it, with the probe
// the request held, so that half-open breakers can close, classified as
// docs/outcome-classes.md says (breaker.Classify). An overload answer
// (the vendor's 429; a 503, 504 or timeout while the upstream was busy,
// as its BusyFunc says) never counts toward opening a breaker.
type BreakerObserver struct {
	breakers map[breakerKey]*breaker.Breaker
	clock    limit.Clock
	timeout  time.Duration
	log      *zap.Logger
	busy     breaker.BusyFunc
}

type breakerKey struct{ domain, key string }

var _ Observer = (*BreakerObserver)(nil)

// NewBreakerObserver returns a BreakerObserver for the breakers placed by
// es (breaker.SetEntry: a domain's breaker on a key), timing outcomes by
// clock and bounding each store call by timeout (0: BreakerTimeout).
func NewBreakerObserver(clock limit.Clock, log *zap.Logger, timeout time.Duration, es ...breaker.SetEntry) *BreakerObserver {
	if log == nil {
		log = zap.NewNop()
	}
	if timeout <= 0 {
		timeout = BreakerTimeout
	}
	m := make(map[breakerKey]*breaker.Breaker, len(es))
	for _, e := range es {
		if e.Breaker != nil {
			m[breakerKey{e.Domain, e.Breaker.Config().Key}] = e.Breaker
		}
	}
	return &BreakerObserver{breakers: m, clock: clock, timeout: timeout, log: log}
}

// WithBusy makes b ask busy whether an outcome's upstream was at its
// capacity, for the outcomes whose class depends on it
// (breaker.MayBeOverload); nil, the default, is never busy. It returns b.
// Call it before b observes anything.
func (b *BreakerObserver) WithBusy(busy breaker.BusyFunc) *BreakerObserver {
	b.busy = busy
	return b
}

// Observe implements Observer.
func (b *BreakerObserver) Observe(ctx context.Context, o *Outcome) {
	now := b.clock.Now()
	mayOverload := b.busy != nil && breaker.MayBeOverload(o.Facts)
	for _, ob := range o.Breakers {
		br := b.breakers[breakerKey{o.Domain, ob.Key}]
		if br == nil {
			continue
		}
		busy := mayOverload && ob.Name != "" && b.busy(o.Domain, ob.Name)
		ctx, cancel := context.WithTimeout(ctx, b.timeout)
		// The ticket's ID makes a failure count once per breaker, however
		// often its entry is delivered.
		err := br.Observe(ctx, now, breaker.Outcome{Facts: o.Facts, Name: ob.Name, Busy: busy, ProbeID: ob.ProbeID, Once: o.ID})
		cancel()
		if err != nil {
			b.log.Warn("breaker outcome not recorded", zap.Error(err), zap.String("key", ob.Key))
		}
	}
}
