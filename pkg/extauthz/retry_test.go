package extauthz

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// retryRules allow each tenant 2 requests a minute and give the domain a
// retry budget.
const retryRules = `
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
retry_budget: {max: 3}
`

// modelSignals answers fixed retry signals per model.
type modelSignals map[string]limit.RetrySignals

func (s modelSignals) RetrySignals(_, model string) limit.RetrySignals { return s[model] }

// TestCheckRetryBudget: over real gRPC, an admitted request of a domain
// with a retry budget has x-envoy-max-retries set on its upstream
// request (overwriting any value the client sent), at the budget its
// model's signals allow, and a denied one carries none.
func TestCheckRetryBudget(t *testing.T) {
	t.Parallel()
	src := modelSignals{"flaky": {ErrorRate: 0.6}, "hot": {Pressure: 0.9}}
	lim := admission.NewLimiter(memstore.New(), storetest.NewFakeClock(t0), newRules(t, retryRules), admission.WithRetrySource(src))
	svc, err := New(lim, newSettings(t, testSettings), nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	client := authv3.NewAuthorizationClient(testutil.Serve(t, svc))
	tests := []struct {
		name     string
		key      string
		model    string
		wantCode codes.Code
		want     string // the header's value; "" for none
	}{
		{name: "calm", key: keyAcme, model: "gpt-4o", wantCode: codes.OK, want: "3"},
		{name: "errors above 0.5", key: keyAcme, model: "flaky", wantCode: codes.OK, want: "1"},
		{name: "tenant over its limit: denied, no header", key: keyAcme, model: "gpt-4o", wantCode: codes.ResourceExhausted},
		{name: "pressure at 0.9", key: keyFree, model: "hot", wantCode: codes.OK, want: "0"},
	}
	// In order: the third request is the tenant's third in the minute.
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.Check(ctx, checkRequest(chatBody(tt.model, 40, 10),
			"authorization", bearer(tt.key), "x-envoy-max-retries", "9"))
		cancel()
		if err != nil {
			t.Fatalf("%s: Check: %v", tt.name, err)
		}
		if got := codes.Code(resp.GetStatus().GetCode()); got != tt.wantCode {
			t.Fatalf("%s: code %v, want %v", tt.name, got, tt.wantCode)
		}
		var found []*corev3.HeaderValueOption
		for _, o := range append(resp.GetOkResponse().GetHeaders(), resp.GetDeniedResponse().GetHeaders()...) {
			if o.GetHeader().GetKey() == "x-envoy-max-retries" {
				found = append(found, o)
			}
		}
		for _, o := range resp.GetOkResponse().GetResponseHeadersToAdd() {
			if o.GetHeader().GetKey() == "x-envoy-max-retries" {
				t.Errorf("%s: x-envoy-max-retries sent to the client too", tt.name)
			}
		}
		switch {
		case tt.want == "" && len(found) != 0:
			t.Errorf("%s: got x-envoy-max-retries %v on a denied request, want none", tt.name, found)
		case tt.want != "" && len(found) != 1:
			t.Errorf("%s: got x-envoy-max-retries %v, want one header", tt.name, found)
		case tt.want != "":
			if v := found[0].GetHeader().GetValue(); v != tt.want {
				t.Errorf("%s: x-envoy-max-retries = %q, want %q", tt.name, v, tt.want)
			}
			if a := found[0].GetAppendAction(); a != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				t.Errorf("%s: append action %v, want OVERWRITE_IF_EXISTS_OR_ADD (the client's 9 must not stand)", tt.name, a)
			}
		}
	}
}
