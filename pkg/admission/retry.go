package admission

import "github.com/tollgate-dev/tollgate/pkg/limit"

// RetrySource tells the retry budget what this replica knows of an
// upstream now: its breaker, its in-flight pressure and its recent error
// rate (limit.RetrySignals). The pressure runtime implements it; a
// Limiter without one (WithRetrySource) reads those signals as calm. The
// admission queue's wait the Limiter reads from its own queue
// (WithQueue), so a source leaves QueueWait 0.
type RetrySource interface {
	// RetrySignals are the signals for a request of domain to model
	// ("" when the request names none: the replica's global signals).
	RetrySignals(domain, model string) limit.RetrySignals
}

// WithRetrySource makes the Limiter read the retry budget's signals from
// s, for domains with a RetryBudget.
func WithRetrySource(s RetrySource) Option { return func(l *Limiter) { l.retries = s } }

// budgetRetries sets an admitted request's retry budget (Decision.Retries)
// when its domain has one. A request that only settles an earlier one
// goes nowhere, and a refused one is not sent upstream: neither gets one.
func (l *Limiter) budgetRetries(dec *Decision, dom *limit.Domain, req *limit.Request, settles bool) {
	if dec == nil || dom == nil || dom.RetryBudget == nil || settles || dec.Code != limit.CodeOK {
		return
	}
	var s limit.RetrySignals
	if l.retries != nil {
		s = l.retries.RetrySignals(dom.Name, req.Value(limit.ModelKey))
	}
	if l.queue != nil && dom.Queue != nil {
		// Only a domain with a queue has waits: one without asks no lock.
		s.QueueWait = l.queue.AverageWait(dom.Name)
	}
	// A probe tests whether a half-open upstream recovered: a retry would
	// be a second probe the breaker did not admit.
	s.BreakerOpen = s.BreakerOpen || len(dec.Probes) > 0
	dec.Retries, dec.HasRetries = dom.RetryBudget.Retries(s), true
}
