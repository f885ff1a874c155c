// Package rls serves Envoy's RateLimitService v3 (ShouldRateLimit). It is
// the only place where go-control-plane's rate limit protos meet the
// limit domain: it converts a RateLimitRequest to a limit.Request, asks
// the Limiter, and converts the Decision back, with the draft-03 headers.
package rls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// Decider answers admission questions; *admission.Limiter is one. Rules is
// read only to tell known domains from unknown ones in metric labels.
// Decide must not keep req once it returns: the Service reuses it.
type Decider interface {
	Decide(ctx context.Context, req *limit.Request) (*admission.Decision, error)
	Rules() *limit.RuleSet
}

var _ Decider = (*admission.Limiter)(nil)

// Service implements rlsv3.RateLimitServiceServer over a Decider.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	decider Decider
	sealer  atomic.Pointer[ticket.Sealer]
	log     *zap.Logger
	metrics *metrics
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New returns a Service over d that logs to log (nil: nowhere) and
// registers its metrics on reg (Required). It fails when reg already
// holds metrics of the same names.
func New(d Decider, log *zap.Logger, reg prometheus.Registerer, opts ...Option) (*Service, error) {
	if d == nil || reg == nil {
		return nil, errors.New("rls: a Decider and a Registerer are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	o := options{detailedCap: DefaultDetailedSeriesCap}
	for _, opt := range opts {
		opt(&o)
	}
	m, err := newMetrics(reg, o)
	if err != nil {
		return nil, err
	}
	svc := &Service{decider: d, log: log, metrics: m}
	// Until SetSealer, tickets open only in this process: the caller
	// shares one Sealer with the services that open them.
	svc.sealer.Store(ticket.LocalSealer())
	return svc, nil
}

// SetSealer sets the Sealer tickets are sealed with: the one the access
// log opens them with.
func (s *Service) SetSealer(t *ticket.Sealer) {
	if t != nil {
		s.sealer.Store(t)
	}
}

// Register adds the service to a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(r, s)
}

// ShouldRateLimit answers one Envoy rate limit check.
func (s *Service) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	defer func() { s.metrics.duration.Observe(time.Since(start).Seconds()) }()

	if in.GetDomain() == "" {
		// Checked here too so that a nil request never reaches the Limiter.
		return nil, s.fail(ctx, "", limit.ErrInvalid, "domain is empty")
	}
	r := toRequest(in)
	defer r.release()
	req := &r.req
	dec, err := s.decider.Decide(ctx, req)
	if err != nil {
		return nil, s.fail(ctx, req.Domain, err, "")
	}
	dom := s.decider.Rules().Domain(req.Domain)
	s.metrics.observe(req.Domain, dom, req, dec)
	resp := toResponse(dec)
	if dec.Code == limit.CodeOK && dom != nil && (len(dom.Breakers) > 0 || dom.Shedding != nil) {
		// The outcome of a request admitted here reaches the breakers and
		// the pressure score only with a ticket, which the rate limit
		// filter emits as dynamic metadata for the access log.
		resp.DynamicMetadata = s.ticket(req, dec)
	}
	if dom != nil {
		resp.DynamicMetadata = addMetadata(resp.DynamicMetadata, ruleMetadata(req, dec))
	}
	return resp, nil
}

// ticket is the dynamic metadata holding an admitted request's ticket.
// RLS calls carry no request ID, so the ticket gets a random one (the
// controller's flight ID, when it began one): it makes every once-only
// use of the ticket (a breaker failure) count once.
func (s *Service) ticket(req *limit.Request, dec *admission.Decision) *structpb.Struct {
	// A request the overload controller counts in flight carries its
	// flight's ID, so that its completion ends the flight.
	tid := dec.Flight
	if tid == "" {
		var id [16]byte
		_, _ = rand.Read(id[:]) // never fails (crypto/rand, Go 1.24+)
		tid = hex.EncodeToString(id[:])
	}
	t := ticket.Ticket{
		ID:          tid,
		Domain:      req.Domain,
		Descriptors: req.Descriptors,
		Tier:        dec.Tier,
		Model:       req.Model,
		At:          dec.At,
		Probes:      dec.Probes,
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		ticket.Field: structpb.NewStringValue(s.sealer.Load().Seal(&t)),
	}}
}

// fail logs and counts err once and returns its gRPC status.
func (s *Service) fail(ctx context.Context, domain string, err error, msg string) error {
	st := toGRPCStatus(ctx, err, msg)
	switch st.Code() {
	case codes.InvalidArgument:
		s.metrics.invalid.Inc()
		s.log.Debug("invalid rate limit request", zap.Error(err), zap.String("domain", safeDomain(domain)))
	default:
		// Store failures are counted where they happen, by the Limiter's
		// observer (tollgate_store_errors_total); with store_failure set
		// (WithStoreFailure) only a caller that gave up gets here.
		s.log.Warn("rate limit decision failed", zap.Error(err), zap.String("domain", safeDomain(domain)), zap.Stringer("code", st.Code()))
	}
	return st.Err()
}

// toGRPCStatus is the one place that maps errors to gRPC codes. A client's
// own input is described back to it (InvalidArgument); anything else is a
// store failure and gets a fixed message, since internal error text may
// carry addresses or keys. msg, when set, replaces err's text.
func toGRPCStatus(ctx context.Context, err error, msg string) *status.Status {
	switch {
	case errors.Is(err, limit.ErrInvalid):
		if msg == "" {
			msg = err.Error()
		}
		return status.New(codes.InvalidArgument, msg)
	case ctx.Err() != nil:
		// The caller gave up (Envoy's timeout): say so, not "unavailable".
		return status.FromContextError(ctx.Err())
	default:
		return status.New(codes.Unavailable, "rate limit store unavailable")
	}
}

// safeDomain bounds what a client-chosen domain can put in a log line.
func safeDomain(d string) string {
	if len(d) > limit.MaxDomainBytes {
		return d[:limit.MaxDomainBytes] + "..."
	}
	return d
}
