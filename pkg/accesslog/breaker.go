package accesslog

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// BreakerObserver is an Observer that feeds each outcome to circuit
// breakers. A breaker's name is the outcome's value of its descriptor
// key: Model for "model", Tenant for "tenant", Tier for "tier"; a breaker
// on any other key learns nothing here, since an Outcome carries no other
// values. A probe's outcome carries its probe ID (Outcome.Probes, by the
// breaker's key), so that half-open breakers can close; an outcome with a
// ticket ID (Outcome.Once) counts its failure once.
type BreakerObserver struct {
	breakers []*breaker.Breaker
	clock    limit.Clock
	timeout  time.Duration
	log      *zap.Logger
}

var _ Observer = (*BreakerObserver)(nil)

// NewBreakerObserver returns a BreakerObserver for bs, timing outcomes by
// clock and bounding each store call by timeout (0: DefaultTimeout).
func NewBreakerObserver(clock limit.Clock, log *zap.Logger, timeout time.Duration, bs ...*breaker.Breaker) *BreakerObserver {
	if log == nil {
		log = zap.NewNop()
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &BreakerObserver{breakers: bs, clock: clock, timeout: timeout, log: log}
}

// Observe implements Observer.
func (b *BreakerObserver) Observe(ctx context.Context, o *Outcome) {
	now := b.clock.Now()
	for _, br := range b.breakers {
		name := outcomeValue(o, br.Config().Key)
		if name == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, b.timeout)
		err := br.Observe(ctx, now, breaker.Outcome{Facts: o.Facts, Name: name, ProbeID: o.Probes[br.Config().Key], Once: o.Once})
		cancel()
		if err != nil {
			b.log.Warn("breaker outcome not recorded", zap.Error(err), zap.String("key", br.Config().Key))
		}
	}
}

func outcomeValue(o *Outcome, key string) string {
	switch key {
	case "model":
		return o.Model
	case "tenant":
		return o.Tenant
	case "tier":
		return o.Tier
	}
	return ""
}
