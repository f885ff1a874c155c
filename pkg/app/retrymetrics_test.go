package app

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestServeRetryBudgetMetric: over real gRPC, each retry budget an RLS
// answer carries is counted in tollgate_retry_budget_granted under its
// domain and adapter; a domain without a budget, and a domain the rules
// lack, add no series.
func TestServeRetryBudgetMetric(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	const limit = "descriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n"
	writeFile(t, filepath.Join(dir, "full.yaml"), "domain: full\nretry_budget: {}\n"+limit)
	writeFile(t, filepath.Join(dir, "one.yaml"), "domain: one\nretry_budget: {max: 1}\n"+limit)
	writeFile(t, filepath.Join(dir, "plain.yaml"), "domain: plain\n"+limit)
	r := startReplica(t, ctx, dir)
	calls := []struct {
		domain string
		n      int
	}{{"full", 2}, {"one", 1}, {"plain", 1}, {"not-in-the-rules", 1}}
	for _, c := range calls {
		for range c.n {
			resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain:      c.domain,
				Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}},
			})
			if err != nil {
				t.Fatalf("ShouldRateLimit(%s): %v", c.domain, err)
			}
			if c.domain == "full" && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("ShouldRateLimit(full) = %v, want OK", resp)
			}
		}
	}
	_, metrics := r.get("/metrics")
	tests := []struct {
		name string
		give string // a line of /metrics
		want bool
	}{
		{name: "full: both budgets of 3", give: `tollgate_retry_budget_granted_bucket{adapter="rls",domain="full",le="2"} 0`, want: true},
		{name: "full: counted", give: `tollgate_retry_budget_granted_count{adapter="rls",domain="full"} 2`, want: true},
		{name: "full: summed", give: `tollgate_retry_budget_granted_sum{adapter="rls",domain="full"} 6`, want: true},
		{name: "one: its max of 1", give: `tollgate_retry_budget_granted_bucket{adapter="rls",domain="one",le="1"} 1`, want: true},
		{name: "one: nothing at 0", give: `tollgate_retry_budget_granted_bucket{adapter="rls",domain="one",le="0"} 0`, want: true},
		{name: "plain: no budget, no series", give: `domain="plain"`},
		{name: "unknown: no series", give: `domain="not-in-the-rules"`},
	}
	got := grepLines(metrics, "tollgate_retry_budget_granted")
	for _, tt := range tests {
		if has := strings.Contains(got, tt.give); has != tt.want {
			t.Errorf("%s: /metrics has %q = %v, want %v\n%s", tt.name, tt.give, has, tt.want, got)
		}
	}
}
