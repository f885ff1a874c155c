package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/logpace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Callers is an allow-list of caller identities per API on the gRPC port:
// a gRPC service name, such as envoy.service.accesslog.v3.AccessLogService,
// maps to the URI SANs (SPIFFE IDs, for instance) of the client
// certificates that may call it. A service not in the list stays open to
// every client the TLS handshake admits. A Callers is immutable; build it
// with NewCallers.
//
// Mutual TLS alone admits every certificate the client CA signed, and in a
// mesh every workload holds one. Signed tickets do not help against a
// workload that calls Check itself, gets genuine tickets and then reports
// false outcomes for them: only the caller's identity can tell it from the
// gateway, so the outcome APIs are the ones to restrict.
type Callers struct {
	services map[string]*callerSet
}

// callerSet is the SANs allowed to call one service.
type callerSet struct {
	exact    map[string]bool
	prefixes []string // each ends in "/"
}

// NewCallers builds Callers from gRPC service name -> allowed URI SANs.
// A SAN matches exactly, except one written with a trailing "/*", which
// matches every SAN that starts with what comes before the "*":
// spiffe://cluster.local/ns/gateways/sa/* admits every service account of
// namespace gateways. A prefix ends at a "/" so that it cannot reach into
// a neighbour's name (sa/gateway* would also admit sa/gateway-evil).
//
// A SAN must be an absolute URI written as Go's net/url writes it back,
// since that is the form a certificate's SANs are compared in. Every
// service needs at least one SAN.
func NewCallers(allow map[string][]string) (*Callers, error) {
	if len(allow) == 0 {
		return nil, errors.New("callers: no service listed")
	}
	c := &Callers{services: make(map[string]*callerSet, len(allow))}
	for _, service := range slices.Sorted(maps.Keys(allow)) {
		if service == "" || strings.ContainsAny(service, "/ \t") {
			return nil, fmt.Errorf("callers: service %q: want a gRPC service name such as envoy.service.accesslog.v3.AccessLogService", service)
		}
		sans := allow[service]
		if len(sans) == 0 {
			return nil, fmt.Errorf("callers: %s: no SAN listed, so nothing could call it", service)
		}
		set := &callerSet{exact: map[string]bool{}}
		for _, san := range sans {
			prefix, err := parseSAN(san)
			if err != nil {
				return nil, fmt.Errorf("callers: %s: %w", service, err)
			}
			if set.exact[san] || slices.Contains(set.prefixes, prefix) {
				return nil, fmt.Errorf("callers: %s: %q is listed twice", service, san)
			}
			if prefix != "" {
				set.prefixes = append(set.prefixes, prefix)
			} else {
				set.exact[san] = true
			}
		}
		c.services[service] = set
	}
	return c, nil
}

// parseSAN checks one allowed SAN and returns its prefix when it is one
// ("" for an exact SAN).
func parseSAN(san string) (prefix string, err error) {
	if san == "" {
		return "", errors.New("an empty SAN")
	}
	if strings.IndexFunc(san, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return "", fmt.Errorf("SAN %q holds a space or control character", san)
	}
	body := san
	if strings.HasSuffix(san, "*") {
		body = strings.TrimSuffix(san, "*")
		if !strings.HasSuffix(body, "/") {
			return "", fmt.Errorf("SAN %q: a prefix ends in /*, so that it stops at a path segment", san)
		}
		prefix = body
	}
	if strings.Contains(body, "*") {
		return "", fmt.Errorf("SAN %q: * is allowed only as a trailing /*", san)
	}
	u, err := url.Parse(body)
	switch {
	case err != nil:
		return "", fmt.Errorf("SAN %q is not a URI: %w", san, err)
	case u.Scheme == "":
		return "", fmt.Errorf("SAN %q is not an absolute URI (such as spiffe://cluster.local/ns/NAMESPACE/sa/ACCOUNT)", san)
	case prefix != "" && u.Host == "":
		return "", fmt.Errorf("SAN %q: a prefix must name an authority (spiffe://TRUST-DOMAIN/...)", san)
	case u.String() != body:
		// Certificates' SANs are compared as net/url writes them; a SAN
		// written otherwise could never match.
		return "", fmt.Errorf("SAN %q: write it as %q", san, u.String()+strings.TrimPrefix(san, body))
	}
	return prefix, nil
}

// restricts returns the callers of service, or nil when it is open.
func (c *Callers) restricts(service string) *callerSet {
	if c == nil {
		return nil
	}
	return c.services[service]
}

// Services are the restricted gRPC service names, sorted.
func (c *Callers) Services() []string {
	if c == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(c.services))
}

// allows reports whether one of sans is allowed.
func (s *callerSet) allows(sans []string) bool {
	for _, san := range sans {
		if s.exact[san] {
			return true
		}
		for _, p := range s.prefixes {
			if strings.HasPrefix(san, p) {
				return true
			}
		}
	}
	return false
}

// callerLogEvery is how often, at most, a refused caller of one service is
// logged: a refused Envoy retries its access log stream every few
// seconds, forever, and one line with a count says as much as thousands.
const callerLogEvery = 10 * time.Second

// callerGuard enforces Callers on every call, unary or stream.
type callerGuard struct {
	callers *Callers
	denied  *prometheus.CounterVec
	log     *zap.Logger
	now     func() time.Time // tests move it instead of sleeping

	mu    sync.Mutex
	paces map[string]*logpace.Pace // by service: the denials' log lines
}

func newCallerGuard(c *Callers, log *zap.Logger) *callerGuard {
	g := &callerGuard{
		callers: c,
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_grpc_caller_denied_total",
			Help: "Calls refused with PERMISSION_DENIED because the client certificate has no URI SAN allowed for the service (--allow-callers), by gRPC service.",
		}, []string{"service"}),
		log:   log,
		now:   time.Now,
		paces: map[string]*logpace.Pace{},
	}
	for _, s := range c.Services() {
		g.denied.WithLabelValues(s) // every restricted service shows a 0
		set := c.services[s]
		log.Info("callers restricted", zap.String("service", s),
			zap.Strings("uri_sans", slices.Sorted(maps.Keys(set.exact))), zap.Strings("uri_san_prefixes", set.prefixes))
	}
	return g
}

func (g *callerGuard) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := g.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (g *callerGuard) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := g.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// check refuses a call to a restricted service unless the client's
// verified certificate has an allowed URI SAN. The answer names the
// service only: what the certificate holds goes to the log, for the
// operator, not back to the caller.
func (g *callerGuard) check(ctx context.Context, fullMethod string) error {
	service := serviceOf(fullMethod)
	set := g.callers.restricts(service)
	if set == nil {
		return nil
	}
	sans, verified := peerSANs(ctx)
	if set.allows(sans) {
		return nil
	}
	g.denied.WithLabelValues(service).Inc()
	g.logDenied(ctx, service, fullMethod, sans, verified)
	return status.Errorf(codes.PermissionDenied, "tollgate: this client may not call %s", service)
}

// serviceOf is the service of a full method name, "/service/method".
func serviceOf(fullMethod string) string {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i]
	}
	return s
}

// peerSANs returns the URI SANs of the client's leaf certificate, taken
// from the chain the handshake verified: a certificate merely presented
// proves nothing. verified is false when there is no verified chain.
func peerSANs(ctx context.Context) (sans []string, verified bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil, false
	}
	leaf := info.State.VerifiedChains[0][0]
	sans = make([]string, 0, len(leaf.URIs))
	for _, u := range leaf.URIs {
		sans = append(sans, u.String())
	}
	return sans, true
}

// logDenied logs a refusal at most once per callerLogEvery and service,
// with how many were left out since the last line.
func (g *callerGuard) logDenied(ctx context.Context, service, method string, sans []string, verified bool) {
	g.mu.Lock()
	p := g.paces[service]
	if p == nil {
		// Services are the registered ones: the map stays small.
		p = &logpace.Pace{Every: callerLogEvery}
		g.paces[service] = p
	}
	n, ok := p.Event(g.now())
	g.mu.Unlock()
	if !ok {
		return
	}
	suppressed := int(n - 1) // the denials held back before this one

	fields := []zap.Field{
		zap.String("service", service),
		zap.String("method", method),
		zap.Strings("uri_sans", sans), // identities, not secrets
		zap.Bool("verified_certificate", verified),
		zap.Int("suppressed", suppressed),
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		fields = append(fields, zap.String("peer", p.Addr.String()))
	}
	g.log.Warn("caller not allowed", fields...)
}

// guardCallers builds the guard of s.cfg.Callers and registers its metric.
// A caller allow-list without client certificates is refused: no call to
// a listed service could ever pass.
func (s *Server) guardCallers() (*callerGuard, error) {
	if s.cfg.TLS == nil || s.cfg.TLS.ClientCAFile == "" {
		return nil, errors.New("server: a caller allow-list needs mutual TLS (a client CA file): without client certificates no caller could match")
	}
	g := newCallerGuard(s.cfg.Callers, s.log)
	if s.cfg.Registerer != nil {
		if err := s.cfg.Registerer.Register(g.denied); err != nil {
			return nil, fmt.Errorf("server: register metrics: %w", err)
		}
	}
	return g, nil
}
