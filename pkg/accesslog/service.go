// Package accesslog serves Envoy's AccessLogService v3 (StreamAccessLogs,
// the http_grpc access logger): it learns each request's outcome after the
// response. For a request Check admitted with a reservation (the ticket in
// the ext_authz dynamic metadata, see package reservation), it settles the
// reservation with limit.Limiter.Reconcile: the concurrency leases are
// released and the difference between the estimate and the actual usage,
// read from a response header, is refunded into the window it was reserved
// in or charged. Reconcile runs at most once per reservation, so an entry
// Envoy delivers twice, to this replica or another, counts once.
//
// The other way to reconcile needs no access log: Envoy's rate limit
// filter with apply_on_stream_done sends a descriptor with a hits_addend
// taken from the response (a usage header or dynamic metadata) after the
// response, charging the actual usage, and a descriptor with
// is_negative_hits refunds the amount reserved. That charges after the
// fact without the reservation's window, but works where no access log
// stream is configured.
//
// Every request's final entry's outcome also goes to an Observer, for the
// circuit breaker and the pressure score.
//
// The service trusts its callers as ShouldRateLimit does (a descriptor
// with is_negative_hits refunds there): anyone who can reach the gRPC port
// can send entries, so the port belongs behind mTLS or a network policy.
package accesslog

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/extauthz/reservation"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// DefaultTimeout bounds the settling of one entry.
const DefaultTimeout = 2 * time.Second

// Reconciler settles reservations; *limit.Limiter is one. Rules is read
// to tell a duplicate from a reservation whose domain the rules dropped.
type Reconciler interface {
	Reconcile(ctx context.Context, req *limit.Request, at time.Time, reserved, actual uint64, haveActual bool) (bool, error)
	Rules() *limit.RuleSet
}

var _ Reconciler = (*limit.Limiter)(nil)

// Outcome is what one HTTP access log entry says about a finished request.
type Outcome struct {
	// Status is the HTTP status sent downstream; 0 when none was.
	Status uint32
	// Duration is from the first byte received to the last byte sent.
	Duration time.Duration
	// UpstreamCluster is the cluster the request was routed to.
	UpstreamCluster string
	// Tenant, Tier and Model come from Check's dynamic metadata; empty
	// for a request Check did not see.
	Tenant, Tier, Model string
	// Probes are the circuit breaker probes the request was admitted as:
	// breaker key -> probe ID, from Check's dynamic metadata or the rate
	// limit filter's (see reservation.FieldProbes); nil for none. A
	// request can probe several breakers (one per key), hence a map.
	Probes map[string]string
	// Facts are what the circuit breakers classify (see Facts); Status,
	// Duration and UpstreamCluster above repeat three of them.
	Facts breaker.Facts
	// Once is the ID of the request's verified ticket, empty without one:
	// a failure with it counts once per breaker however often the entry
	// is delivered (see breaker.Report).
	Once string
	// Final is set for the request's last entry. The Observer sees only
	// final entries (intermediate and periodic ones are skipped, so a
	// long stream counts once), so it is always true there; it is kept
	// for Observers that also serve other sources.
	Final bool
}

// Observer learns the outcome of every finished request, once, from its
// final entry: the circuit breaker and the pressure score plug in here. Observe runs on the
// stream's goroutine, so it must be quick; o is valid during the call.
type Observer interface {
	Observe(ctx context.Context, o *Outcome)
}

// Options configure a Service; the zero value is usable.
type Options struct {
	// UsageHeader is the response header holding the request's actual
	// total tokens (Optional; default none: reservations then stand as
	// estimated and only their leases are released). SetUsageHeader
	// changes it later.
	UsageHeader string
	// Observer receives every request's outcome, from its final entry
	// (Optional). SetObserver changes it later.
	Observer Observer
	// Timeout bounds the settling of one entry (Optional; default 2s).
	Timeout time.Duration
}

// Service implements alsv3.AccessLogServiceServer over a Reconciler.
type Service struct {
	alsv3.UnimplementedAccessLogServiceServer

	rec      Reconciler
	usage    atomic.Pointer[string]
	observer atomic.Pointer[Observer] // nil or a non-nil Observer
	timeout  time.Duration
	log      *zap.Logger
	metrics  *metrics
}

var _ alsv3.AccessLogServiceServer = (*Service)(nil)

// New returns a Service settling reservations with rec, logging to log
// (nil: nowhere) and registering its metrics on reg. rec and reg are
// Required; it fails when reg already holds metrics of the same names.
func New(rec Reconciler, log *zap.Logger, reg prometheus.Registerer, opts Options) (*Service, error) {
	if rec == nil || reg == nil {
		return nil, errors.New("accesslog: a Reconciler and a Registerer are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Service{rec: rec, timeout: opts.Timeout, log: log, metrics: m}
	s.SetUsageHeader(opts.UsageHeader)
	s.SetObserver(opts.Observer)
	return s, nil
}

// SetObserver changes the Observer (a rules reload rebuilds the breakers
// it feeds); nil observes nothing. Entries being handled finish with the
// Observer they started with.
func (s *Service) SetObserver(o Observer) {
	if o == nil {
		s.observer.Store(nil)
		return
	}
	s.observer.Store(&o)
}

// SetUsageHeader changes the usage header (a reload of the authz config).
func (s *Service) SetUsageHeader(name string) {
	name = strings.ToLower(name)
	s.usage.Store(&name)
}

// Register adds the service to a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	alsv3.RegisterAccessLogServiceServer(r, s)
}

// StreamAccessLogs takes one Envoy stream of access log batches until
// Envoy closes it. Entries are settled one at a time, each within the
// timeout, so one stream holds at most one store call at a time and a
// slow store slows Envoy's stream (which buffers, then drops) rather than
// piling work up here.
func (s *Service) StreamAccessLogs(stream grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	ctx := stream.Context()
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&alsv3.StreamAccessLogsResponse{})
		}
		if err != nil {
			return err
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			s.entry(ctx, e)
		}
		if n := len(msg.GetTcpLogs().GetLogEntry()); n > 0 {
			s.metrics.entries.WithLabelValues(resultIgnored).Add(float64(n))
		}
	}
}

// entry handles one HTTP entry; garbage is counted, never fatal.
func (s *Service) entry(ctx context.Context, e *datav3.HTTPAccessLogEntry) {
	common := e.GetCommonProperties()
	filters := common.GetMetadata().GetFilterMetadata()
	meta := filters[reservation.MetadataNamespace].GetFields()
	isFinal := final(common)
	if obs := s.observer.Load(); obs != nil && isFinal {
		o := Outcome{
			Status:          e.GetResponse().GetResponseCode().GetValue(),
			Duration:        common.GetDuration().AsDuration(),
			UpstreamCluster: common.GetUpstreamCluster(),
			Tenant:          meta[reservation.FieldTenant].GetStringValue(),
			Tier:            meta[reservation.FieldTier].GetStringValue(),
			Model:           meta[reservation.FieldModel].GetStringValue(),
			Facts:           Facts(e),
			Final:           true,
		}
		o.Probes = probes(o.Probes, meta)
		o.Probes = probes(o.Probes, filters[reservation.RateLimitNamespace].GetFields())
		(*obs).Observe(ctx, &o)
	}
	ticket := meta[reservation.Field].GetStringValue()
	if ticket == "" || !isFinal {
		s.metrics.entries.WithLabelValues(resultIgnored).Inc()
		return
	}
	r, err := reservation.Decode(ticket)
	if err != nil {
		s.metrics.entries.WithLabelValues(resultInvalid).Inc()
		s.log.Debug("access log entry with an unreadable reservation", zap.Error(err))
		return
	}
	if s.rec.Rules().Domain(r.Domain) == nil {
		// The rules dropped the domain since Check: nothing to settle,
		// and the leases expire by themselves.
		s.metrics.entries.WithLabelValues(resultIgnored).Inc()
		return
	}
	actual, have := usage(e.GetResponse(), *s.usage.Load())
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	done, err := s.rec.Reconcile(ctx, r.Request(), r.At, r.Tokens, actual, have)
	switch {
	case errors.Is(err, limit.ErrInvalid):
		s.metrics.entries.WithLabelValues(resultInvalid).Inc()
		s.log.Debug("access log entry with an invalid reservation", zap.Error(err))
	case err != nil:
		s.metrics.entries.WithLabelValues(resultError).Inc()
		s.log.Warn("reconcile failed; the reservation stands and its leases expire", zap.Error(err), zap.String("domain", r.Domain))
	case !done:
		s.metrics.entries.WithLabelValues(resultDuplicate).Inc()
		s.metrics.duplicates.Inc()
	default:
		s.metrics.entries.WithLabelValues(resultReconciled).Inc()
		switch {
		case !have:
		case actual < r.Tokens:
			s.metrics.tokens.WithLabelValues(directionRefund).Add(float64(r.Tokens - actual))
		case actual > r.Tokens:
			s.metrics.tokens.WithLabelValues(directionCharge).Add(float64(actual - r.Tokens))
		}
	}
}

// probes adds to dst the probe IDs of meta's FieldProbes struct; dst is
// made only when there are some.
func probes(dst map[string]string, meta map[string]*structpb.Value) map[string]string {
	for k, v := range meta[reservation.FieldProbes].GetStructValue().GetFields() {
		if id := v.GetStringValue(); id != "" && k != "" {
			if dst == nil {
				dst = make(map[string]string, 1)
			}
			dst[k] = id
		}
	}
	return dst
}

// final says whether the entry is the request's last: an intermediate or
// periodic entry comes while the request is still running, and settling
// it then would release its lease and refund its tokens too early.
func final(c *datav3.AccessLogCommon) bool {
	if c.GetIntermediateLogEntry() {
		return false
	}
	switch c.GetAccessLogType() {
	case datav3.AccessLogType_NotSet, datav3.AccessLogType_DownstreamEnd:
		return true
	}
	return false
}

// usage reads the actual total tokens from the response header name, or
// from the trailer of that name for a streamed response that reports its
// usage at the end. A missing or malformed value is no usage.
func usage(r *datav3.HTTPResponseProperties, name string) (uint64, bool) {
	if name == "" {
		return 0, false
	}
	for _, m := range [...]map[string]string{r.GetResponseHeaders(), r.GetResponseTrailers()} {
		v, ok := m[name]
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}
