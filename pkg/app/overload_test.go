package app

import (
	"context"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/rls"
)

func TestOverloadAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      limit.StoreFailure
		wantAdmit bool
	}{
		{"allow admits", limit.FailureAllow, true},
		{"deny refuses", limit.FailureDeny, false},
		{"local refuses: no work on an overloaded replica", limit.FailureLocal, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			answer := overloadAnswer(tt.give)
			got, err := answer(context.Background(), rls.ShouldRateLimitMethod, nil)
			if err != nil {
				t.Fatal(err)
			}
			rl := got.(*rlsv3.RateLimitResponse)
			if (rl.GetOverallCode() == rlsv3.RateLimitResponse_OK) != tt.wantAdmit {
				t.Errorf("ShouldRateLimit: %v", rl.GetOverallCode())
			}
			if !hasHeaderValue(rl.GetResponseHeadersToAdd(), "x-tollgate-degraded", "overload") {
				t.Errorf("ShouldRateLimit headers %v lack x-tollgate-degraded: overload", rl.GetResponseHeadersToAdd())
			}
			got, err = answer(context.Background(), extauthz.CheckMethod, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Check is refused whatever the policy: admitting it would
			// skip the API key check.
			ck := got.(*authv3.CheckResponse)
			if ck.GetOkResponse() != nil || ck.GetDeniedResponse().GetStatus().GetCode() != 503 {
				t.Errorf("Check under overload: %v, want a 503 denial", ck)
			}
			if _, err := answer(context.Background(), "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs", nil); status.Code(err) != codes.ResourceExhausted {
				t.Errorf("another method: %v, want ResourceExhausted", err)
			}
		})
	}
}

func hasHeaderValue[H interface {
	GetKey() string
	GetValue() string
}](hs []H, key, value string) bool {
	for _, h := range hs {
		if h.GetKey() == key && h.GetValue() == value {
			return true
		}
	}
	return false
}
