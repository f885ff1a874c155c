package extauthz

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestOverloadResponse: a Check past --max-in-flight is refused with a
// 503 and Retry-After, never admitted, as admitting would skip the API
// key check.
func TestOverloadResponse(t *testing.T) {
	t.Parallel()
	want := &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: 14}, // UNAVAILABLE
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: 503},
			Headers: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-tollgate-degraded", Value: "overload"}},
				{Header: &corev3.HeaderValue{Key: "retry-after", Value: "1"}},
				{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}},
			},
			Body: `{"error":{"message":"The rate limiter is overloaded. Retry after 1 second.","type":"server_error","code":"overloaded","tollgate_reason":"overload"}}`,
		}},
	}
	if diff := cmp.Diff(want, OverloadResponse(), protocmp.Transform()); diff != "" {
		t.Errorf("OverloadResponse() (-want +got):\n%s", diff)
	}
}
