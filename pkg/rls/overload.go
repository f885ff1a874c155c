package rls

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// ShouldRateLimitMethod is the full gRPC name of the call this package
// answers, for the server's per-method hooks.
const ShouldRateLimitMethod = rlsv3.RateLimitService_ShouldRateLimit_FullMethodName

// OverloadResponse is the answer to a ShouldRateLimit past
// --max-in-flight, given at once without deciding. It follows the
// default store_failure policy: a replica too busy to decide is, for its
// callers, a store that cannot answer. allow (or unset) admits; deny
// refuses with Retry-After 1; local refuses too, as its in-process limit
// is the very work an overloaded replica must not take on. Either way it
// says x-tollgate-degraded: overload; a refusal has Check's body.
func OverloadResponse(policy limit.StoreFailure) *rlsv3.RateLimitResponse {
	degraded := &corev3.HeaderValue{Key: headers.Degraded, Value: headers.DegradedOverload}
	if policy == limit.FailureAllow || policy == limit.FailureUnset {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			ResponseHeadersToAdd: []*corev3.HeaderValue{degraded}}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		ResponseHeadersToAdd: []*corev3.HeaderValue{degraded, {Key: "retry-after", Value: "1"}, {Key: "content-type", Value: "application/json"}},
		RawBody:              []byte(overloadBody)}
}

// overloadBody is OverloadResponse's body on a refusal: ext_authz's
// answer past --max-in-flight says the same.
const overloadBody = `{"error":{"message":"The rate limiter is overloaded. Retry after 1 second.","type":"server_error","code":"overloaded","tollgate_reason":"overload"}}`
