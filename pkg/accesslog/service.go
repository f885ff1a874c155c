// Package accesslog serves Envoy's AccessLogService v3 (StreamAccessLogs,
// the http_grpc access logger): it learns each request's outcome after the
// response. Every request Tollgate admitted carries a signed ticket in its
// dynamic metadata (package ticket: Check's under the ext_authz namespace,
// ShouldRateLimit's under the rate limit filter's), which package outcome
// opens. An entry whose ticket verifies settles the request's reservation
// when the entry carries usage (a usage header), or else releases its
// concurrency leases and leaves the tokens to the ext_proc report that
// reads usage from the body; and its outcome goes to an Observer, for the
// circuit breakers and the pressure score. An entry without a ticket, or
// with one that does not verify, changes nothing: anyone who reaches the
// port can send entries, so nothing but a ticket a replica sealed may
// move a budget, a breaker or the pressure (restrict the callers too:
// pkg/server's caller allow-list, or the Istio policy in istio/).
//
// The other way to reconcile needs no access log: Envoy's rate limit
// filter with apply_on_stream_done sends a descriptor with a hits_addend
// taken from the response (a usage header or dynamic metadata) after the
// response, charging the actual usage, and a descriptor with
// is_negative_hits refunds the amount reserved. That charges after the
// fact without the reservation's window, but works where no access log
// stream is configured.
package accesslog

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// Outcome is what one HTTP access log entry says about a finished request
// that Tollgate admitted: the entry's facts, and the decision's from its
// verified ticket.
type Outcome struct {
	// Status is the HTTP status sent downstream; 0 when none was.
	Status uint32
	// Duration is from the first byte received to the last byte sent.
	Duration time.Duration
	// UpstreamCluster is the cluster the request was routed to.
	UpstreamCluster string
	// Domain, Tier and Model are the decision's, from the ticket.
	Domain, Tier, Model string
	// ID is the ticket's: a report of the same request carries the same.
	ID string
	// Breakers are the breakers the request's outcome counts for, with
	// the probes it holds on them (see outcome.Loop.Breakers).
	Breakers []outcome.Breaker
	// Facts are what the circuit breakers classify (see Facts and
	// docs/outcome-classes.md); Status, Duration and UpstreamCluster
	// above repeat three of them.
	Facts breaker.Facts
}

// Observer learns the outcome of every finished request Tollgate admitted,
// once, from its final entry: the circuit breaker and the pressure score
// plug in here. Observe runs on the stream's goroutine, so it must be
// quick; o is valid during the call.
type Observer interface {
	Observe(ctx context.Context, o *Outcome)
}

// Options configure a Service; the zero value is usable.
type Options struct {
	// UsageHeader is the response header holding the request's actual
	// total tokens (Optional; default none: usage then comes from
	// ext_proc). SetUsageHeader changes it later.
	UsageHeader string
	// Observer receives every admitted request's outcome, from its final
	// entry (Optional). SetObserver changes it later.
	Observer Observer
}

// Service implements alsv3.AccessLogServiceServer over an outcome.Loop.
type Service struct {
	alsv3.UnimplementedAccessLogServiceServer

	loop     *outcome.Loop
	usage    atomic.Pointer[string]
	observer atomic.Pointer[Observer] // nil or a non-nil Observer
	log      *zap.Logger
	metrics  *metrics
}

var _ alsv3.AccessLogServiceServer = (*Service)(nil)

// New returns a Service settling outcomes through loop, logging to log
// (nil: nowhere) and registering its metrics on reg. loop and reg are
// Required; it fails when reg already holds metrics of the same names.
func New(loop *outcome.Loop, log *zap.Logger, reg prometheus.Registerer, opts Options) (*Service, error) {
	if loop == nil || reg == nil {
		return nil, errors.New("accesslog: an outcome Loop and a Registerer are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Service{loop: loop, log: log, metrics: m}
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
// loop's timeout, so one stream holds at most one store call at a time
// and a slow store slows Envoy's stream (which buffers, then drops)
// rather than piling work up here.
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
	checked, limited := tickets(common)
	if checked == "" && limited == "" || !final(common) {
		s.metrics.entries.WithLabelValues(resultIgnored).Inc()
		return
	}
	t := s.open(checked, limited)
	if t == nil {
		s.metrics.entries.WithLabelValues(resultRejected).Inc()
		return
	}
	if obs := s.observer.Load(); obs != nil {
		o := Outcome{
			Status:          e.GetResponse().GetResponseCode().GetValue(),
			Duration:        common.GetDuration().AsDuration(),
			UpstreamCluster: common.GetUpstreamCluster(),
			Domain:          t.Domain,
			Tier:            t.Tier,
			Model:           t.Model,
			ID:              t.ID,
			Breakers:        s.loop.Breakers(t),
			Facts:           Facts(e),
		}
		(*obs).Observe(ctx, &o)
	}
	actual, have := usage(e.GetResponse(), *s.usage.Load())
	r := s.loop.Report(ctx, outcome.ChannelAccessLog, t, outcome.Usage{Total: actual, Reported: have})
	s.metrics.entries.WithLabelValues(r.String()).Inc()
}

// tickets returns the entry's tickets: Check's, and the rate limit
// filter's, either of which may be missing.
func tickets(c *datav3.AccessLogCommon) (checked, limited string) {
	filters := c.GetMetadata().GetFilterMetadata()
	return filters[ticket.MetadataNamespace].GetFields()[ticket.Field].GetStringValue(),
		filters[ticket.RateLimitNamespace].GetFields()[ticket.Field].GetStringValue()
}

// open opens the entry's ticket: Check's, which holds the reservation,
// else the rate limit filter's. A request that passed both filters while
// a breaker was half-open may hold a probe from each; the rate limit
// filter's probes ride along on Check's ticket for the breakers Check's
// holds none on, so that their slots are freed too. A ticket that does
// not verify adds nothing.
func (s *Service) open(checked, limited string) *ticket.Ticket {
	var t, rl *ticket.Ticket
	if checked != "" {
		t = s.loop.Open(outcome.ChannelAccessLog, checked)
	}
	if limited != "" {
		rl = s.loop.Open(outcome.ChannelAccessLog, limited)
	}
	switch {
	case t == nil:
		return rl
	case rl == nil || len(rl.Probes) == 0 || rl.Domain != t.Domain:
		return t
	}
	for _, p := range rl.Probes {
		if !slices.ContainsFunc(t.Probes, func(q limit.Probe) bool { return q.Key == p.Key && q.Name == p.Name }) {
			t.Probes = append(t.Probes, p)
		}
	}
	return t
}

// final says whether the entry is the request's last: an intermediate or
// periodic entry comes while the request is still running, and settling
// it then would release its lease and refund its tokens too early.
func final(c *datav3.AccessLogCommon) bool {
	if c.GetIntermediateLogEntry() { //nolint:staticcheck // SA1019: replaced by access_log_type, which older Envoys do not send
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
