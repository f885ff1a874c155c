package accesslog

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric label values.
const (
	resultReconciled = "reconciled"
	resultDuplicate  = "duplicate"
	resultIgnored    = "ignored"
	resultInvalid    = "invalid"
	resultError      = "error"

	directionRefund = "refund"
	directionCharge = "charge"
)

// metrics are the service's per-instance collectors, registered on the
// Registerer the caller passes in.
type metrics struct {
	entries    *prometheus.CounterVec
	duplicates prometheus.Counter
	tokens     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		entries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_accesslog_entries_total",
			Help: "Access log entries received, by result: reconciled, duplicate (already settled), ignored (no reservation, not the request's last entry, TCP, or a domain the rules dropped), invalid (an unreadable reservation), error (the store failed; the reservation stands and its leases expire).",
		}, []string{"result"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_accesslog_duplicates_total",
			Help: "Access log entries whose reservation was already settled: Envoy delivered the entry again, to this replica or another.",
		}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_accesslog_reconciled_tokens_total",
			Help: "Tokens settled against reservations, by direction: refund (the estimate was higher than the usage) or charge (lower).",
		}, []string{"direction"}),
	}
	// Every series exists from the start, so rate() and alerts see a zero.
	for _, r := range []string{resultReconciled, resultDuplicate, resultIgnored, resultInvalid, resultError} {
		m.entries.WithLabelValues(r)
	}
	m.tokens.WithLabelValues(directionRefund)
	m.tokens.WithLabelValues(directionCharge)
	for _, c := range []prometheus.Collector{m.entries, m.duplicates, m.tokens} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register accesslog metrics: %w", err)
		}
	}
	return m, nil
}
