package limit

import (
	"math"
	"time"
)

// MaxRetries is the largest retry budget: retries multiply an upstream's
// load, and past three they add more load than they recover successes.
const MaxRetries = 3

// The retry budget's default thresholds (docs/retry-budget.md).
const (
	DefaultRetryMaxPressure   = 0.9
	DefaultRetryMaxQueueWait  = 2 * time.Second
	DefaultRetryHighErrorRate = 0.5
	DefaultRetryErrorRate     = 0.2
)

// RetryBudget is a domain's retry_budget: how many retries an admitted
// request may make upstream, told to Envoy as x-envoy-max-retries. It
// falls to 0 while retrying would feed an overload, and shrinks as the
// upstream fails more often.
type RetryBudget struct {
	// Max is the budget when nothing is wrong (Optional, default
	// MaxRetries; in [0, MaxRetries]).
	Max int
	// MaxPressure: at or above this in-flight pressure the budget is 0
	// (Optional, default 0.9, in (0,1]).
	MaxPressure float64
	// MaxQueueWait: above this average queue wait the budget is 0
	// (Optional, default 2s).
	MaxQueueWait time.Duration
	// HighErrorRate: above this error rate the budget is at most 1
	// (Optional, default 0.5).
	HighErrorRate float64
	// ErrorRate: above this error rate the budget is at most 2
	// (Optional, default 0.2; at most HighErrorRate).
	ErrorRate float64
	// Source is where the section was loaded from (file:line), for
	// explain.
	Source string
}

// DefaultRetryBudget is the budget of a retry_budget section that sets
// nothing but enabled.
func DefaultRetryBudget() RetryBudget {
	return RetryBudget{
		Max:           MaxRetries,
		MaxPressure:   DefaultRetryMaxPressure,
		MaxQueueWait:  DefaultRetryMaxQueueWait,
		HighErrorRate: DefaultRetryHighErrorRate,
		ErrorRate:     DefaultRetryErrorRate,
	}
}

// RetrySignals are what one replica knows, now, of the upstream a
// request goes to: the inputs of RetryBudget.Retries.
type RetrySignals struct {
	// BreakerOpen: the model's breaker is open or half-open. A half-open
	// breaker's probe must tell whether the upstream recovered; a retry
	// would make it a second probe the breaker did not admit.
	BreakerOpen bool
	// Pressure is the replica's in-flight or overload pressure, in [0,1].
	Pressure float64
	// QueueWait is the average wait in the admission queue (0 without
	// one).
	QueueWait time.Duration
	// ErrorRate is the recent share of the upstream's requests that
	// failed, in [0,1].
	ErrorRate float64
}

// Retries is the number of retries that are safe under s, in
// [0, b.Max]: 0 while the breaker is open or half-open, the pressure is
// at or above MaxPressure, or the queue wait above MaxQueueWait; else at
// most 1 above HighErrorRate and at most 2 above ErrorRate; else Max.
// It never rises as any input worsens. A signal that is not a number
// reads as the worst case: a broken reading must not buy retries.
func (b RetryBudget) Retries(s RetrySignals) int {
	top := min(max(b.Max, 0), MaxRetries)
	switch {
	case s.BreakerOpen,
		!(s.Pressure < b.MaxPressure), // NaN too
		s.QueueWait > b.MaxQueueWait,
		math.IsNaN(s.ErrorRate):
		return 0
	case s.ErrorRate > b.HighErrorRate:
		return min(top, 1)
	case s.ErrorRate > b.ErrorRate:
		return min(top, 2)
	}
	return top
}
