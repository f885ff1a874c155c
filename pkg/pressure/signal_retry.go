package pressure

import "time"

// Known returns model's window when the configuration registered it, else
// nil. Unlike Model it never adds one: a request can name any model, and
// reading must not let it grow the set.
func (o *Outcomes) Known(model string) *OutcomeWindow { return (*o.models.Load())[model] }

// FailureRate is the share of the interval's requests that failed or were
// refused as overload, damped as the signals are: (errors + overloads) /
// max(samples, MinSamples). Both count against a retry: a retry of
// either adds to what caused it.
func (w *OutcomeWindow) FailureRate(now time.Time) float64 {
	r := w.read(now)
	return min(1, w.rate(r, r.errors+r.overloads))
}
