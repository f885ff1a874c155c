package rls

import (
	"context"
	"errors"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TestDegradedAnswers: with store_failure set, a store that fails gives
// an answer by policy, marked x-tollgate-degraded: store, never an error.
func TestDegradedAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give limit.StoreFailure
		want *rlsv3.RateLimitResponse
	}{
		{
			name: "allow",
			give: limit.FailureAllow,
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok}},
				ResponseHeadersToAdd: hdrs(HeaderDegraded, "store"),
			},
		},
		{
			name: "deny",
			give: limit.FailureDeny,
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, rl("per-tenant", 5, rlsv3.RateLimitResponse_RateLimit_MINUTE), 0, time.Second)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `5, 5;w=60;name="per-tenant"`, HeaderRemaining, "0", HeaderReset, "1", HeaderRetryAfter, "1",
					headers.LimitRequests, "5", headers.RemainingRequests, "0", headers.ResetRequests, "1s",
					"content-type", "application/json", HeaderDegraded, "store"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded (per-tenant). Retry after 1 second.","type":"requests","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := newCountStore()
			store.err = errors.New("dial tcp 10.0.0.7:6379: connect: connection refused")
			l := admission.NewLimiter(store, fixedClock{now}, testRules(t), admission.WithStoreFailure(admission.FailurePolicy{Default: tt.give}))
			svc, err := New(l, zap.NewNop(), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			got, err := svc.ShouldRateLimit(context.Background(), request("ai", 0, desc("tenant", "acme")))
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v, want an answer", err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNotDegradedHasNoHeader(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	got, err := f.svc.ShouldRateLimit(context.Background(), request("ai", 0, desc("tenant", "acme")))
	if err != nil {
		t.Fatal(err)
	}
	if hasKey(got.GetResponseHeadersToAdd(), HeaderDegraded) {
		t.Errorf("headers = %v, want no %s", got.GetResponseHeadersToAdd(), HeaderDegraded)
	}
}

func hasKey(hs []*corev3.HeaderValue, key string) bool {
	for _, h := range hs {
		if h.GetKey() == key {
			return true
		}
	}
	return false
}
