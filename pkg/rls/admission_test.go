package rls

import (
	"context"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/extauthz/reservation"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestToResponseAdmission(t *testing.T) {
	t.Parallel()
	over := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	tests := []struct {
		name string
		give *limit.Decision
		want *rlsv3.RateLimitResponse
	}{
		{
			name: "shed",
			give: &limit.Decision{Code: limit.CodeOverLimit, Reason: limit.ReasonShed, RetryAfter: 1500 * time.Millisecond,
				Statuses: []limit.Status{{Code: limit.CodeOverLimit}, {Code: limit.CodeOverLimit}}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{over, over},
				ResponseHeadersToAdd: []*corev3.HeaderValue{
					{Key: "retry-after", Value: "2"}, {Key: "x-tollgate-reason", Value: "shed"},
				},
			},
		},
		{
			name: "breaker open",
			give: &limit.Decision{Code: limit.CodeOverLimit, Reason: limit.ReasonBreaker, RetryAfter: 20 * time.Second,
				Statuses: []limit.Status{{Code: limit.CodeOverLimit}}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{over},
				ResponseHeadersToAdd: []*corev3.HeaderValue{
					{Key: "retry-after", Value: "20"}, {Key: "x-tollgate-reason", Value: "breaker"},
				},
			},
		},
		{
			name: "a probe in the dynamic metadata",
			give: &limit.Decision{Code: limit.CodeOK, Statuses: []limit.Status{{Code: limit.CodeOK}},
				Probes: []limit.Probe{{Key: "model", Name: "m", ID: "17.1"}}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: rlsv3.RateLimitResponse_OK,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}},
				DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
					reservation.FieldProbes: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
						"model": structpb.NewStringValue("17.1"),
					}}),
				}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, toResponse(tt.give), protocmp.Transform()); diff != "" {
				t.Errorf("toResponse (-want +got):\n%s", diff)
			}
		})
	}
}

// fixedDecider answers every request with dec.
type fixedDecider struct {
	dec   *limit.Decision
	rules *limit.RuleSet
}

func (f fixedDecider) Decide(context.Context, *limit.Request) (*limit.Decision, error) {
	return f.dec, nil
}
func (f fixedDecider) Rules() *limit.RuleSet { return f.rules }

func TestMetricsAdmissionResults(t *testing.T) {
	t.Parallel()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Descriptors: []*limit.Rule{{Key: "k", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Second}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		give *limit.Decision
		want string
	}{
		{give: &limit.Decision{Code: limit.CodeOverLimit, Reason: limit.ReasonShed, Tier: "free", Statuses: []limit.Status{{Code: limit.CodeOverLimit}}}, want: resultShed},
		{give: &limit.Decision{Code: limit.CodeOverLimit, Reason: limit.ReasonBreaker, Tier: "free", Statuses: []limit.Status{{Code: limit.CodeOverLimit}}}, want: resultBreakerOpen},
		{give: &limit.Decision{Code: limit.CodeOK, ShadowShed: true, Tier: "free", Statuses: []limit.Status{{Code: limit.CodeOK}}}, want: resultShadowShed},
	} {
		reg := prometheus.NewRegistry()
		svc, err := New(fixedDecider{dec: tt.give, rules: rs}, nil, reg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d"}); err != nil {
			t.Fatal(err)
		}
		key := `tollgate_rls_decisions_total{domain="d",result="` + tt.want + `",rule="none",tier="free"}`
		if got := testutil.Gather(t, reg)[key]; got != 1 {
			t.Errorf("decisions{result=%s} = %v, want 1", tt.want, got)
		}
	}
}
