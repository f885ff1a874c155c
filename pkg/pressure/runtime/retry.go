package runtime

import (
	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

var _ admission.RetrySource = (*Runtime)(nil)

// RetrySignals implements admission.RetrySource from this replica's
// signals: the in-flight pressure (0 without Config.Capacity) and the
// failure rate the access log reports for model, or for every model when
// the model has no window of its own (0 without outcome signals). The
// Limiter adds the admission queue's wait from its own queue.
//
// It leaves BreakerOpen false: the Limiter asks the breakers before the
// limits, an open one refuses the request, and a half-open one admits
// only probes, which the Limiter itself holds to 0 retries. Reading the
// breaker here again would cost a store call per decision for nothing.
func (s *Runtime) RetrySignals(_, model string) limit.RetrySignals {
	now := s.clock.Now()
	var sig limit.RetrySignals
	if s.inflight != nil {
		sig.Pressure = s.inflight.Score(now)
	}
	if s.outcomes != nil {
		w := s.outcomes.Global()
		if model != "" {
			if mw := s.outcomes.Known(model); mw != nil {
				w = mw
			}
		}
		sig.ErrorRate = w.FailureRate(now)
	}
	return sig
}
