package app

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
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

// BenchmarkRetryObserved: what counting a decision's retry budget adds to
// an admitted decision of a domain with one, on the in-process store.
func BenchmarkRetryObserved(b *testing.B) {
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:        "d",
		RetryBudget: new(limit.DefaultRetryBudget()),
		Descriptors: []*limit.Rule{{Key: "tenant", RateLimit: &limit.Limit{Amount: 1 << 40, Unit: limit.Second, Algorithm: limit.FixedWindow}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	lim := admission.NewLimiter(memstore.New(), nil, rs)
	m, err := newRetryMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		name string
		d    decider
	}{{"plain", lim}, {"observed", m.observe(lim, retryAdapterRLS)}} {
		b.Run(bb.name, func(b *testing.B) {
			req := &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "a"}}}}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				dec, err := bb.d.Decide(ctx, req)
				if err != nil || !dec.HasRetries {
					b.Fatalf("Decide = %+v, %v", dec, err)
				}
			}
		})
	}
}
