package extauthz

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

func TestToAnswerAdmission(t *testing.T) {
	t.Parallel()
	refused := func(reason admission.Reason, retry time.Duration) *admission.Decision {
		return &admission.Decision{Code: limit.CodeOverLimit, Reason: reason, RetryAfter: retry, Tier: "free",
			Statuses: []limit.Status{{Code: limit.CodeOverLimit, RetryAfter: retry}}}
	}
	denied := func(body, reason, retry string) *authv3.CheckResponse {
		return &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.Unavailable)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: 503},
				Headers: []*corev3.HeaderValueOption{
					hv("content-type", "application/json"), hv("retry-after", retry), hv("x-tollgate-reason", reason),
				},
				Body: body,
			}},
		}
	}
	tests := []struct {
		name       string
		give       *admission.Decision
		want       *authv3.CheckResponse
		wantResult string
	}{
		{
			name: "shed",
			give: refused(admission.ReasonShed, 30*time.Second),
			want: denied(`{"error":{"message":"The service is overloaded; requests of your plan are paused. Retry after 30 seconds.","type":"server_error","code":"overloaded","tollgate_reason":"shed"}}`,
				"shed", "30"),
			wantResult: resultShed,
		},
		{
			name: "breaker open",
			give: refused(admission.ReasonBreaker, 1200*time.Millisecond),
			want: denied(`{"error":{"message":"The model is failing and temporarily unavailable. Retry after 2 seconds.","type":"server_error","code":"upstream_unavailable","tollgate_reason":"breaker"}}`,
				"breaker", "2"),
			wantResult: resultBreakerOpen,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, result, err := toAnswer(context.Background(), nil, &call{dec: tt.give})
			if err != nil || result != tt.wantResult {
				t.Fatalf("toAnswer = %q, %v; want %q", result, err, tt.wantResult)
			}
			if diff := cmp.Diff(tt.want, resp, protocmp.Transform()); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMetadataProbes: probes travel only inside the signed ticket, so an
// outcome cannot claim a probe its request was not given.
func TestMetadataProbes(t *testing.T) {
	t.Parallel()
	sealer, err := ticket.NewSealer(ticket.RandomKeys(), 0)
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1_800_000_000_000)
	probes := []limit.Probe{{Key: "model", Name: "m", ID: "17.0123456789abcdef0123456789abcdef"}}
	c := &call{id: authn.Identity{Tenant: "acme"}, model: "m", sealer: sealer,
		req: &limit.Request{Domain: "ai", ID: "r.1", Model: "m"},
		dec: &admission.Decision{Code: limit.CodeOK, At: at, Probes: probes}}
	f := metadata(c).GetFields()
	if len(f) != 3 || f[ticket.FieldTenant].GetStringValue() != "acme" || f[ticket.FieldModel].GetStringValue() != "m" {
		t.Errorf("metadata fields %v, want tenant, model and the ticket", f)
	}
	tk, err := sealer.Open(f[ticket.Field].GetStringValue(), at)
	if err != nil {
		t.Fatalf("the ticket does not open: %v", err)
	}
	want := ticket.Ticket{ID: "r.1", Domain: "ai", Model: "m", At: at, Probes: probes}
	if diff := cmp.Diff(want, *tk); diff != "" {
		t.Errorf("ticket (-want +got):\n%s", diff)
	}
}
