package extproc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric label values.
const (
	resultUsage    = "usage"
	resultNoUsage  = "no_usage"
	resultNoTicket = "no_ticket"
	resultError    = "error"

	// Why a stream with a ticket had no usage.
	reasonNotReported = "not_reported" // the whole body was read and held no usage
	reasonCut         = "cut"          // the body ended early, before any usage
	reasonEncoding    = "encoding"     // a content-encoding other than gzip, or a corrupt gzip body
	reasonTooLarge    = "too_large"    // a gzip body decoding to more than MaxDecodedBytes

	bodyAdded     = "added"     // include_usage was added
	bodyUnchanged = "unchanged" // the body was left alone
	bodyNoTicket  = "no_ticket" // no reservation: nothing to account, nothing changed
)

// metrics are the service's per-instance collectors, registered on the
// Registerer the caller passes in. No label carries a ticket, tenant or
// model.
type metrics struct {
	streams   *prometheus.CounterVec
	noUsage   *prometheus.CounterVec
	bodyBytes prometheus.Counter
	settle    prometheus.Histogram
	requests  *prometheus.CounterVec

	// Children resolved once: the stream path does no label lookups.
	byResult map[string]prometheus.Counter
	byReason map[string]prometheus.Counter
	byBody   map[string]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_extproc_streams_total",
			Help: "ext_proc streams (one per HTTP request), by result: usage (the response reported usage), no_usage (a reservation but no usage: see tollgate_extproc_no_usage_total), no_ticket (no reservation in the ext_authz metadata: nothing read), error (a malformed ticket, not settled; or the stream failed with an error other than a cancel, settled as cut).",
		}, []string{"result"}),
		noUsage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_extproc_no_usage_total",
			Help: "Streams with a reservation whose response reported no usage, by reason: not_reported (the whole body was read; e.g. a stream without stream_options.include_usage), cut (the body ended early), encoding (a content-encoding other than gzip, or a corrupt gzip body), too_large (a gzip body over the decoded bound).",
		}, []string{"reason"}),
		bodyBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_extproc_response_body_bytes_total",
			Help: "Response body bytes received from Envoy for streams with a reservation, as sent (compressed when the body is).",
		}),
		settle: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_extproc_settle_duration_seconds",
			Help:    "Time the Settler took per stream with a reservation.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_extproc_request_bodies_total",
			Help: "Request bodies seen by the optional request-phase filter, by result: added (stream_options.include_usage was added), unchanged, no_ticket.",
		}, []string{"result"}),
		byResult: map[string]prometheus.Counter{},
		byReason: map[string]prometheus.Counter{},
		byBody:   map[string]prometheus.Counter{},
	}
	// Every series exists from the start, so rate() and alerts see a zero.
	for _, r := range []string{resultUsage, resultNoUsage, resultNoTicket, resultError} {
		m.byResult[r] = m.streams.WithLabelValues(r)
	}
	for _, r := range []string{reasonNotReported, reasonCut, reasonEncoding, reasonTooLarge} {
		m.byReason[r] = m.noUsage.WithLabelValues(r)
	}
	for _, r := range []string{bodyAdded, bodyUnchanged, bodyNoTicket} {
		m.byBody[r] = m.requests.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.streams, m.noUsage, m.bodyBytes, m.settle, m.requests} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register extproc metrics: %w", err)
		}
	}
	return m, nil
}
