package rls

import (
	"math"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Response headers, as Envoy's DRAFT_VERSION_03 option names them, plus
// Retry-After on a denial (defined in pkg/headers, which Check shares).
const (
	HeaderLimit      = headers.Limit
	HeaderRemaining  = headers.Remaining
	HeaderReset      = headers.Reset
	HeaderRetryAfter = headers.RetryAfter
	HeaderReason     = headers.Reason
	HeaderDegraded   = headers.Degraded
)

// scratchRequest is a limit.Request with the arrays behind its
// descriptors and entries, pooled so that converting a request allocates
// nothing once warm. It is safe because a Decider keeps nothing of req
// past Decide.
type scratchRequest struct {
	req     limit.Request
	descs   []limit.Descriptor
	entries []limit.Entry
}

var scratchPool = sync.Pool{New: func() any { return new(scratchRequest) }}

// maxPooledEntries bounds the entries a pooled request keeps room for.
const maxPooledEntries = 256

// release empties r, dropping the strings it points to, and pools it.
func (r *scratchRequest) release() {
	if cap(r.entries) > maxPooledEntries || cap(r.descs) > limit.MaxDescriptors {
		return
	}
	clear(r.descs[:cap(r.descs)])
	clear(r.entries[:cap(r.entries)])
	r.req = limit.Request{}
	scratchPool.Put(r)
}

// toRequest converts an Envoy request to the domain's, into a pooled
// request the caller releases once the decision is made. It never fails:
// nil descriptors and entries become empty ones, which the Limiter then
// rejects as invalid with their index in the message.
func toRequest(in *rlsv3.RateLimitRequest) *scratchRequest {
	r := scratchPool.Get().(*scratchRequest)
	descs := in.GetDescriptors()
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	if cap(r.descs) < len(descs) {
		r.descs = make([]limit.Descriptor, len(descs))
	}
	if cap(r.entries) < n {
		r.entries = make([]limit.Entry, n)
	}
	r.req = limit.Request{
		Domain:      in.GetDomain(),
		Hits:        uint64(in.GetHitsAddend()),
		Descriptors: r.descs[:len(descs)],
	}
	req := &r.req
	entries := r.entries[:n]
	for i, d := range descs {
		out := &req.Descriptors[i]
		*out = limit.Descriptor{}
		if es := d.GetEntries(); len(es) > 0 {
			// Full slice expression: an append to one descriptor's
			// entries must not write over the next one's.
			out.Entries = entries[:len(es):len(es)]
			entries = entries[len(es):]
			for j, e := range es {
				out.Entries[j] = limit.Entry{Key: e.GetKey(), Value: e.GetValue()}
			}
		}
		if ov := d.GetLimit(); ov != nil {
			out.Override = toOverride(ov)
		}
		if h := d.GetHitsAddend(); h != nil {
			out.Hits, out.HitsSet = h.GetValue(), true
		}
		out.Negative = d.GetIsNegativeHits()
	}
	return r
}

func toOverride(ov *commonrl.RateLimitDescriptor_RateLimitOverride) *limit.Override {
	// Envoy's and limit's unit numbers agree; anything that does not fit
	// limit.Unit must not wrap around into a valid unit, so it becomes
	// UnitUnknown, which the Limiter rejects.
	unit := limit.UnitUnknown
	if u := int32(ov.GetUnit()); u > 0 && u <= math.MaxUint8 {
		unit = limit.Unit(u)
	}
	mult := uint32(1)
	if m := ov.GetUnitMultiplier(); m != nil {
		mult = m.GetValue()
	}
	return &limit.Override{Amount: uint64(ov.GetRequestsPerUnit()), Unit: unit, Multiplier: mult}
}

// toResponse converts a decision to Envoy's answer: one status per
// request descriptor, in order, and the rate limit headers.
func toResponse(dec *admission.Decision) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: toCode(dec.Code),
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(dec.Statuses)),
	}
	msgs := make([]statusMsgs, len(dec.Statuses))
	for i := range dec.Statuses {
		resp.Statuses[i] = toStatus(&dec.Statuses[i], &msgs[i])
	}
	resp.ResponseHeadersToAdd = responseHeaders(resp.Statuses, dec.Statuses)
	if dec.Code == limit.CodeOverLimit {
		// OVER_LIMIT is all RLS can say, and Envoy answers it with its
		// configured status (429 by default); the body says why, as
		// Check's does, and for a request too large that no retry
		// helps. Envoy lets the service's content-type replace its
		// local reply's text/plain.
		resp.RawBody = errorBody(dec)
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "content-type", Value: "application/json"})
	}
	if a := dec.Reason.Answer(); a.BeforeLimits {
		// Refused before any limit: the statuses report none, so the
		// wait (when the row says waiting helps) and the reason go in
		// headers of their own.
		if a.RetryAfter {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: HeaderRetryAfter, Value: strconv.FormatInt(max(1, headers.CeilSeconds(dec.RetryAfter)), 10)})
		}
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: HeaderReason, Value: a.Name})
	}
	if dec.Degraded {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: HeaderDegraded, Value: headers.DegradedStore})
	}
	if dec.HasRetries && dec.Code == limit.CodeOK {
		// Envoy adds these to the request before its router reads them
		// (docs/retry-budget.md says where it does not).
		resp.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: headers.MaxRetries, Value: headers.Retries(dec.Retries)}}
	}
	return resp
}

func toCode(c limit.Code) rlsv3.RateLimitResponse_Code {
	switch c {
	case limit.CodeOK:
		return rlsv3.RateLimitResponse_OK
	case limit.CodeOverLimit:
		return rlsv3.RateLimitResponse_OVER_LIMIT
	default:
		return rlsv3.RateLimitResponse_UNKNOWN
	}
}

// statusMsgs are the messages of one descriptor status. A response
// allocates them for all its statuses at once, rather than three
// allocations per status.
type statusMsgs struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// toStatus converts st into m and returns m's status message.
func toStatus(st *limit.Status, m *statusMsgs) *rlsv3.RateLimitResponse_DescriptorStatus {
	out := &m.status
	out.Code = toCode(st.Code)
	l := st.Limit
	if l == nil {
		if st.Rule != nil && st.Rule.Unlimited && st.Code == limit.CodeOK {
			// As envoyproxy/ratelimit reports an unlimited descriptor:
			// no current limit, and all the room a uint32 holds.
			out.LimitRemaining = math.MaxUint32
		}
		return out
	}
	out.CurrentLimit = &m.limit
	out.CurrentLimit.Name = l.Name
	out.CurrentLimit.RequestsPerUnit = capUint32(l.Amount)
	out.CurrentLimit.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)
	if l.Multiplier > 1 {
		out.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(l.Multiplier)
	}
	out.LimitRemaining = capUint32(st.Remaining)
	if st.Code == limit.CodeOverLimit {
		// As envoyproxy/ratelimit reports a denial (and what a client
		// reads from x-ratelimit-remaining on a 429): nothing left for
		// this request, though a denied request took nothing.
		out.LimitRemaining = 0
	}
	if st.TooLarge {
		// No wait helps, and Envoy's own Retry-After and x-ratelimit-reset
		// are made from this duration: leave it out.
		return out
	}
	reset := st.ResetAfter
	if st.Code == limit.CodeOverLimit && st.RetryAfter > 0 {
		reset = st.RetryAfter
	}
	// durationpb.New's conversion, into m's message.
	m.reset.Seconds, m.reset.Nanos = int64(reset/time.Second), int32(reset%time.Second)
	out.DurationUntilReset = &m.reset
	return out
}

// errorBody is the OpenAI-style error body of a refusal, the same as
// Check's: OpenAI's rate limit error for a limit (see
// headers.LimitError), the reason's row for a refusal before the limits,
// and for a request too large its limit and cost.
func errorBody(dec *admission.Decision) []byte {
	a := dec.Reason.Answer()
	var e headers.Error
	switch st := dec.TooLarge(); {
	case st != nil:
		e = headers.TooLargeError(st)
	case a.BeforeLimits:
		e = headers.Error{Type: a.Type, Code: a.Code, Message: a.Message + "."}
		if a.RetryAfter {
			e.Message = headers.RetryMessage(a.Message, dec.RetryAfter)
		}
	default:
		e = headers.LimitError(dec.Statuses)
	}
	if dec.Reason != admission.ReasonNone {
		e.Reason = a.Name
	}
	return e.Body()
}

func capUint32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// responseHeaders builds the rate limit headers (see headers.Append) from
// the statuses as Envoy receives them, so the figures are the ones Envoy
// would compute with enable_x_ratelimit_headers. decided are the
// decision's statuses, which statuses were made from, for what the
// protos cannot carry (TooLarge).
func responseHeaders(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, decided []limit.Status) []*corev3.HeaderValue {
	var buf [8]headers.Quota
	quotas := buf[:0]
	for i, st := range statuses {
		cl := st.GetCurrentLimit()
		if cl == nil {
			continue
		}
		quotas = append(quotas, headers.Quota{
			HasLimit:      true,
			Amount:        uint64(cl.GetRequestsPerUnit()),
			WindowSeconds: windowSeconds(cl),
			Name:          cl.GetName(),
			Remaining:     uint64(st.GetLimitRemaining()),
			Reset:         st.GetDurationUntilReset().AsDuration(),
			Over:          st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT,
			TooLarge:      i < len(decided) && decided[i].TooLarge,
			Tokens:        i < len(decided) && decided[i].Limit != nil && decided[i].Limit.Kind == limit.Tokens,
		})
	}
	var hbuf [headers.MaxAppended]headers.Header
	hs := headers.Append(hbuf[:0], quotas)
	if len(hs) == 0 {
		return nil
	}
	out := make([]*corev3.HeaderValue, len(hs))
	vals := make([]corev3.HeaderValue, len(hs))
	for i, h := range hs {
		vals[i].Key, vals[i].Value = h.Key, h.Value
		out[i] = &vals[i]
	}
	return out
}

// windowSeconds is a limit's window in seconds, 0 when the unit is unknown.
func windowSeconds(cl *rlsv3.RateLimitResponse_RateLimit) uint64 {
	u := cl.GetUnit()
	if u <= 0 || u > math.MaxUint8 {
		return 0
	}
	d := limit.Unit(u).Duration()
	if d <= 0 {
		return 0
	}
	m := uint64(1)
	if um := cl.GetUnitMultiplier(); um != nil && um.GetValue() > 1 {
		m = uint64(um.GetValue())
	}
	return uint64(d/time.Second) * m
}
