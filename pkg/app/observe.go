package app

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/tollgate-dev/tollgate/pkg/accesslog"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/pressure"
	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
	"github.com/tollgate-dev/tollgate/pkg/rls"
)

// inFlightInterceptors count the decisions in flight, for the pressure
// runtime's in-flight signal (none without --pressure-capacity).
func inFlightInterceptors(f *pressure.InFlight) []grpc.UnaryServerInterceptor {
	if f == nil {
		return nil
	}
	return []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		switch info.FullMethod {
		case rls.ShouldRateLimitMethod, extauthz.CheckMethod:
			f.Inc()
			defer f.Dec()
		}
		return h(ctx, req)
	}}
}

// observeOutcomes has each rule set's breakers, and the runtime's outcome
// signals, fed by als's outcomes.
func observeOutcomes(rt *pressureruntime.Runtime, als *accesslog.Service, log *zap.Logger) {
	clock := limit.Clock(limit.SystemClock{})
	rt.OnBreakers(func(breakers []breaker.SetEntry) {
		var obs fanOut
		if len(breakers) > 0 {
			obs = append(obs, accesslog.NewBreakerObserver(clock, log.Named("breaker"), 0, breakers...).WithBusy(rt.BusyFunc()))
		}
		if o := rt.Outcomes(); o != nil {
			obs = append(obs, outcomeObserver{o: o, clock: clock, busy: rt.BusyFunc()})
		}
		if len(obs) == 0 {
			als.SetObserver(nil)
			return
		}
		als.SetObserver(obs)
	})
}

// fanOut is an Observer that tells each of its Observers in turn.
type fanOut []accesslog.Observer

var _ accesslog.Observer = fanOut(nil)

func (f fanOut) Observe(ctx context.Context, o *accesslog.Outcome) {
	for _, x := range f {
		x.Observe(ctx, o)
	}
}

// outcomeObserver feeds the latency, failure and overload signals, each
// outcome classified as the breakers classify it (docs/outcome-classes.md)
// with busy as their BusyFunc.
type outcomeObserver struct {
	o     *pressure.Outcomes
	clock limit.Clock
	busy  breaker.BusyFunc
}

func (x outcomeObserver) Observe(_ context.Context, o *accesslog.Outcome) {
	busy := x.busy != nil && o.Model != "" && breaker.MayBeOverload(o.Facts) && x.busy(o.Domain, o.Model)
	kind := pressure.Served
	switch breaker.ClassifyFacts(o.Facts, busy, 0) {
	case breaker.Failure:
		kind = pressure.Failed
	case breaker.Overload:
		kind = pressure.Overloaded
	}
	// A request that reached no upstream was refused by Tollgate or
	// another filter: counting its 503 would make shedding feed on
	// itself. Envoy's own overflow (UO) is the exception: it is load.
	if o.UpstreamCluster == "" && kind != pressure.Overloaded {
		return
	}
	x.o.Observe(x.clock.Now(), kind, o.Duration, o.Model)
}
