package rls

import (
	"context"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

func TestToResponseAdmission(t *testing.T) {
	t.Parallel()
	over := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	tests := []struct {
		name string
		give *admission.Decision
		want *rlsv3.RateLimitResponse
	}{
		{
			name: "shed",
			give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonShed, RetryAfter: 1500 * time.Millisecond,
				Statuses: []limit.Status{{Code: limit.CodeOverLimit}, {Code: limit.CodeOverLimit}}},
			want: &rlsv3.RateLimitResponse{
				OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{over, over},
				ResponseHeadersToAdd: hdrs("content-type", "application/json", HeaderRetryAfter, "2", HeaderReason, "shed"),
				RawBody:              []byte(`{"error":{"message":"The service is overloaded; requests of your plan are paused. Retry after 2 seconds.","type":"server_error","code":"overloaded","tollgate_reason":"shed"}}`),
			},
		},
		{
			name: "breaker open",
			give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonBreaker, RetryAfter: 20 * time.Second,
				Statuses: []limit.Status{{Code: limit.CodeOverLimit}}},
			want: &rlsv3.RateLimitResponse{
				OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{over},
				ResponseHeadersToAdd: hdrs("content-type", "application/json", HeaderRetryAfter, "20", HeaderReason, "breaker"),
				RawBody:              []byte(`{"error":{"message":"The model is failing and temporarily unavailable. Retry after 20 seconds.","type":"server_error","code":"upstream_unavailable","tollgate_reason":"breaker"}}`),
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
	dec   *admission.Decision
	rules *limit.RuleSet
}

func (f fixedDecider) Decide(context.Context, *limit.Request) (*admission.Decision, error) {
	return f.dec, nil
}
func (f fixedDecider) Rules() *limit.RuleSet { return f.rules }

// TestTicket: an admitted request of a domain with breakers carries a
// signed ticket, with its probes, for the access log; one of a domain
// without breakers or shedding, or a refused one, carries none.
func TestTicket(t *testing.T) {
	t.Parallel()
	at := time.UnixMilli(1_800_000_000_000)
	rule := []*limit.Rule{{Key: "model", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Second}}}
	withBreaker, err := limit.NewRuleSet(
		&limit.Domain{Name: "d", Descriptors: rule, Breakers: []limit.BreakerConfig{{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute}}},
		&limit.Domain{Name: "plain", Descriptors: rule},
	)
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := ticket.NewSealer(ticket.RandomKeys(), 0)
	if err != nil {
		t.Fatal(err)
	}
	probes := []limit.Probe{{Key: "model", Name: "m", ID: "17.0123456789abcdef0123456789abcdef"}}
	descs := []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "model", Value: "m"}}}}
	for _, tt := range []struct {
		name, domain string
		code         limit.Code
		want         bool
	}{
		{name: "admitted, with breakers", domain: "d", code: limit.CodeOK, want: true},
		{name: "refused", domain: "d", code: limit.CodeOverLimit},
		{name: "no breakers or shedding", domain: "plain", code: limit.CodeOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dec := &admission.Decision{Code: tt.code, At: at, Probes: probes, Statuses: []limit.Status{{Code: tt.code}}}
			svc, err := New(fixedDecider{dec: dec, rules: withBreaker}, nil, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			svc.SetSealer(sealer)
			resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: tt.domain, Descriptors: descs})
			if err != nil {
				t.Fatal(err)
			}
			str := resp.GetDynamicMetadata().GetFields()[ticket.Field].GetStringValue()
			if !tt.want {
				if resp.GetDynamicMetadata() != nil {
					t.Errorf("dynamic metadata %v, want none", resp.GetDynamicMetadata())
				}
				return
			}
			tk, err := sealer.Open(str, at)
			if err != nil {
				t.Fatalf("the ticket does not open: %v", err)
			}
			if len(tk.ID) != 32 || tk.Domain != "d" || tk.Reserved || !cmp.Equal(tk.Probes, probes) ||
				!cmp.Equal(tk.Descriptors, []limit.Descriptor{{Entries: []limit.Entry{{Key: "model", Value: "m"}}}}) {
				t.Errorf("ticket %+v", tk)
			}
		})
	}
}

func TestMetricsAdmissionResults(t *testing.T) {
	t.Parallel()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Descriptors: []*limit.Rule{{Key: "k", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Second}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		give *admission.Decision
		want string
	}{
		{give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonShed, Tier: "free", Statuses: []limit.Status{{Code: limit.CodeOverLimit}}}, want: resultShed},
		{give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonBreaker, Tier: "free", Statuses: []limit.Status{{Code: limit.CodeOverLimit}}}, want: resultBreakerOpen},
		{give: &admission.Decision{Code: limit.CodeOK, ShadowShed: true, Tier: "free", Statuses: []limit.Status{{Code: limit.CodeOK}}}, want: resultShadowShed},
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
