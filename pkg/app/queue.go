package app

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
)

// queueMetrics are the admission queue's (docs/admission-queue.md). The
// labels are the domain and the tier, which the rules name (a request's
// tier is one of its domain's plans or its default), so they stay bounded.
type queueMetrics struct {
	length  *prometheus.GaugeVec
	wait    *prometheus.HistogramVec
	timeout *prometheus.CounterVec
	shed    *prometheus.CounterVec
}

var _ admission.QueueObserver = (*queueMetrics)(nil)

// newQueueMetrics registers the queue's metrics on reg.
func newQueueMetrics(reg prometheus.Registerer) (*queueMetrics, error) {
	m := &queueMetrics{
		length: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tollgate_queue_length",
			Help: "Requests waiting in this replica's admission queue, by domain and tier.",
		}, []string{"domain", "tier"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tollgate_queue_wait_seconds",
			Help:    "How long requests waited in the admission queue, by domain, tier and outcome (admitted, timeout, refused by another stage, gone).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10, 30},
		}, []string{"domain", "tier", "outcome"}),
		timeout: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_queue_timeouts_total",
			Help: "Waits that reached their tier's max_wait (or the caller's deadline) and were answered with the refusal.",
		}, []string{"domain", "tier"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_queue_shed_total",
			Help: "Refusals of a tier that may wait, answered at once: full (the tier's max_length waiting on this replica) or deadline (the caller's deadline left no time).",
		}, []string{"domain", "tier", "cause"}),
	}
	for _, c := range []prometheus.Collector{m.length, m.wait, m.timeout, m.shed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register queue metrics: %w", err)
		}
	}
	return m, nil
}

// Queued moves the length gauge.
func (m *queueMetrics) Queued(domain, tier string, delta int) {
	m.length.WithLabelValues(domain, tier).Add(float64(delta))
}

// Waited records a wait, and counts a timeout.
func (m *queueMetrics) Waited(domain, tier string, d time.Duration, o admission.QueueOutcome) {
	m.wait.WithLabelValues(domain, tier, o.String()).Observe(d.Seconds())
	if o == admission.QueueTimeout {
		m.timeout.WithLabelValues(domain, tier).Inc()
	}
}

// Shed counts a refusal answered without a wait.
func (m *queueMetrics) Shed(domain, tier string, full bool) {
	cause := "deadline"
	if full {
		cause = "full"
	}
	m.shed.WithLabelValues(domain, tier, cause).Inc()
}
