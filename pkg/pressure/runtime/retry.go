package runtime

import (
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

var _ admission.RetrySource = (*Runtime)(nil)

// QueueWaitFunc is the average wait of a domain's admission queue on this
// replica, for the retry budget.
type QueueWaitFunc func(domain string) time.Duration

// SetQueueWait gives the retry budget the admission queue's average wait;
// without it the wait reads 0. Call it before the Limiter decides.
func (s *Runtime) SetQueueWait(f QueueWaitFunc) { s.queueWait.Store(&f) }

// RetrySignals implements admission.RetrySource from this replica's
// signals: the in-flight pressure (0 without Config.Capacity), the
// admission queue's wait (SetQueueWait), and the failure rate the access
// log reports for model, or for every model when the model has no window
// of its own (0 without outcome signals).
//
// It leaves BreakerOpen false: the Limiter asks the breakers before the
// limits, an open one refuses the request, and a half-open one admits
// only probes, which the Limiter itself holds to 0 retries. Reading the
// breaker here again would cost a store call per decision for nothing.
func (s *Runtime) RetrySignals(domain, model string) limit.RetrySignals {
	now := s.clock.Now()
	var sig limit.RetrySignals
	if s.inflight != nil {
		sig.Pressure = s.inflight.Score(now)
	}
	if f := s.queueWait.Load(); f != nil {
		sig.QueueWait = (*f)(domain)
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
