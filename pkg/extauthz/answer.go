package extauthz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// Headers Check sets on the upstream request (overwriting any the client
// sent) and on the response.
const (
	HeaderTenant = "x-tollgate-tenant"
	HeaderTier   = "x-tollgate-tier"
	HeaderModel  = "x-tollgate-model"
	// HeaderEstimate says, on the response, that the token estimate was
	// made from a partial body: its value is "partial-body".
	HeaderEstimate = "x-tollgate-estimate"
	// HeaderDegraded says, on the response, that the store could not
	// answer and the rules' store_failure did: its value is "store".
	HeaderDegraded = headers.Degraded
)

// problem is a request Check refuses with an HTTP answer; its msg is
// what the client reads, so it never holds internal error text.
type problem struct {
	status  typev3.StatusCode
	errType string // default invalid_request_error
	errCode string
	msg     string
	param   string // the request field at fault, if one is
	result  string // metric label
	// reason is the body's tollgate_reason: the admission Reason's name
	// of a refusal by the pipeline or for the key; "" (none) for the
	// request's own faults, whose codes are Tollgate's already.
	reason string
}

func (p *problem) Error() string { return p.msg }

var (
	// OpenAI answers both with a 401 invalid_request_error, the unknown
	// key with code invalid_api_key and the missing one with none.
	errMissingKey = &problem{status: typev3.StatusCode(admission.ReasonUnauthenticated.Answer().Status), errCode: "missing_api_key", result: admission.ReasonUnauthenticated.Answer().Result,
		reason: admission.ReasonUnauthenticated.String(), msg: "No API key was provided. Send it as Authorization: Bearer <key>."}
	errUnknownKey = &problem{status: typev3.StatusCode(admission.ReasonUnauthenticated.Answer().Status), errCode: "invalid_api_key", result: admission.ReasonUnauthenticated.Answer().Result,
		reason: admission.ReasonUnauthenticated.String(), msg: "The API key provided is not valid."}
	errValueTooLong = &problem{status: 400, errCode: "invalid_request", result: resultBadRequest,
		msg: fmt.Sprintf("A request field or header that rate limits are keyed on is longer than %d bytes.", limit.MaxValueBytes)}
	errInvalidRequest = &problem{status: 400, errCode: "invalid_request", result: resultBadRequest,
		msg: "The request cannot be rate limited as sent."}
)

func tooLargeMessage(limit int64) string {
	return fmt.Sprintf("The request body is larger than %d bytes.", limit)
}

// toAnswer is the one place that maps Check's outcome to its answer: the
// CheckResponse for an admission or a refusal, or the gRPC error for a
// failure, plus the metric result. A refusal's text is the client's
// message; a store's error text never reaches the client, since it may
// carry addresses. A store failure reaches here only from a Limiter
// without store_failure (admission.WithStoreFailure), or when the caller gave
// up; it is a gRPC error rather than a denial so that Envoy applies its
// own failure_mode_allow / status_on_error, as for ShouldRateLimit.
func toAnswer(ctx context.Context, err error, c *call) (*authv3.CheckResponse, string, error) {
	switch {
	case err == nil && (c.dec == nil || c.dec.Code == limit.CodeOK):
		return okResponse(c), resultOK, nil
	case err == nil:
		return refusal(c)
	}
	// Declared past the answers without an error: errors.As moves p to
	// the heap, which every admitted request would pay for.
	var p *problem
	switch {
	case errors.As(err, &p):
		return deniedResponse(p, c), p.result, nil
	case errors.Is(err, limit.ErrInvalid):
		// The descriptors came from the request and the config, and were
		// checked here; a limit the Limiter still rejects is the client's.
		return deniedResponse(errInvalidRequest, c), resultBadRequest, nil
	case ctx.Err() != nil:
		// The caller gave up (Envoy's timeout): say so, not "unavailable".
		return nil, resultError, status.FromContextError(ctx.Err()).Err()
	default:
		return nil, resultError, status.Error(codes.Unavailable, "rate limit store unavailable")
	}
}

// refusal answers a refused decision by its reason's row of
// admission's table: the answer's status picks its shape, and the row
// gives the status, the code, the message and whether Retry-After goes.
func refusal(c *call) (*authv3.CheckResponse, string, error) {
	a := c.dec.Reason.Answer()
	switch {
	case a.BeforeLimits:
		return unavailableResponse(c, &a), a.Result, nil
	case a.Status == 413:
		return tooLargeResponse(c, &a, c.dec.TooLarge()), a.Result, nil
	}
	return overLimitResponse(c, &a), resultOverLimit, nil
}

// option is a header set whatever the request held.
func option(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// optionValue is an option and its header, allocated together.
type optionValue struct {
	option corev3.HeaderValueOption
	header corev3.HeaderValue
}

// options returns an option (as option makes it) for each of hs, in two
// allocations rather than two per header: every answer sets several.
func options(hs []headers.Header) []*corev3.HeaderValueOption {
	if len(hs) == 0 {
		return nil
	}
	return fillOptions(hs, make([]optionValue, len(hs)), make([]*corev3.HeaderValueOption, len(hs)))
}

// fillOptions is options in storage the caller has: vs and out are as
// long as hs.
func fillOptions(hs []headers.Header, vs []optionValue, out []*corev3.HeaderValueOption) []*corev3.HeaderValueOption {
	for i, h := range hs {
		v := &vs[i]
		v.header.Key, v.header.Value = h.Key, h.Value
		v.option.Header = &v.header
		v.option.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		out[i] = &v.option
	}
	return out
}

// upstreamHeaders is the most headers Check sets on an admitted request
// upstream: the three identity headers and the retry budget.
const upstreamHeaders = 4

// okAnswer is an admitted request's answer. Its messages are allocated
// together, not one by one, since Check answers most requests with one.
type okAnswer struct {
	resp   authv3.CheckResponse
	status rpcstatus.Status
	oneof  authv3.CheckResponse_OkResponse
	ok     authv3.OkHttpResponse
	remove [3]string
	opts   [upstreamHeaders + maxRateLimitHeaders]optionValue
	ptrs   [upstreamHeaders + maxRateLimitHeaders]*corev3.HeaderValueOption
	meta   metaValues
}

func okResponse(c *call) *authv3.CheckResponse {
	a := &okAnswer{}
	var buf [upstreamHeaders + maxRateLimitHeaders]headers.Header
	set := buf[:0]
	// Each identity header is set, overwriting what the client sent, or,
	// when there is no value, removed. Never both: Envoy removes after it
	// sets, so removing a header it set would drop it.
	removed := 0
	for _, h := range [...]headers.Header{
		{Key: HeaderTenant, Value: c.id.Tenant}, {Key: HeaderTier, Value: grantedTier(c)}, {Key: HeaderModel, Value: c.model},
	} {
		if h.Value != "" && printable(h.Value) {
			set = append(set, h)
		} else {
			a.remove[removed] = h.Key
			removed++
		}
	}
	if c.dec != nil && c.dec.HasRetries {
		// Set, not appended: a client's own value must not stand beside
		// it (docs/retry-budget.md).
		set = append(set, headers.Header{Key: headers.MaxRetries, Value: headers.Retries(c.dec.Retries)})
	}
	identity := len(set)
	set = rateLimitHeaders(c, set)
	var all []*corev3.HeaderValueOption
	if len(set) <= len(a.opts) {
		all = fillOptions(set, a.opts[:len(set)], a.ptrs[:len(set)])
	} else {
		all = options(set) // more headers than maxRateLimitHeaders says
	}
	if identity > 0 {
		a.ok.Headers = all[:identity:identity]
	}
	if len(all) > identity {
		a.ok.ResponseHeadersToAdd = all[identity:]
	}
	if removed > 0 {
		a.ok.HeadersToRemove = a.remove[:removed]
	}
	a.status.Code = int32(codes.OK)
	a.oneof.OkResponse = &a.ok
	a.resp.Status = &a.status
	a.resp.HttpResponse = &a.oneof
	a.resp.DynamicMetadata = a.meta.fill(c)
	return &a.resp
}

// grantedTier is the tier an admitted request is sent upstream with: the
// plan the decision used when the domain has tiers, so a claimed tier no
// plan lists goes up as the default it was decided under, not as what
// was claimed. Without tiers nothing judged the tier, and the identity's
// (the key's, or the trusted header's) passes through as it is.
func grantedTier(c *call) string {
	if c.dec != nil && c.dec.Tier != "" {
		return c.dec.Tier
	}
	return c.id.Tier
}

// metaValues holds an admitted request's dynamic metadata: the struct
// and its values, allocated together rather than two allocations a value.
type metaValues struct {
	meta   structpb.Struct
	values [7]structpb.Value
	strs   [5]structpb.Value_StringValue
	nums   [2]structpb.Value_NumberValue
}

// metadata is the dynamic metadata of an admitted request: who and what,
// the reservation's figures for access log formats, and the signed
// ticket the request's outcome comes back with.
func metadata(c *call) *structpb.Struct { return new(metaValues).fill(c) }

func (m *metaValues) fill(c *call) *structpb.Struct {
	f := make(map[string]*structpb.Value, 7)
	nv, ns, nn := 0, 0, 0 // values, strings and numbers used
	str := func(k, v string) {
		m.strs[ns].StringValue = v
		m.values[nv].Kind = &m.strs[ns]
		f[k] = &m.values[nv]
		nv, ns = nv+1, ns+1
	}
	num := func(k string, v float64) {
		m.nums[nn].NumberValue = v
		m.values[nv].Kind = &m.nums[nn]
		f[k] = &m.values[nv]
		nv, nn = nv+1, nn+1
	}
	for _, kv := range [...]struct{ k, v string }{
		{ticket.FieldTenant, c.id.Tenant}, {ticket.FieldTier, grantedTier(c)}, {ticket.FieldModel, c.model},
	} {
		if kv.v != "" {
			str(kv.k, kv.v)
		}
	}
	if c.dec != nil && c.req != nil && c.sealer != nil && !c.dec.At.IsZero() {
		t := ticket.Ticket{
			ID:          c.req.ID,
			Domain:      c.req.Domain,
			Descriptors: c.req.Descriptors,
			Overrides:   c.req.Overrides,
			// The plan the decision was made under, which a settle must
			// measure against; "" for a domain without tiers.
			Tier:   c.dec.Tier,
			Model:  c.req.Model,
			At:     c.dec.At,
			Probes: c.dec.Probes,
		}
		if r := c.dec.Reservation; r != nil {
			t.Reserved, t.Tokens, t.Prompt, t.At = true, r.Tokens, min(c.prompt, r.Tokens), r.At
			str(ticket.FieldReservationID, r.ID)
			num(ticket.FieldReservedTokens, float64(r.Tokens))
			num(ticket.FieldReservedAtMs, float64(r.At.UnixMilli()))
		}
		// Every admitted request carries a ticket, reservation or not:
		// its outcome feeds the breakers and the pressure only through
		// one.
		str(ticket.Field, c.sealer.Seal(&t))
	}
	m.meta.Fields = f
	return &m.meta
}

// overLimitResponse answers a refusal by the limits with a 429 and
// OpenAI's rate limit error (see headers.LimitError).
func overLimitResponse(c *call, a *admission.Answer) *authv3.CheckResponse {
	e := headers.LimitError(c.dec.Statuses)
	return deniedResponse(&problem{status: 429, errType: e.Type, errCode: e.Code, msg: e.Message, result: resultOverLimit, reason: a.Name}, c)
}

// tooLargeResponse answers a request that can never fit st's limit
// (its estimate is more than the whole budget): 413, not 429, because
// every common client and retry policy retries a 429, and waiting cannot
// help; OpenAI answers the same case with a 429, whose SDKs are also
// told x-should-retry: false. The headers carry no Retry-After and no
// x-ratelimit-reset (see headers.Append), and the message gives the
// limit and what the request costs.
func tooLargeResponse(c *call, a *admission.Answer, st *limit.Status) *authv3.CheckResponse {
	e := headers.TooLargeError(st)
	return deniedResponse(&problem{status: typev3.StatusCode(a.Status), errType: e.Type, errCode: e.Code, msg: e.Message, reason: a.Name}, c)
}

// unavailableResponse answers a request refused before any limit (tier
// shedding or an open breaker) with a's status (503, which OpenAI clients
// retry), type, code and message, Retry-After when a says waiting helps,
// and x-tollgate-reason.
func unavailableResponse(c *call, a *admission.Answer) *authv3.CheckResponse {
	secs := strconv.FormatInt(max(1, headers.CeilSeconds(c.dec.RetryAfter)), 10)
	p := &problem{status: typev3.StatusCode(a.Status), errType: a.Type, errCode: a.Code, msg: a.Message + ".", reason: a.Name}
	if a.RetryAfter {
		p.msg = headers.RetryMessage(a.Message, c.dec.RetryAfter)
	}
	resp := deniedResponse(p, c)
	d := resp.GetDeniedResponse()
	// The statuses' waits (the decision's) usually gave Retry-After
	// already; a decision without statuses still needs one.
	if a.RetryAfter && !slices.ContainsFunc(d.Headers, func(h *corev3.HeaderValueOption) bool { return h.GetHeader().GetKey() == headers.RetryAfter }) {
		d.Headers = append(d.Headers, option(headers.RetryAfter, secs))
	}
	d.Headers = append(d.Headers, option(headers.Reason, a.Name))
	return resp
}

// deniedResponse answers p with an OpenAI-style JSON body, and the rate
// limit headers when a decision denied.
func deniedResponse(p *problem, c *call) *authv3.CheckResponse {
	e := headers.Error{Message: p.msg, Type: p.errType, Code: p.errCode, Param: p.param, Reason: p.reason}
	if e.Type == "" {
		e.Type = headers.TypeInvalidRequest
	}
	body := e.Body()
	var buf [1 + maxRateLimitHeaders]headers.Header
	all := rateLimitHeaders(c, append(buf[:0], headers.Header{Key: "content-type", Value: "application/json"}))
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(grpcCode(p.status))},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: p.status},
			Headers: options(all),
			Body:    string(body),
		}},
	}
}

// grpcCode is the CheckResponse status for a denial's HTTP status; Envoy
// only looks at OK or not, but logs and other clients read it.
func grpcCode(s typev3.StatusCode) codes.Code {
	switch s {
	case 401:
		return codes.Unauthenticated
	case 429:
		return codes.ResourceExhausted
	case 503:
		return codes.Unavailable
	case 500:
		return codes.Internal
	default:
		return codes.InvalidArgument
	}
}

// maxRateLimitHeaders is the most rateLimitHeaders appends: those of
// headers.Append, the estimate marker and the degraded marker.
const maxRateLimitHeaders = headers.MaxAppended + 2

// rateLimitHeaders appends to dst the x-ratelimit-* and retry-after
// headers of the decision, as ShouldRateLimit sends them, the estimate
// marker, and x-tollgate-degraded when store_failure answered.
func rateLimitHeaders(c *call, dst []headers.Header) []headers.Header {
	if c.dec != nil {
		var buf [8]headers.Quota
		qs := buf[:0]
		for i := range c.dec.Statuses {
			qs = append(qs, quota(&c.dec.Statuses[i]))
		}
		dst = headers.Append(dst, qs)
	}
	if c.partial {
		dst = append(dst, headers.Header{Key: HeaderEstimate, Value: "partial-body"})
	}
	if c.dec != nil && c.dec.Degraded {
		dst = append(dst, headers.Header{Key: HeaderDegraded, Value: headers.DegradedStore})
	}
	return dst
}

func quota(st *limit.Status) headers.Quota {
	q := headers.Quota{Over: st.Code == limit.CodeOverLimit, Reset: st.ResetAfter, TooLarge: st.TooLarge}
	if q.Over && st.RetryAfter > 0 {
		q.Reset = st.RetryAfter
	}
	if l := st.Limit; l != nil {
		q.HasLimit, q.Amount, q.Name, q.Remaining, q.Tokens = true, l.Amount, l.Name, st.Remaining, l.Kind == limit.Tokens
		q.WindowSeconds = uint64(l.Window() / time.Second)
	}
	return q
}
