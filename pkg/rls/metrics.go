package rls

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Metric label values that are not a domain or rule name.
const (
	labelUnknown  = "unknown"  // domain not in the rules; result of a descriptor no rule matched
	labelNone     = "none"     // rule label when no rule matched
	labelOverride = "override" // rule label when only the descriptor's own limit applied
	labelNoTier   = "none"     // tier label when the domain has no tiers

	resultOK         = "ok"
	resultOverLimit  = "over_limit"
	resultShadowOver = "shadow_over"
	// Refusals before any limit, and a shadow shedding policy's would-be
	// refusals; the same values as tollgate_authz_checks_total's.
	resultShed        = "shed"
	resultShadowShed  = "shadow_shed"
	resultBreakerOpen = "breaker_open"
)

// metrics are the service's per-instance collectors, registered on the
// Registerer the caller passes in.
type metrics struct {
	decisions *prometheus.CounterVec
	detailed  *detailedSeries
	duration  prometheus.Histogram
	invalid   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, o options) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_rls_decisions_total",
			Help: "Descriptor decisions answered over RLS, by domain (\"unknown\" for domains not in the rules), matched rule ID (\"none\", \"override\"), tier (a plan of the domain's tiers, \"none\" without tiers) and result (ok, over_limit, shadow_over, unknown when no rule matched; shed and breaker_open when tier shedding or a circuit breaker refused the request before any limit, shadow_shed when a shadow shedding policy would have).",
		}, []string{"domain", "rule", "tier", "result"}),
		detailed: &detailedSeries{
			vec: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tollgate_rls_detailed_decisions_total",
				Help: "Descriptor decisions of rules with detailed_metric or value_to_metric, labelled with the descriptor's key=value entries as envoyproxy/ratelimit names its stats; past the cap of series per domain and rule (--detailed-metric-series), descriptor=\"overflow\".",
			}, []string{"domain", "rule", "descriptor", "result"}),
			overflow: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tollgate_rls_detailed_overflow_total",
				Help: "Decisions of rules with detailed_metric counted under descriptor=\"overflow\" because the rule already had its cap of series (--detailed-metric-series).",
			}, []string{"domain", "rule"}),
			limit: o.detailedCap,
			rules: map[ruleKey]*ruleSeries{},
		},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_rls_decision_duration_seconds",
			Help:    "Time to answer one ShouldRateLimit call, store round trip included.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_rls_invalid_requests_total",
			Help: "ShouldRateLimit calls rejected as malformed (InvalidArgument).",
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.detailed.vec, m.detailed.overflow, m.duration, m.invalid} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register rls metrics: %w", err)
		}
	}
	return m, nil
}

// observe counts one decision. known says whether the domain is in the
// rules; only then is its name a label value, so a client cannot grow the
// series count by inventing domains.
func (m *metrics) observe(domain string, dom *limit.Domain, req *limit.Request, dec *admission.Decision) {
	if dom == nil {
		domain = labelUnknown
	}
	// Decision.Tier is a plan name from the rules, never the client's
	// value, so the label stays bounded.
	tier := dec.Tier
	if tier == "" {
		tier = labelNoTier
	}
	// The reason's row, read once: it is the same for every status.
	a := dec.Reason.Answer()
	for i := range dec.Statuses {
		st := &dec.Statuses[i]
		rule, result := labels(st)
		switch {
		case a.BeforeLimits:
			result = a.Result
		case dec.ShadowShed && st.Code == limit.CodeOK:
			result = resultShadowShed
		}
		m.decisions.WithLabelValues(domain, rule, tier, result).Inc()
		if r := st.Rule; r != nil && (r.DetailedMetric || r.ByValue()) && dom != nil && i < len(req.Descriptors) {
			ents := req.Descriptors[i].Entries
			if dom.Tiers != nil {
				ents = limit.StripTier(ents, dom.Tiers.Key)
			}
			m.detailed.inc(domain, rule, descriptorLabel(dom.MetricEntries(ents, r.DetailedMetric)), result)
		}
	}
}

func labels(st *limit.Status) (rule, result string) {
	switch {
	case st.Rule != nil:
		rule = st.Rule.ID
	case st.Limit != nil:
		rule = labelOverride
	default:
		rule = labelNone
	}
	switch {
	case st.Code == limit.CodeOverLimit:
		result = resultOverLimit
	case st.ShadowOver:
		result = resultShadowOver
	case st.Rule == nil && st.Limit == nil:
		result = labelUnknown
	default:
		result = resultOK
	}
	return rule, result
}

// descriptorLabel renders entries as "k1=v1,k2=v2", an entry without a
// value as its key alone (see limit.Domain.MetricEntries). A rule opts in
// to this cardinality with detailed_metric or value_to_metric. Label
// values must be UTF-8 (the client library panics otherwise), and entries
// come from the client.
func descriptorLabel(entries []limit.Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('=')
			b.WriteString(e.Value)
		}
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}
