package rls

import (
	"context"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// newTierFixture serves testRules' per-tenant limit (5 a minute) in a
// domain with plans premium x3 and free x1 (the default).
func newTierFixture(t testing.TB) *fixture {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:  "ai",
		Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "free": 1}},
		Descriptors: []*limit.Rule{
			{Key: "tenant", RateLimit: &limit.Limit{Name: "per-tenant", Amount: 5, Unit: limit.Minute}},
		},
	})
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	store := newCountStore()
	reg := prometheus.NewRegistry()
	svc, err := New(admission.NewLimiter(store, fixedClock{now}, rs), zap.NewNop(), reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &fixture{svc: svc, store: store, reg: reg}
}

func TestShouldRateLimitTiers(t *testing.T) {
	t.Parallel()
	limitOf := func(n uint32) *rlsv3.RateLimitResponse_RateLimit {
		return rl("per-tenant", n, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	}
	tests := []struct {
		name  string
		prior []*rlsv3.RateLimitRequest
		give  *rlsv3.RateLimitRequest
		want  *rlsv3.RateLimitResponse
	}{
		{
			name: "premium reports its effective limit",
			give: request("ai", 0, desc("tenant", "acme", "tier", "premium")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limitOf(15), 14, 39750*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `15, 15;w=60;name="per-tenant"`, HeaderRemaining, "14", HeaderReset, "40",
					headers.LimitRequests, "15", headers.RemainingRequests, "14", headers.ResetRequests, "39.75s"),
			},
		},
		{
			name: "no tier gets the default plan",
			give: request("ai", 0, desc("tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limitOf(5), 4, 39750*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `5, 5;w=60;name="per-tenant"`, HeaderRemaining, "4", HeaderReset, "40",
					headers.LimitRequests, "5", headers.RemainingRequests, "4", headers.ResetRequests, "39.75s"),
			},
		},
		{
			name:  "one counter across plans: free usage counts against premium",
			prior: repeat(5, request("ai", 0, desc("tenant", "acme", "tier", "free"))),
			give:  request("ai", 0, desc("tier", "premium", "tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limitOf(15), 9, 39750*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `15, 15;w=60;name="per-tenant"`, HeaderRemaining, "9", HeaderReset, "40",
					headers.LimitRequests, "15", headers.RemainingRequests, "9", headers.ResetRequests, "39.75s"),
			},
		},
		{
			name:  "the free plan is over where premium was not",
			prior: repeat(6, request("ai", 0, desc("tenant", "acme", "tier", "premium"))),
			give:  request("ai", 0, desc("tenant", "acme", "tier", "made-up")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, limitOf(5), 0, 15*time.Second)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `5, 5;w=60;name="per-tenant"`, HeaderRemaining, "0", HeaderReset, "15", HeaderRetryAfter, "15",
					headers.LimitRequests, "5", headers.RemainingRequests, "0", headers.ResetRequests, "15s",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded (per-tenant). Retry after 15 seconds.","type":"requests","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`),
			},
		},
		{
			name: "a descriptor of the tier alone matches nothing",
			give: request("ai", 0, desc("tier", "premium")),
			want: &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{okNoLimit()}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newTierFixture(t)
			for i, p := range tt.prior {
				if _, err := f.svc.ShouldRateLimit(context.Background(), p); err != nil {
					t.Fatalf("prior[%d]: %v", i, err)
				}
			}
			got, err := f.svc.ShouldRateLimit(context.Background(), tt.give)
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMetricsTierLabel(t *testing.T) {
	t.Parallel()
	f := newTierFixture(t)
	for _, r := range []*rlsv3.RateLimitRequest{
		request("ai", 0, desc("tenant", "a", "tier", "premium")),
		request("ai", 0, desc("tenant", "a", "tier", "sneaky-made-up-value")),
		request("ai", 0, desc("tenant", "a")),
	} {
		if _, err := f.svc.ShouldRateLimit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	got := testutil.Gather(t, f.reg)
	for k, want := range map[string]float64{
		`tollgate_rls_decisions_total{domain="ai",result="ok",rule="tenant",tier="premium"}`: 1,
		`tollgate_rls_decisions_total{domain="ai",result="ok",rule="tenant",tier="free"}`:    2,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], want, got)
		}
	}
}
