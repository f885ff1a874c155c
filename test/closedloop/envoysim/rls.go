package envoysim

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	h2mv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/test/closedloop"
)

// metadataFormat is the one hits_addend format the simulator reads:
// a single %DYNAMIC_METADATA(namespace:key)% command.
var metadataFormat = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:()]+):([^:()]+)\)%$`)

// checkRateLimits refuses actions and hits_addend forms the simulator
// does not build, so that a descriptor is never silently wrong.
func checkRateLimits(rls []*routev3.RateLimit) error {
	for i, rl := range rls {
		for _, a := range rl.GetActions() {
			switch a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RequestHeaders_, *routev3.RateLimit_Action_GenericKey_,
				*routev3.RateLimit_Action_RemoteAddress_, *routev3.RateLimit_Action_DestinationCluster_:
			default:
				return fmt.Errorf("rate_limits[%d]: action %T is not simulated", i, a.GetActionSpecifier())
			}
		}
		if f := rl.GetHitsAddend().GetFormat(); f != "" && !metadataFormat.MatchString(f) {
			return fmt.Errorf("rate_limits[%d]: hits_addend format %q is not simulated", i, f)
		}
	}
	return nil
}

// descriptors builds the descriptors of the entries of one phase (the
// request, or apply_on_stream_done) as Envoy's route rate limit actions
// do: an action that cannot produce its entry drops the descriptor
// (request_headers with skip_if_absent false), and a hits_addend that
// does not resolve to a number drops it too ("Invalid hits_addend").
func (x *exchange) descriptors(streamDone bool) []*ratelimitv3.RateLimitDescriptor {
	var out []*ratelimitv3.RateLimitDescriptor
next:
	for _, rl := range x.g.s.rls.rateLimits {
		if rl.GetApplyOnStreamDone() != streamDone {
			continue
		}
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			var k, v string
			switch act := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RequestHeaders_:
				h, ok := x.req.joined(strings.ToLower(act.RequestHeaders.GetHeaderName()))
				if !ok {
					if act.RequestHeaders.GetSkipIfAbsent() {
						continue
					}
					continue next
				}
				k, v = act.RequestHeaders.GetDescriptorKey(), h
			case *routev3.RateLimit_Action_GenericKey_:
				k, v = act.GenericKey.GetDescriptorKey(), act.GenericKey.GetDescriptorValue()
				if k == "" {
					k = "generic_key"
				}
			case *routev3.RateLimit_Action_RemoteAddress_:
				k, v = "remote_address", "127.0.0.1"
			case *routev3.RateLimit_Action_DestinationCluster_:
				k, v = "destination_cluster", x.g.s.route.cluster
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if len(d.Entries) == 0 {
			continue
		}
		if ha := rl.GetHitsAddend(); ha != nil {
			n, ok := x.hitsAddend(ha)
			if !ok {
				continue
			}
			d.HitsAddend = wrapperspb.UInt64(n)
		}
		out = append(out, d)
	}
	return out
}

func (x *exchange) hitsAddend(ha *routev3.RateLimit_HitsAddend) (uint64, bool) {
	if ha.GetFormat() == "" {
		return ha.GetNumber().GetValue(), true
	}
	m := metadataFormat.FindStringSubmatch(ha.GetFormat())
	v, ok := x.meta[m[1]].GetFields()[m[2]]
	if !ok {
		return 0, false
	}
	var n float64
	switch k := v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		n = k.NumberValue
	case *structpb.Value_StringValue:
		f, err := strconv.ParseFloat(k.StringValue, 64)
		if err != nil {
			return 0, false
		}
		n = f
	default:
		return 0, false
	}
	if n < 0 || n > 1e9 { // HitsAddend.number: "<= 1e9"
		return 0, false
	}
	return uint64(n), true
}

// rateLimit is the ratelimit filter's request phase: one ShouldRateLimit
// with the request's descriptors. It says whether the request goes on.
func (x *exchange) rateLimit(ctx context.Context) bool {
	r := x.g.s.rls
	ds := x.descriptors(false)
	if len(ds) == 0 {
		return true // no descriptor: no call
	}
	x.g.stats.rateLimits.Add(1)
	// hits_addend 0: the filter state envoy.ratelimit.hits_addend is not
	// set, and the service reads 0 as 1 (rls.proto).
	req := &rlsv3.RateLimitRequest{Domain: r.domain, Descriptors: ds}
	i := x.in.checkRR.Add(1) - 1
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	resp, err := rlsv3.NewRateLimitServiceClient(x.in.conns[i%uint64(len(x.in.conns))]).ShouldRateLimit(cctx, req)
	cancel()
	if ctx.Err() != nil {
		return false
	}
	if err != nil || resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
		x.g.stats.rateLimitErrors.Add(1)
		if !r.failureModeDeny {
			return true // fail open: the filter counts failure_mode_allowed
		}
		x.flag().RateLimitServiceError = true
		x.localReply(r.statusOnError, nil, "", detailsRateLimitError, closedloop.SourceEnvoy)
		return false
	}
	if md := resp.GetDynamicMetadata(); len(md.GetFields()) > 0 {
		x.setMeta(r.namespace, md)
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		x.flag().RateLimited = true
		var h headers
		for _, hv := range resp.GetResponseHeadersToAdd() {
			h.add(strings.ToLower(hv.GetKey()), headerValue(hv))
		}
		// x-envoy-ratelimited, unless disable_x_envoy_ratelimited_header.
		h.add("x-envoy-ratelimited", "true")
		x.localReply(r.rateLimitedStatus, h, string(resp.GetRawBody()), detailsRateLimited, closedloop.SourceTollgate)
		return false
	}
	for _, hv := range resp.GetRequestHeadersToAdd() {
		x.req.add(strings.ToLower(hv.GetKey()), headerValue(hv))
	}
	x.addRLSResp = resp.GetResponseHeadersToAdd()
	return true
}

// streamDone is the apply_on_stream_done report: the header_to_metadata
// filter's response rules first write their metadata, then the
// stream-done descriptors go in one fire-and-forget ShouldRateLimit whose
// answer Envoy ignores.
func (x *exchange) streamDone() {
	r := x.g.s.rls
	for _, rule := range r.h2m {
		x.headerToMetadata(rule)
	}
	ds := x.descriptors(true)
	if len(ds) == 0 {
		return
	}
	x.g.stats.reports.Add(1)
	req := &rlsv3.RateLimitRequest{Domain: r.domain, Descriptors: ds}
	i := x.in.checkRR.Add(1) - 1
	cc := x.in.conns[i%uint64(len(x.in.conns))]
	x.g.bg.Add(1)
	go func() {
		defer x.g.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		defer cancel()
		if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req); err != nil {
			x.g.stats.reportErrors.Add(1)
		}
	}()
}

// headerToMetadata applies one response rule on a present header.
func (x *exchange) headerToMetadata(rule *h2mv3.Config_Rule) {
	v, ok := x.resp.get(strings.ToLower(rule.GetHeader()))
	kv := rule.GetOnHeaderPresent()
	if !ok || kv == nil || kv.GetKey() == "" {
		return
	}
	ns := kv.GetMetadataNamespace()
	if ns == "" {
		ns = filterH2M
	}
	var val *structpb.Value
	switch kv.GetType() {
	case h2mv3.Config_NUMBER:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return // "a header value that is not a number adds no metadata"
		}
		val = structpb.NewNumberValue(f)
	case h2mv3.Config_STRING:
		val = structpb.NewStringValue(v)
	default:
		return
	}
	s := x.meta[ns]
	if s == nil {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		x.setMeta(ns, s)
	}
	s.Fields[kv.GetKey()] = val
}
