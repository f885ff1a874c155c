package app

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// retryMetrics count the retry budgets this replica gave out
// (docs/retry-budget.md). Only a domain with a retry_budget gets one,
// so the domain label comes from the rules, never from a client; the
// adapter is one of two names.
type retryMetrics struct {
	granted *prometheus.HistogramVec
}

// Adapter labels of tollgate_retry_budget_granted.
const (
	retryAdapterRLS      = "rls"
	retryAdapterExtAuthz = "ext_authz"
)

// newRetryMetrics registers the retry budget's metric on reg.
func newRetryMetrics(reg prometheus.Registerer) (*retryMetrics, error) {
	m := &retryMetrics{
		granted: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tollgate_retry_budget_granted",
			Help: "Retry budgets (x-envoy-max-retries) given to admitted requests, by domain and adapter; a budget is 0..3, one bucket each.",
			// One bucket per value: a budget is at most limit.MaxRetries.
			Buckets: retryBuckets(),
		}, []string{"domain", "adapter"}),
	}
	if err := reg.Register(m.granted); err != nil {
		return nil, fmt.Errorf("register retry budget metrics: %w", err)
	}
	return m, nil
}

// retryBuckets are 0, 1, ... limit.MaxRetries.
func retryBuckets() []float64 {
	b := make([]float64, limit.MaxRetries+1)
	for i := range b {
		b[i] = float64(i)
	}
	return b
}

// decider is what both adapters ask (rls.Decider, extauthz.Decider).
type decider interface {
	Decide(ctx context.Context, req *limit.Request) (*admission.Decision, error)
	Rules() *limit.RuleSet
}

// retryObserved is a decider that records every retry budget its
// decisions carry: the adapter sends each as x-envoy-max-retries, so the
// histogram counts what Envoy was told.
type retryObserved struct {
	decider
	vec     *prometheus.HistogramVec
	adapter string
}

// observe wraps d for adapter (nil m: d itself).
func (m *retryMetrics) observe(d decider, adapter string) decider {
	if m == nil {
		return d
	}
	return &retryObserved{decider: d, vec: m.granted, adapter: adapter}
}

// Decide asks the wrapped decider and records the budget it gave.
func (r *retryObserved) Decide(ctx context.Context, req *limit.Request) (*admission.Decision, error) {
	dec, err := r.decider.Decide(ctx, req)
	if err == nil && dec != nil && dec.HasRetries {
		r.vec.WithLabelValues(req.Domain, r.adapter).Observe(float64(dec.Retries))
	}
	return dec, err
}
