package extauthz

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric label values.
const (
	labelUnknown = "unknown" // a domain not in the rules
	labelNoTier  = "none"    // no decision, or a domain without tiers

	resultOK        = "ok"
	resultOverLimit = "over_limit"
	// A request that can never fit a limit (413): its estimate is more
	// than the whole budget.
	resultTooLarge        = "too_large"
	resultUnauthenticated = "unauthenticated"
	resultBadRequest      = "bad_request"
	// A body Envoy cut, refused under PartialRefuse (413), and one Envoy
	// did not send when it decides (500: the gateway's configuration).
	resultPartialBody = "partial_body"
	resultBodyNotSent = "body_not_sent"
	resultError       = "error"
	// Refusals before any limit, and a shadow shedding policy's would-be
	// refusals; the same values as tollgate_rls_decisions_total's.
	resultShed        = "shed"
	resultShadowShed  = "shadow_shed"
	resultBreakerOpen = "breaker_open"
)

// metrics are the service's per-instance collectors, registered on the
// Registerer the caller passes in. Labels never carry a key, a tenant or
// a model: only the domain (when the rules know it), the plan the rules
// chose, and the result.
type metrics struct {
	checks    *prometheus.CounterVec
	duration  prometheus.Histogram
	estimated prometheus.Histogram

	// counters caches the children of checks, which WithLabelValues
	// would validate, hash and find under a shared lock on every call.
	// The map is never written once stored; a new label set (there are
	// few: the labels are bounded) stores a copy with it added.
	counters   atomic.Pointer[map[checkLabels]prometheus.Counter]
	countersMu sync.Mutex // held to add to counters
}

type checkLabels struct{ domain, tier, result string }

// check returns the child of checks with these labels.
func (m *metrics) check(domain, tier, result string) prometheus.Counter {
	k := checkLabels{domain, tier, result}
	if p := m.counters.Load(); p != nil {
		if c, ok := (*p)[k]; ok {
			return c
		}
	}
	m.countersMu.Lock()
	defer m.countersMu.Unlock()
	old := m.counters.Load()
	if old != nil {
		if c, ok := (*old)[k]; ok {
			return c
		}
	}
	next := map[checkLabels]prometheus.Counter{}
	if old != nil {
		next = maps.Clone(*old)
	}
	c := m.checks.WithLabelValues(domain, tier, result)
	next[k] = c
	m.counters.Store(&next)
	return c
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_authz_checks_total",
			Help: "ext_authz Check calls, by domain (\"unknown\" for domains not in the rules), tier (the plan the rules' tiers chose; \"none\" without tiers or a decision) and result (ok, over_limit, too_large when the request can never fit a limit, unauthenticated, bad_request, error; partial_body when a body Envoy cut was refused, body_not_sent when Envoy sent no body and it decides; shed and breaker_open when tier shedding or a circuit breaker refused the request before any limit, shadow_shed when a shadow shedding policy would have).",
		}, []string{"domain", "tier", "result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_authz_check_duration_seconds",
			Help:    "Time to answer one Check call: key lookup, body parsing and the decision with its store round trip.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		estimated: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_authz_estimated_tokens",
			Help:    "Token cost Check estimated for each request it decided on (prompt plus the completion it may generate).",
			Buckets: prometheus.ExponentialBuckets(16, 4, 10), // 16 .. ~4M
		}),
	}
	for _, c := range []prometheus.Collector{m.checks, m.duration, m.estimated} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register extauthz metrics: %w", err)
		}
	}
	return m, nil
}
