package app

import (
	"fmt"
	"io"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// retryBudgetExplain is a domain's retry_budget as explain shows it: the
// thresholds, not a budget, since the budget is read from the live
// signals of the replica that decides.
type retryBudgetExplain struct {
	Source        string  `json:"source,omitempty"`
	Max           int     `json:"max"`
	MaxPressure   float64 `json:"max_pressure"`
	MaxQueueWait  string  `json:"max_queue_wait"`
	ErrorRate     float64 `json:"error_rate"`
	HighErrorRate float64 `json:"high_error_rate"`
}

// explainRetryBudget is dom's retry budget for explain, nil for none.
func explainRetryBudget(dom *limit.Domain) *retryBudgetExplain {
	b := dom.RetryBudget
	if b == nil {
		return nil
	}
	return &retryBudgetExplain{
		Source: b.Source, Max: b.Max, MaxPressure: b.MaxPressure, MaxQueueWait: b.MaxQueueWait.String(),
		ErrorRate: b.ErrorRate, HighErrorRate: b.HighErrorRate,
	}
}

func (r *retryBudgetExplain) writeText(w io.Writer) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "retry budget (%s): if admitted, x-envoy-max-retries up to %d; 0 while the model's breaker is open or half-open, in-flight pressure >= %v or the queue wait > %s; at most 1 above %v failures, 2 above %v\n",
		r.Source, r.Max, r.MaxPressure, r.MaxQueueWait, r.HighErrorRate, r.ErrorRate)
}
