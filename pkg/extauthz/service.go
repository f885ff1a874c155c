// Package extauthz serves Envoy's ext_authz Check (envoy.service.auth.v3),
// the way in for Istio's AuthorizationPolicy CUSTOM. It is the only
// package that imports the ext_authz protos: it works out who is calling
// (an API key, or headers a trusted layer set), what is asked for (the
// model, and a token estimate from the JSON body), asks the same
// admission.Limiter ShouldRateLimit asks, and answers the way an AI API client
// expects: OK with identity headers and a reservation in the dynamic
// metadata, or a denial with an OpenAI-style JSON body.
//
// Every admitted request carries a signed ticket in the dynamic metadata
// (package ticket), which the access log and ext_proc bring back with
// its outcome and usage (package outcome).
//
// A store that cannot answer is answered by the rules' store_failure
// (allow, deny or a local limit) when the Limiter has one
// (admission.WithStoreFailure), and the answer carries x-tollgate-degraded:
// store. Without one, a store failure is not a denial: Check returns gRPC
// Unavailable, as ShouldRateLimit does, and Envoy applies
// failure_mode_allow (admit) or status_on_error (deny, 403 unless set).
package extauthz

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// ContextDomain is the ext_authz context extension (a route's
// check_settings.context_extensions) that overrides Settings.Domain.
const ContextDomain = "tollgate.domain"

// PartialBodyHeader is the header Envoy's ext_authz filter adds to a
// Check whenever it buffered the body (with_request_body): "true" when it
// sent only the first max_request_bytes (allow_partial_message), "false"
// otherwise. Envoy drops any header of this name the client sent.
const PartialBodyHeader = "x-envoy-auth-partial-body"

// Decider answers admission questions; *admission.Limiter is one. Rules is
// read only to tell known domains from unknown ones in metric labels.
type Decider interface {
	Decide(ctx context.Context, req *limit.Request) (*admission.Decision, error)
	Rules() *limit.RuleSet
}

var _ Decider = (*admission.Limiter)(nil)

// Service implements authv3.AuthorizationServer over a Decider.
type Service struct {
	authv3.UnimplementedAuthorizationServer

	decider  Decider
	settings atomic.Pointer[Settings]
	sealer   atomic.Pointer[ticket.Sealer]
	log      *zap.Logger
	metrics  *metrics
	// newID names a reservation (reservationID; tests make it predictable).
	newID func(requestID string) string
}

var _ authv3.AuthorizationServer = (*Service)(nil)

// New returns a Service deciding with d under settings s, logging to log
// (nil: nowhere) and registering its metrics on reg. d, s and reg are
// Required; it fails when reg already holds metrics of the same names.
func New(d Decider, s *Settings, log *zap.Logger, reg prometheus.Registerer) (*Service, error) {
	if d == nil || s == nil || reg == nil {
		return nil, errors.New("extauthz: a Decider, Settings and a Registerer are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	svc := &Service{decider: d, log: log, metrics: m, newID: reservationID}
	svc.settings.Store(s)
	// Until SetSealer, tickets open only in this process: the caller
	// shares one Sealer with the services that open them.
	svc.sealer.Store(ticket.LocalSealer())
	return svc, nil
}

// SetSealer sets the Sealer tickets are sealed with: the one the outcome
// channels open them with.
func (s *Service) SetSealer(t *ticket.Sealer) {
	if t != nil {
		s.sealer.Store(t)
	}
}

// SetSettings swaps the settings atomically (a reload); calls in flight
// finish on the old ones.
func (s *Service) SetSettings(set *Settings) {
	if set != nil {
		s.settings.Store(set)
	}
}

// Settings returns the settings in force.
func (s *Service) Settings() *Settings { return s.settings.Load() }

// Register adds the service to a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	authv3.RegisterAuthorizationServer(r, s)
}

// call is what Check learned about one request, for its answer.
type call struct {
	domain  string
	id      authn.Identity
	model   string
	partial bool
	tokens  uint64
	prompt  uint64 // the prompt's part of tokens
	req     *limit.Request
	dec     *admission.Decision
	// sealer seals the admitted request's ticket.
	sealer *ticket.Sealer
}

// Check answers one Envoy authorization check.
func (s *Service) Check(ctx context.Context, in *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := time.Now()
	defer func() { s.metrics.duration.Observe(time.Since(start).Seconds()) }()

	set := s.settings.Load()
	c := &call{domain: set.Domain, sealer: s.sealer.Load()}
	if d := in.GetAttributes().GetContextExtensions()[ContextDomain]; d != "" {
		c.domain = d
	}
	err := s.decide(ctx, set, in, c)
	resp, result, gerr := toAnswer(ctx, err, c)
	if result == resultOK && c.dec != nil && c.dec.ShadowShed {
		result = resultShadowShed
	}
	s.observe(c, result, err)
	return resp, gerr
}

// decide fills c and makes the decision; an error is a refusal (a
// *problem) or a failure (anything else), which toAnswer maps.
func (s *Service) decide(ctx context.Context, set *Settings, in *authv3.CheckRequest, c *call) error {
	h := in.GetAttributes().GetRequest().GetHttp()
	headers := h.GetHeaders()
	get := func(name string) string { return headers[name] }

	id, err := identify(set, get)
	if err != nil {
		return err
	}
	c.id = id

	// A body Envoy cut, or did not send at all (no with_request_body on
	// the route: a cut with nothing before it), is decided on only when
	// what is missing cannot make the decision cheaper (refusePartial),
	// and is estimated from the whole body's size.
	sent := len(h.GetRawBody()) // what readBody parses: raw_body, else body
	if sent == 0 {
		sent = len(h.GetBody())
	}
	shape := shapeOf(h, int64(sent))
	body, err := readBody(set, h, shape)
	if err != nil {
		return err
	}
	if shape.cut {
		if p := refusePartial(set, shape, body.Model); p != nil {
			return p
		}
	}
	c.partial = shape.cut
	c.model = body.Model
	if c.model == "" && set.ModelHeader != "" {
		c.model = get(set.ModelHeader)
	}

	a := new(question)
	descs, err := descriptors(set, c, h, get, a.descs[:0], a.entries[:0])
	if err != nil {
		return err
	}
	c.tokens, c.prompt = estimate(&body, set, shape.cut, shape.least)
	if len(descs) == 0 {
		return nil // nothing to limit this request by: admitted, no reservation
	}
	a.req = limit.Request{
		Domain:      c.domain,
		Descriptors: descs,
		Tokens:      c.tokens,
		TokensSet:   true,
		Overrides:   id.Overrides,
		ID:          s.newID(h.GetId()),
		// The plan multiplier comes from who is calling (the key's tier,
		// or the trusted header's); a tier entry the descriptors mapping
		// builds agrees with it, and is removed before matching anyway.
		Tier: id.Tier,
		// The model picks the pressure scope and the breaker on "model"
		// even when the descriptors mapping leaves it out.
		Model: c.model,
	}
	c.req = &a.req
	c.dec, err = s.decider.Decide(ctx, c.req)
	return err
}

// question is a request's limit.Request with room for its descriptors:
// one allocation between them for a mapping of a few short descriptors,
// as mappings are.
type question struct {
	req     limit.Request
	descs   [4]limit.Descriptor
	entries [8]limit.Entry
}

// identify works out who is calling: the API key's identity or, when the
// config allows calls without a key, the trusted headers'.
func identify(set *Settings, get func(string) string) (authn.Identity, error) {
	key, has := "", false
	if set.Keys != nil || set.RequireAPIKey {
		key, has = authn.KeyFromHeaders(get, set.APIKeyHeaders)
	}
	switch {
	case has:
		id, ok := set.Keys.Lookup(key)
		if !ok {
			return id, errUnknownKey
		}
		return id, nil
	case set.RequireAPIKey:
		return authn.Identity{}, errMissingKey
	}
	id := authn.Identity{Tenant: get(set.TenantHeader)}
	if set.TierHeader != "" {
		id.Tier = get(set.TierHeader)
	}
	if id.Tenant == "" {
		return id, errMissingKey
	}
	return id, nil
}

// readBody parses the request body within the config's bounds: a body
// that is (or, cut, may be) larger than MaxBodyBytes is refused whole,
// whatever part of it Envoy sent.
func readBody(set *Settings, h *authv3.AttributeContext_HttpRequest, shape bodyShape) (Body, error) {
	if shape.least > set.MaxBodyBytes {
		return Body{Choices: 1}, &problem{status: 413, errCode: "request_too_large", msg: tooLargeMessage(set.MaxBodyBytes), result: resultBadRequest}
	}
	var b Body
	var err error
	ep := EndpointOf(h.GetPath())
	if raw := h.GetRawBody(); len(raw) > 0 {
		b, err = parseBody(raw, set.ModelBodyField, ep, shape.cut)
	} else {
		b, err = parseBody(h.GetBody(), set.ModelBodyField, ep, shape.cut)
	}
	if be, ok := err.(*bodyError); ok {
		return b, &problem{status: 400, errCode: be.code, msg: be.msg, param: be.param, result: resultBadRequest}
	}
	return b, err
}

// descriptors builds the request's descriptors from the mapping,
// appending to out and, for their entries, to entries, which it grows
// when they are too short. An entry whose value is empty drops its
// descriptor; a value too long to be a descriptor refuses the request,
// since dropping it would let a client escape a limit by sending a long
// header.
func descriptors(set *Settings, c *call, h *authv3.AttributeContext_HttpRequest, get func(string) string, out []limit.Descriptor, entries []limit.Entry) ([]limit.Descriptor, error) {
	n := 0
	for _, d := range set.Descriptors {
		n += len(d)
	}
	// Every descriptor's entries share one array.
	out = slices.Grow(out, len(set.Descriptors))
	entries = slices.Grow(entries, n)
next:
	for _, d := range set.Descriptors {
		start := len(entries)
		for _, e := range d {
			v := value(e.Source, c, h, get)
			if v == "" {
				entries = entries[:start]
				continue next
			}
			if len(v) > limit.MaxValueBytes {
				return nil, errValueTooLong
			}
			entries = append(entries, limit.Entry{Key: e.Key, Value: v})
		}
		out = append(out, limit.Descriptor{Entries: entries[start:len(entries):len(entries)]})
	}
	return out, nil
}

func value(src Source, c *call, h *authv3.AttributeContext_HttpRequest, get func(string) string) string {
	switch src.Kind {
	case FromTenant:
		return c.id.Tenant
	case FromTier:
		return c.id.Tier
	case FromModel:
		return c.model
	case FromPath:
		p := h.GetPath()
		if i := strings.IndexAny(p, "?#"); i >= 0 {
			p = p[:i]
		}
		return p
	case FromMethod:
		return h.GetMethod()
	case FromHeader:
		return get(src.Arg)
	case FromLiteral:
		return src.Arg
	}
	return ""
}

// reservationID names a request's reservation and concurrency leases. It
// is random, so that no client can choose it: Envoy passes a client's
// x-request-id through in a sidecar, and a client that reused one ID
// would hold one concurrency lease for any number of requests. The
// request's own ID, when it is short and printable, comes first so logs
// and the access log can be matched up.
func reservationID(requestID string) string {
	var r [8]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand, Go 1.24+)
	const maxPrefix = 128
	var buf [maxPrefix + 1 + 2*len(r)]byte
	b := buf[:0]
	if requestID != "" && len(requestID) <= maxPrefix && printable(requestID) {
		b = append(b, requestID...)
		b = append(b, '.')
	}
	return string(hex.AppendEncode(b, r[:]))
}

// observe counts and logs one call. Nothing here names a key: the
// identity's tenant and key name are not secrets, the key is never held.
func (s *Service) observe(c *call, result string, err error) {
	domain := labelUnknown
	if s.decider.Rules().Domain(c.domain) != nil {
		domain = c.domain
	}
	// The tier label is the plan the Limiter chose, a name from the
	// rules, never the identity's value, so it stays bounded; "none"
	// when no decision was made or the domain has no tiers.
	tier := labelNoTier
	if c.dec != nil && c.dec.Tier != "" {
		tier = c.dec.Tier
	}
	s.metrics.check(domain, tier, result).Inc()
	if c.dec != nil {
		s.metrics.estimated.Observe(float64(c.tokens))
	}
	switch result {
	case resultError:
		s.log.Warn("authz decision failed", zap.Error(err), zap.String("domain", safe(c.domain)))
	case resultOK, resultOverLimit, resultTooLarge, resultShed, resultShadowShed, resultBreakerOpen:
		if ce := s.log.Check(zap.DebugLevel, "authz decision"); ce != nil {
			ce.Write(zap.String("result", result), zap.String("domain", safe(c.domain)), zap.String("tenant", safe(c.id.Tenant)),
				zap.String("key_name", safe(c.id.KeyName)), zap.String("model", safe(c.model)), zap.Uint64("estimated_tokens", c.tokens))
		}
	default:
		if ce := s.log.Check(zap.DebugLevel, "authz refused"); ce != nil {
			// err is a *problem: its text is the client's message, which
			// never quotes a key or a body.
			ce.Write(zap.String("result", result), zap.String("domain", safe(c.domain)), zap.String("reason", err.Error()))
		}
	}
}

// safe bounds what a client-chosen value can put in a log line.
func safe(s string) string {
	const max = 256
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
