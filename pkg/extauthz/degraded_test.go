package extauthz

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TestDegradedHeader: an answer store_failure gave carries
// x-tollgate-degraded: store, on an admission (to the client, with the
// response) and on a denial; a normal answer does not.
func TestDegradedHeader(t *testing.T) {
	t.Parallel()
	lim := &limit.Limit{Kind: limit.Requests, Amount: 10, Unit: limit.Minute, Name: "tenant_requests"}
	tests := []struct {
		name       string
		give       *admission.Decision
		wantResult string
		want       bool
	}{
		{
			name:       "admitted by allow",
			give:       &admission.Decision{Code: limit.CodeOK, Degraded: true, Policy: limit.FailureAllow, Statuses: []limit.Status{{Code: limit.CodeOK}}},
			wantResult: resultOK, want: true,
		},
		{
			name: "admitted by local",
			give: &admission.Decision{Code: limit.CodeOK, Degraded: true, Policy: limit.FailureLocal,
				Statuses: []limit.Status{{Code: limit.CodeOK, Limit: lim, Remaining: 9, ResetAfter: time.Minute}}},
			wantResult: resultOK, want: true,
		},
		{
			name: "denied by deny",
			give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonLimit, Degraded: true, Policy: limit.FailureDeny,
				Statuses: []limit.Status{{Code: limit.CodeOverLimit, Limit: lim, RetryAfter: time.Second}}},
			wantResult: resultOverLimit, want: true,
		},
		{
			name:       "not degraded",
			give:       &admission.Decision{Code: limit.CodeOK, Statuses: []limit.Status{{Code: limit.CodeOK, Limit: lim, Remaining: 9}}},
			wantResult: resultOK, want: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, result, err := toAnswer(context.Background(), nil, &call{dec: tt.give, req: &limit.Request{Domain: "ai"}})
			if err != nil || result != tt.wantResult {
				t.Fatalf("toAnswer = %q, %v; want %q", result, err, tt.wantResult)
			}
			var hs []*corev3.HeaderValueOption
			switch r := resp.GetHttpResponse().(type) {
			case *authv3.CheckResponse_OkResponse:
				hs = r.OkResponse.GetResponseHeadersToAdd()
				for _, h := range r.OkResponse.GetHeaders() {
					if h.GetHeader().GetKey() == HeaderDegraded {
						t.Errorf("%s set on the upstream request, want it on the response only", HeaderDegraded)
					}
				}
			case *authv3.CheckResponse_DeniedResponse:
				hs = r.DeniedResponse.GetHeaders()
			}
			got := false
			for _, h := range hs {
				if h.GetHeader().GetKey() == HeaderDegraded {
					got = h.GetHeader().GetValue() == "store"
				}
			}
			if got != tt.want {
				t.Errorf("x-tollgate-degraded: store present = %v, want %v (headers %v)", got, tt.want, hs)
			}
		})
	}
}
