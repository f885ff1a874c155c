package config

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// retryBudgetKeys are retry_budget's keys (docs/retry-budget.md).
var retryBudgetKeys = []string{"enabled", "max", "max_pressure", "max_queue_wait", "error_rate", "high_error_rate"}

// retryBudget reads a domain's retry_budget: how many retries an admitted
// request may make, told to Envoy as x-envoy-max-retries. nil when the
// section says enabled: false, or is wrong (the problems are recorded).
//
//	retry_budget:
//	  enabled: true         # (Optional, default true)
//	  max: 3                # (Optional, default 3, 0..3)
//	  max_pressure: 0.9     # (Optional, default 0.9, (0,1]): at or above, 0
//	  max_queue_wait: 2s    # (Optional, default 2s, > 0): above, 0
//	  error_rate: 0.2       # (Optional, default 0.2, (0,1)): above, at most 2
//	  high_error_rate: 0.5  # (Optional, default 0.5, [error_rate,1)): above, at most 1
func (w *walker) retryBudget(n *yaml.Node) *limit.RetryBudget {
	const path = "retry_budget"
	before := len(w.problems)
	f, _ := w.mapping(n, path, retryBudgetKeys)
	if f == nil {
		return nil
	}
	enabled := true
	if _, has := f["enabled"]; has {
		enabled = w.flag(f, "enabled", path)
	}
	b := limit.DefaultRetryBudget()
	b.Source = fmt.Sprintf("%s:%d", w.file, w.resolve(n).Line)
	if v, has := f["max"]; has {
		if m, ok := w.uint(v, path+".max", 0, limit.MaxRetries); ok {
			b.Max = int(m)
		}
	}
	if v, has := f["max_pressure"]; has {
		if p, ok := w.float(v, path+".max_pressure"); ok {
			if p <= 0 || p > 1 {
				w.addf(v, path+".max_pressure", "%v is not in (0,1]; pressure is a fraction of capacity", p)
			}
			b.MaxPressure = p
		}
	}
	if v, has := f["max_queue_wait"]; has {
		if d, ok := w.duration(v, path+".max_queue_wait"); ok {
			if d <= 0 || d > time.Hour {
				w.addf(v, path+".max_queue_wait", "%s is not in (0s,1h]", d)
			}
			b.MaxQueueWait = d
		}
	}
	rateAt := map[string]*yaml.Node{}
	for _, k := range []struct {
		key string
		dst *float64
	}{{"error_rate", &b.ErrorRate}, {"high_error_rate", &b.HighErrorRate}} {
		v, has := f[k.key]
		if !has {
			continue
		}
		rateAt[k.key] = v
		if r, ok := w.float(v, path+"."+k.key); ok {
			if r <= 0 || r >= 1 {
				w.addf(v, path+"."+k.key, "%v is not in (0,1); it is a share of the upstream's requests", r)
			}
			*k.dst = r
		}
	}
	if len(w.problems) == before && b.ErrorRate > b.HighErrorRate {
		at := rateAt["error_rate"]
		if at == nil {
			at = rateAt["high_error_rate"]
		}
		w.addf(at, path+".error_rate", "%v is above high_error_rate %v; the budget falls to 2 before it falls to 1", b.ErrorRate, b.HighErrorRate)
	}
	if len(w.problems) != before || !enabled {
		return nil
	}
	return &b
}
