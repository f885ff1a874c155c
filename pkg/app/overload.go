package app

import (
	"context"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The full names of the calls an overloaded replica answers itself.
const (
	methodShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	methodCheck           = "/envoy.service.auth.v3.Authorization/Check"
)

// degradedOverload is x-tollgate-degraded's value on an answer a replica
// gave without deciding, because it had --max-in-flight calls already.
const degradedOverload = "overload"

// overloadAnswer answers a call past --max-in-flight at once, without
// deciding. ShouldRateLimit follows the default store_failure: a replica
// too busy to decide is, for its callers, a store that cannot answer.
// allow admits; deny refuses with Retry-After 1; local refuses too, as
// its in-process limit is the very work an overloaded replica must not
// take on. Check is always refused (503, Retry-After 1): admitting it
// would skip the API key check and let a client's own x-tollgate-*
// headers through, turning the ext_authz path open and unauthenticated
// under load. Every such answer says x-tollgate-degraded: overload.
// Other calls get RESOURCE_EXHAUSTED.
func overloadAnswer(policy limit.StoreFailure) func(ctx context.Context, method string, req any) (any, error) {
	admit := policy == limit.FailureAllow || policy == limit.FailureUnset
	degraded := &corev3.HeaderValue{Key: "x-tollgate-degraded", Value: degradedOverload}
	return func(_ context.Context, method string, _ any) (any, error) {
		switch method {
		case methodShouldRateLimit:
			if admit {
				return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
					ResponseHeadersToAdd: []*corev3.HeaderValue{degraded}}, nil
			}
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
				ResponseHeadersToAdd: []*corev3.HeaderValue{degraded, {Key: "retry-after", Value: "1"}}}, nil
		case methodCheck:
			return &authv3.CheckResponse{
				Status: &rpcstatus.Status{Code: int32(codes.Unavailable)},
				HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
					Status: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
					Headers: []*corev3.HeaderValueOption{{Header: degraded}, {Header: &corev3.HeaderValue{Key: "retry-after", Value: "1"}},
						{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}}},
					Body: `{"error":{"message":"The rate limiter is overloaded. Retry after 1 second.","type":"server_error","code":"overloaded"}}`,
				}},
			}, nil
		}
		return nil, status.Error(codes.ResourceExhausted, "tollgate: too many calls in flight on this replica")
	}
}
