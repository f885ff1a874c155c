package rls

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// retryRules allow each model 2 requests a minute and give the domain a
// retry budget.
const retryRules = `
domain: ai
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 2}
retry_budget: {max: 3}
`

// signals answers fixed retry signals per model.
type signals map[string]limit.RetrySignals

func (s signals) RetrySignals(_, model string) limit.RetrySignals { return s[model] }

// TestShouldRateLimitRetryBudget: over real gRPC, an admitted request of
// a domain with a retry budget carries x-envoy-max-retries in
// request_headers_to_add, at the budget its model's signals allow, and a
// denied one carries none.
func TestShouldRateLimitRetryBudget(t *testing.T) {
	t.Parallel()
	d, err := config.Parse("rules.yaml", []byte(retryRules))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatal(err)
	}
	src := signals{
		"flaky":      {ErrorRate: 0.3},
		"overloaded": {Pressure: 0.95},
		"broken":     {BreakerOpen: true},
	}
	svc, err := New(admission.NewLimiter(memstore.New(), nil, rs, admission.WithRetrySource(src)), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	client := rlsv3.NewRateLimitServiceClient(testutil.Serve(t, svc))
	retries := func(n string) []*corev3.HeaderValue {
		return []*corev3.HeaderValue{{Key: "x-envoy-max-retries", Value: n}}
	}
	tests := []struct {
		name     string
		give     string // the model
		wantCode rlsv3.RateLimitResponse_Code
		want     []*corev3.HeaderValue
	}{
		{name: "calm model, first", give: "calm", wantCode: rlsv3.RateLimitResponse_OK, want: retries("3")},
		{name: "calm model, second", give: "calm", wantCode: rlsv3.RateLimitResponse_OK, want: retries("3")},
		{name: "calm model, third is denied: no header", give: "calm", wantCode: rlsv3.RateLimitResponse_OVER_LIMIT},
		{name: "errors above 0.2", give: "flaky", wantCode: rlsv3.RateLimitResponse_OK, want: retries("2")},
		{name: "overloaded replica", give: "overloaded", wantCode: rlsv3.RateLimitResponse_OK, want: retries("0")},
		{name: "breaker open", give: "broken", wantCode: rlsv3.RateLimitResponse_OK, want: retries("0")},
	}
	// In order, not in parallel: the third request depends on the two
	// before it.
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.ShouldRateLimit(ctx, request("ai", 0, desc("model", tt.give)))
		cancel()
		if err != nil {
			t.Fatalf("%s: ShouldRateLimit: %v", tt.name, err)
		}
		if resp.GetOverallCode() != tt.wantCode {
			t.Errorf("%s: code %v, want %v", tt.name, resp.GetOverallCode(), tt.wantCode)
		}
		if diff := cmp.Diff(tt.want, resp.GetRequestHeadersToAdd(), protocmp.Transform()); diff != "" {
			t.Errorf("%s: request_headers_to_add (-want +got):\n%s", tt.name, diff)
		}
	}
}

// TestShouldRateLimitNoRetryBudget: a domain without a retry budget
// leaves the request's headers alone, so the route's own retry policy
// stands.
func TestShouldRateLimitNoRetryBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	client := rlsv3.NewRateLimitServiceClient(testutil.Serve(t, f.svc))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, request("ai", 0, desc("tenant", "a")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetRequestHeadersToAdd()) != 0 {
		t.Errorf("got code %v, request_headers_to_add %v; want OK and none", resp.GetOverallCode(), resp.GetRequestHeadersToAdd())
	}
}
