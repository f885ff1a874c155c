package extauthz

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/tollgate-dev/tollgate/pkg/headers"
)

// CheckMethod is the full gRPC name of the call this package answers,
// for the server's per-method hooks.
const CheckMethod = authv3.Authorization_Check_FullMethodName

// OverloadResponse is the answer to a Check past --max-in-flight, given
// at once without deciding: always a 503 with Retry-After 1, whatever
// the store_failure policy. Admitting would skip the API key check and
// let a client's own x-tollgate-* headers through, turning the ext_authz
// path open and unauthenticated under load. It says
// x-tollgate-degraded: overload.
func OverloadResponse() *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.Unavailable)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
			Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: headers.Degraded, Value: headers.DegradedOverload}},
				{Header: &corev3.HeaderValue{Key: "retry-after", Value: "1"}},
				{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}}},
			Body: `{"error":{"message":"The rate limiter is overloaded. Retry after 1 second.","type":"server_error","code":"overloaded","tollgate_reason":"overload"}}`,
		}},
	}
}
