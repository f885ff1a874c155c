package rls

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestOverloadResponse(t *testing.T) {
	t.Parallel()
	degraded := &corev3.HeaderValue{Key: "x-tollgate-degraded", Value: "overload"}
	admit := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: []*corev3.HeaderValue{degraded}}
	refuse := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		ResponseHeadersToAdd: []*corev3.HeaderValue{degraded, {Key: "retry-after", Value: "1"}, {Key: "content-type", Value: "application/json"}},
		// Check's body past --max-in-flight.
		RawBody: []byte(`{"error":{"message":"The rate limiter is overloaded. Retry after 1 second.","type":"server_error","code":"overloaded","tollgate_reason":"overload"}}`)}
	tests := []struct {
		name string
		give limit.StoreFailure
		want *rlsv3.RateLimitResponse
	}{
		{name: "unset admits", give: limit.FailureUnset, want: admit},
		{name: "allow admits", give: limit.FailureAllow, want: admit},
		{name: "deny refuses", give: limit.FailureDeny, want: refuse},
		{name: "local refuses: no work on an overloaded replica", give: limit.FailureLocal, want: refuse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, OverloadResponse(tt.give), protocmp.Transform()); diff != "" {
				t.Errorf("OverloadResponse(%v) (-want +got):\n%s", tt.give, diff)
			}
		})
	}
}
