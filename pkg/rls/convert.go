package rls

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Response headers, as Envoy's DRAFT_VERSION_03 option names them, plus
// Retry-After on a denial.
const (
	HeaderLimit      = "x-ratelimit-limit"
	HeaderRemaining  = "x-ratelimit-remaining"
	HeaderReset      = "x-ratelimit-reset"
	HeaderRetryAfter = "retry-after"
)

// toRequest converts an Envoy request to the domain's. It never fails:
// nil descriptors and entries become empty ones, which the Limiter then
// rejects as invalid with their index in the message.
func toRequest(in *rlsv3.RateLimitRequest) *limit.Request {
	descs := in.GetDescriptors()
	req := &limit.Request{
		Domain:      in.GetDomain(),
		Hits:        uint64(in.GetHitsAddend()),
		Descriptors: make([]limit.Descriptor, len(descs)),
	}
	for i, d := range descs {
		out := &req.Descriptors[i]
		if entries := d.GetEntries(); len(entries) > 0 {
			out.Entries = make([]limit.Entry, len(entries))
			for j, e := range entries {
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
	return req
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
func toResponse(dec *limit.Decision) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: toCode(dec.Code),
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(dec.Statuses)),
	}
	for i := range dec.Statuses {
		resp.Statuses[i] = toStatus(&dec.Statuses[i])
	}
	resp.ResponseHeadersToAdd = headers(resp.Statuses)
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

func toStatus(st *limit.Status) *rlsv3.RateLimitResponse_DescriptorStatus {
	out := &rlsv3.RateLimitResponse_DescriptorStatus{Code: toCode(st.Code)}
	l := st.Limit
	if l == nil {
		return out
	}
	out.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name,
		RequestsPerUnit: capUint32(l.Amount),
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit),
	}
	if l.Multiplier > 1 {
		out.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(l.Multiplier)
	}
	out.LimitRemaining = capUint32(st.Remaining)
	reset := st.ResetAfter
	if st.Code == limit.CodeOverLimit && st.RetryAfter > 0 {
		reset = st.RetryAfter
	}
	out.DurationUntilReset = durationpb.New(reset)
	return out
}

func capUint32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// headers builds the draft-03 headers Envoy itself would build from the
// statuses with enable_x_ratelimit_headers, so they also reach clients
// when that option is off: the figures come from the status with the
// smallest limit_remaining (the first on a tie), and x-ratelimit-limit
// lists a quota policy for every status that has a limit, e.g.
// `10, 10;w=1;name="per-ip", 1000;w=3600`. Unlike Envoy, the reset is
// rounded up to whole seconds, so a client that waits that long finds the
// window reset rather than one second short of it. Retry-After, on a
// denial, is the longest wait among the denying statuses, as Envoy's
// enable_retry_after_header computes it, at least one second.
func headers(statuses []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var minSt *rlsv3.RateLimitResponse_DescriptorStatus
	var policies strings.Builder
	var retry time.Duration
	over := false
	for _, st := range statuses {
		cl := st.GetCurrentLimit()
		if cl == nil {
			continue
		}
		if minSt == nil || st.GetLimitRemaining() < minSt.GetLimitRemaining() {
			minSt = st
		}
		if w := windowSeconds(cl); w > 0 {
			policies.WriteString(", ")
			policies.WriteString(strconv.FormatUint(uint64(cl.GetRequestsPerUnit()), 10))
			policies.WriteString(";w=")
			policies.WriteString(strconv.FormatUint(w, 10))
			if cl.GetName() != "" {
				policies.WriteString(`;name="`)
				writeQuoted(&policies, cl.GetName())
				policies.WriteByte('"')
			}
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			over = true
			retry = max(retry, st.GetDurationUntilReset().AsDuration())
		}
	}
	if minSt == nil {
		return nil
	}
	hs := []*corev3.HeaderValue{
		{Key: HeaderLimit, Value: strconv.FormatUint(uint64(minSt.GetCurrentLimit().GetRequestsPerUnit()), 10) + policies.String()},
		{Key: HeaderRemaining, Value: strconv.FormatUint(uint64(minSt.GetLimitRemaining()), 10)},
		{Key: HeaderReset, Value: strconv.FormatInt(ceilSeconds(minSt.GetDurationUntilReset().AsDuration()), 10)},
	}
	if over {
		hs = append(hs, &corev3.HeaderValue{Key: HeaderRetryAfter, Value: strconv.FormatInt(max(1, ceilSeconds(retry)), 10)})
	}
	return hs
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

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// writeQuoted writes s as the inside of a structured-field string: only
// printable ASCII, with '"' and '\' escaped. Names come from rule files,
// but a header value must stay well-formed whatever they hold.
func writeQuoted(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		}
	}
}
