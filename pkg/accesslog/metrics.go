package accesslog

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/outcome"
)

// Metric label values.
const (
	resultIgnored  = "ignored"
	resultRejected = "rejected"
)

// metrics are the service's per-instance collectors, registered on the
// Registerer the caller passes in.
type metrics struct {
	entries *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		entries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_accesslog_entries_total",
			Help: "Access log entries received, by result: ignored (no ticket, not the request's last entry, or TCP), rejected (a ticket that does not verify: nothing changed), or what the verified ticket's report did (tollgate_outcome_reports_total's results: settled, duplicate, released, error, nothing).",
		}, []string{"result"}),
	}
	// Every series exists from the start, so rate() and alerts see a zero.
	for _, r := range []string{resultIgnored, resultRejected, outcome.Nothing.String(), outcome.Settled.String(),
		outcome.Duplicate.String(), outcome.Released.String(), outcome.Failed.String()} {
		m.entries.WithLabelValues(r)
	}
	if err := reg.Register(m.entries); err != nil {
		return nil, fmt.Errorf("register accesslog metrics: %w", err)
	}
	return m, nil
}
