package rls

import (
	"context"
	"errors"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"math"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// now is 20.25 s into a minute, 0.25 s into a second and 20.25 s into a
// 30-second window, so every window's reset differs.
var now = time.Unix(1_700_000_000, 250_000_000)

func testRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "ai", Descriptors: []*limit.Rule{
		{Key: "tenant", RateLimit: &limit.Limit{Name: "per-tenant", Amount: 5, Unit: limit.Minute}, Children: []*limit.Rule{
			{Key: "model", Value: "gpt-4o", RateLimit: &limit.Limit{Amount: 2, Unit: limit.Second}, DetailedMetric: true},
		}},
		{Key: "shadow", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Minute}, Shadow: true},
		{Key: "free", Unlimited: true},
		{Key: "big", RateLimit: &limit.Limit{Amount: 1 << 40, Unit: limit.Hour}},
	}})
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return rs
}

type fixture struct {
	svc   *Service
	store *countStore
	reg   *prometheus.Registry
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	store := newCountStore()
	reg := prometheus.NewRegistry()
	svc, err := New(admission.NewLimiter(store, fixedClock{now}, testRules(t)), zap.NewNop(), reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &fixture{svc: svc, store: store, reg: reg}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *commonrl.RateLimitDescriptor {
	d := &commonrl.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(domain string, hits uint32, ds ...*commonrl.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

func withHits(d *commonrl.RateLimitDescriptor, n uint64, negative bool) *commonrl.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	d.IsNegativeHits = negative
	return d
}

func withLimit(d *commonrl.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult *wrapperspb.UInt32Value) *commonrl.RateLimitDescriptor {
	d.Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit, UnitMultiplier: mult}
	return d
}

func rl(name string, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit}
}

func okNoLimit() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
}

func st(code rlsv3.RateLimitResponse_Code, l *rlsv3.RateLimitResponse_RateLimit, remaining uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: l, LimitRemaining: remaining, DurationUntilReset: durationpb.New(reset)}
}

// hdrs builds headers from name, value pairs.
func hdrs(kv ...string) []*corev3.HeaderValue {
	var hs []*corev3.HeaderValue
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1]})
	}
	return hs
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestShouldRateLimit(t *testing.T) {
	t.Parallel()
	perTenant := rl("per-tenant", 5, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	perModel := rl("", 2, rlsv3.RateLimitResponse_RateLimit_SECOND)
	// tenantHeaders are per-tenant's headers: the draft-03 trio, reset
	// in whole seconds, and the same as -requests, resetRequests a
	// duration to the millisecond.
	tenantHeaders := func(remaining, reset, resetRequests string) []*corev3.HeaderValue {
		return hdrs(HeaderLimit, `5, 5;w=60;name="per-tenant"`, HeaderRemaining, remaining, HeaderReset, reset,
			headers.LimitRequests, "5", headers.RemainingRequests, remaining, headers.ResetRequests, resetRequests)
	}
	tests := []struct {
		name  string
		prior []*rlsv3.RateLimitRequest
		give  *rlsv3.RateLimitRequest
		want  *rlsv3.RateLimitResponse
	}{
		{
			name: "under the limit",
			give: request("ai", 0, desc("tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 4, 39750*time.Millisecond)},
				ResponseHeadersToAdd: tenantHeaders("4", "40", "39.75s"),
			},
		},
		{
			name:  "over the limit reports the retry time",
			prior: repeat(5, request("ai", 0, desc("tenant", "acme"))),
			give:  request("ai", 0, desc("tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, perTenant, 0, 15*time.Second)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `5, 5;w=60;name="per-tenant"`, HeaderRemaining, "0", HeaderReset, "15", HeaderRetryAfter, "15",
					headers.LimitRequests, "5", headers.RemainingRequests, "0", headers.ResetRequests, "15s",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded (per-tenant). Retry after 15 seconds.","type":"requests","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`),
			},
		},
		{
			name: "nested rule and a descriptor no rule matches",
			give: request("ai", 0, desc("tenant", "acme", "model", "gpt-4o"), desc("other", "x")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perModel, 1, 750*time.Millisecond), okNoLimit()},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "2, 2;w=1", HeaderRemaining, "1", HeaderReset, "1",
					headers.LimitRequests, "2", headers.RemainingRequests, "1", headers.ResetRequests, "750ms"),
			},
		},
		{
			name: "headers come from the smallest remaining and list every policy",
			give: request("ai", 0, desc("tenant", "acme"), desc("tenant", "acme", "model", "gpt-4o")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(ok, perTenant, 4, 39750*time.Millisecond),
					st(ok, perModel, 1, 750*time.Millisecond),
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `2, 5;w=60;name="per-tenant", 2;w=1`, HeaderRemaining, "1", HeaderReset, "1",
					headers.LimitRequests, "2", headers.RemainingRequests, "1", headers.ResetRequests, "750ms"),
			},
		},
		{
			name: "one denial fails the request and charges nothing",
			prior: append(repeat(2, request("ai", 0, desc("tenant", "acme", "model", "gpt-4o"))),
				request("ai", 0, desc("tenant", "other"))),
			give: request("ai", 0, desc("tenant", "other"), desc("tenant", "acme", "model", "gpt-4o")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(ok, perTenant, 4, 39750*time.Millisecond),
					st(over, perModel, 0, 250*time.Millisecond),
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `2, 5;w=60;name="per-tenant", 2;w=1`, HeaderRemaining, "0", HeaderReset, "1", HeaderRetryAfter, "1",
					headers.LimitRequests, "2", headers.RemainingRequests, "0", headers.ResetRequests, "250ms",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded. Retry after 1 second.","type":"requests","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`),
			},
		},
		{
			name: "unknown domain is allowed without a limit",
			give: request("nope", 0, desc("tenant", "acme"), desc("x", "y")),
			want: &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{okNoLimit(), okNoLimit()}},
		},
		{
			// As envoyproxy/ratelimit answers it (issue 18).
			name: "unlimited rule has no current limit and all a uint32 holds remaining",
			give: request("ai", 0, desc("free", "x")),
			want: &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32},
			}},
		},
		{
			// A descriptor with no entries (nil here, empty on the wire)
			// matches nothing: OK without a limit, as envoyproxy/ratelimit
			// answers it (issue 18), beside one that is counted.
			name: "descriptor with no entries",
			give: request("ai", 0, desc("tenant", "acme"), nil, &commonrl.RateLimitDescriptor{}),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 4, 39750*time.Millisecond), okNoLimit(), okNoLimit()},
				ResponseHeadersToAdd: tenantHeaders("4", "40", "39.75s"),
			},
		},
		{
			name: "request hits_addend",
			give: request("ai", 3, desc("tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 2, 39750*time.Millisecond)},
				ResponseHeadersToAdd: tenantHeaders("2", "40", "39.75s"),
			},
		},
		{
			name: "descriptor hits_addend beats the request's",
			give: request("ai", 3, withHits(desc("tenant", "acme"), 1, false)),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 4, 39750*time.Millisecond)},
				ResponseHeadersToAdd: tenantHeaders("4", "40", "39.75s"),
			},
		},
		{
			name:  "descriptor hits_addend zero checks without charging",
			prior: []*rlsv3.RateLimitRequest{request("ai", 2, desc("tenant", "acme"))},
			give:  request("ai", 3, withHits(desc("tenant", "acme"), 0, false)),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 3, 39750*time.Millisecond)},
				ResponseHeadersToAdd: tenantHeaders("3", "40", "39.75s"),
			},
		},
		{
			// It can never fit: no wait is reported (no duration, no
			// Retry-After, no x-ratelimit-reset), and the body says why.
			name: "hits_addend above the limit is denied as too large and not charged",
			give: request("ai", 6, desc("tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					// Remaining 0 on a denial, as envoyproxy/ratelimit
					// reports it (issue 18), though nothing was charged.
					{Code: over, CurrentLimit: perTenant},
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `5, 5;w=60;name="per-tenant"`, HeaderRemaining, "0",
					headers.LimitRequests, "5", headers.RemainingRequests, "0",
					HeaderReason, headers.ReasonTooLarge, headers.ShouldRetry, "false",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Request too large for the requests limit \"per-tenant\": Limit 5, Requested 6. The request must be made smaller; retrying it cannot succeed.","type":"invalid_request_error","code":"request_too_large","tollgate_reason":"too_large"}}`),
			},
		},
		{
			name:  "too large wins over a descriptor that must only wait",
			prior: repeat(2, request("ai", 0, desc("tenant", "acme", "model", "gpt-4o"))),
			give:  request("ai", 0, desc("tenant", "acme", "model", "gpt-4o"), withHits(desc("tenant", "other"), 6, false)),
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(over, perModel, 0, 250*time.Millisecond),
					{Code: over, CurrentLimit: perTenant},
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `5, 2;w=1, 5;w=60;name="per-tenant"`, HeaderRemaining, "0",
					headers.LimitRequests, "5", headers.RemainingRequests, "0",
					HeaderReason, headers.ReasonTooLarge, headers.ShouldRetry, "false",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Request too large for the requests limit \"per-tenant\": Limit 5, Requested 6. The request must be made smaller; retrying it cannot succeed.","type":"invalid_request_error","code":"request_too_large","tollgate_reason":"too_large"}}`),
			},
		},
		{
			name: "hits_addend equal to the limit fits",
			give: request("ai", 5, desc("tenant", "acme")),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 0, 39750*time.Millisecond)},
				ResponseHeadersToAdd: tenantHeaders("0", "40", "39.75s"),
			},
		},
		{
			name:  "negative hits refund",
			prior: []*rlsv3.RateLimitRequest{request("ai", 3, desc("tenant", "acme"))},
			give:  request("ai", 0, withHits(desc("tenant", "acme"), 2, true)),
			want: &rlsv3.RateLimitResponse{
				OverallCode:          ok,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, perTenant, 4, 39750*time.Millisecond)},
				ResponseHeadersToAdd: tenantHeaders("4", "40", "39.75s"),
			},
		},
		{
			// The override is a limit of its own, without the rule's
			// name, as envoyproxy/ratelimit reports it (issue 18).
			name: "override with a unit multiplier has no name",
			give: request("ai", 0, withLimit(desc("tenant", "acme"), 3, typev3.RateLimitUnit_SECOND, wrapperspb.UInt32(30))),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, &rlsv3.RateLimitResponse_RateLimit{
					RequestsPerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, UnitMultiplier: wrapperspb.UInt32(30),
				}, 2, 9750*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "3, 3;w=30", HeaderRemaining, "2", HeaderReset, "10",
					headers.LimitRequests, "3", headers.RemainingRequests, "2", headers.ResetRequests, "9.75s"),
			},
		},
		{
			name: "override without a rule or multiplier",
			give: request("ai", 0, withLimit(desc("other", "x"), 10, typev3.RateLimitUnit_MINUTE, nil)),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, rl("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE), 9, 39750*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "10, 10;w=60", HeaderRemaining, "9", HeaderReset, "40",
					headers.LimitRequests, "10", headers.RemainingRequests, "9", headers.ResetRequests, "39.75s"),
			},
		},
		{
			name:  "shadow rule over its limit still answers OK",
			prior: []*rlsv3.RateLimitRequest{request("ai", 0, desc("shadow", "x"))},
			give:  request("ai", 0, desc("shadow", "x")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, rl("", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE), 0, 39750*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "1, 1;w=60", HeaderRemaining, "0", HeaderReset, "40",
					headers.LimitRequests, "1", headers.RemainingRequests, "0", headers.ResetRequests, "39.75s"),
			},
		},
		{
			name: "amounts above uint32 are capped",
			give: request("ai", 0, desc("big", "x")),
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(ok, rl("", math.MaxUint32, rlsv3.RateLimitResponse_RateLimit_HOUR), math.MaxUint32, 2799750*time.Millisecond),
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "4294967295, 4294967295;w=3600", HeaderRemaining, "4294967295", HeaderReset, "2800",
					headers.LimitRequests, "4294967295", headers.RemainingRequests, "4294967295", headers.ResetRequests, "46m39.75s"),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
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

func repeat(n int, r *rlsv3.RateLimitRequest) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func TestShouldRateLimitErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     *rlsv3.RateLimitRequest
		storeErr error
		wantCode codes.Code
		// wantMsg is a substring of the message; for store failures it is
		// the whole message.
		wantMsg string
	}{
		{name: "nil request", give: nil, wantCode: codes.InvalidArgument, wantMsg: "domain is empty"},
		{name: "empty domain", give: request("", 0, desc("tenant", "a")), wantCode: codes.InvalidArgument, wantMsg: "domain is empty"},
		{name: "no descriptors", give: request("ai", 0), wantCode: codes.InvalidArgument, wantMsg: "no descriptors"},
		{
			name:     "nil entry",
			give:     request("ai", 0, &commonrl.RateLimitDescriptor{Entries: []*commonrl.RateLimitDescriptor_Entry{nil}}),
			wantCode: codes.InvalidArgument, wantMsg: "descriptors[0].entries[0]",
		},
		{name: "empty entry key", give: request("ai", 0, desc("", "v")), wantCode: codes.InvalidArgument, wantMsg: "empty key"},
		{
			name:     "override with an unknown unit",
			give:     request("ai", 0, withLimit(desc("tenant", "a"), 1, typev3.RateLimitUnit_UNKNOWN, nil)),
			wantCode: codes.InvalidArgument, wantMsg: "descriptors[0].limit",
		},
		{
			name:     "override unit that would wrap to a known one",
			give:     request("ai", 0, withLimit(desc("tenant", "a"), 1, typev3.RateLimitUnit(257), nil)),
			wantCode: codes.InvalidArgument, wantMsg: "descriptors[0].limit",
		},
		{
			name:     "store failure hides its text",
			give:     request("ai", 0, desc("tenant", "a")),
			storeErr: errors.New("dial tcp 10.0.0.7:6379: connect: connection refused"),
			wantCode: codes.Unavailable, wantMsg: "rate limit store unavailable",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.store.err = tt.storeErr
			got, err := f.svc.ShouldRateLimit(context.Background(), tt.give)
			if err == nil {
				t.Fatalf("ShouldRateLimit = %v, want an error", got)
			}
			s, _ := status.FromError(err)
			if s.Code() != tt.wantCode {
				t.Errorf("code = %v, want %v (%q)", s.Code(), tt.wantCode, s.Message())
			}
			if tt.wantCode == codes.Unavailable {
				if s.Message() != tt.wantMsg {
					t.Errorf("message = %q, want exactly %q", s.Message(), tt.wantMsg)
				}
			} else if !strings.Contains(s.Message(), tt.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", s.Message(), tt.wantMsg)
			}
		})
	}
}

func TestShouldRateLimitCanceled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.store.err = context.Canceled
	_, err := f.svc.ShouldRateLimit(ctx, request("ai", 0, desc("tenant", "a")))
	if got := status.Code(err); got != codes.Canceled {
		t.Errorf("code = %v, want Canceled", got)
	}
}

func TestToResponseEdges(t *testing.T) {
	t.Parallel()
	minute := &limit.Limit{Amount: 10, Unit: limit.Minute}
	rpm := &limit.Limit{Name: "tenant_requests", Kind: limit.Requests, Amount: 100, Unit: limit.Minute}
	tph := &limit.Limit{Name: "tenant_gpt4o_tokens", Kind: limit.Tokens, Amount: 3000, Unit: limit.Hour}
	tests := []struct {
		name string
		give *admission.Decision
		want *rlsv3.RateLimitResponse
	}{
		{
			name: "over limit without a retry time reports the reset",
			give: &admission.Decision{Code: limit.CodeOverLimit, Statuses: []limit.Status{
				{Code: limit.CodeOverLimit, Limit: minute, ResetAfter: 1500 * time.Millisecond},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, rl("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE), 0, 1500*time.Millisecond)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "10, 10;w=60", HeaderRemaining, "0", HeaderReset, "2", HeaderRetryAfter, "2",
					headers.LimitRequests, "10", headers.RemainingRequests, "0", headers.ResetRequests, "1.5s",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded. Retry after 2 seconds.","type":"requests","code":"rate_limit_exceeded"}}`),
			},
		},
		{
			name: "retry-after is at least one second",
			give: &admission.Decision{Code: limit.CodeOverLimit, Statuses: []limit.Status{
				{Code: limit.CodeOverLimit, Limit: minute},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, rl("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE), 0, 0)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "10, 10;w=60", HeaderRemaining, "0", HeaderReset, "0", HeaderRetryAfter, "1",
					headers.LimitRequests, "10", headers.RemainingRequests, "0", headers.ResetRequests, "0s",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded. Retry after 1 second.","type":"requests","code":"rate_limit_exceeded"}}`),
			},
		},
		{
			name: "retry-after is the longest wait of the denials",
			give: &admission.Decision{Code: limit.CodeOverLimit, Statuses: []limit.Status{
				{Code: limit.CodeOverLimit, Limit: minute, RetryAfter: 2 * time.Second, ResetAfter: time.Minute},
				{Code: limit.CodeOverLimit, Limit: &limit.Limit{Amount: 100, Unit: limit.Hour}, Remaining: 3, RetryAfter: 7200 * time.Millisecond},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(over, rl("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE), 0, 2*time.Second),
					// A denial reports 0 left, whatever its counter holds.
					st(over, rl("", 100, rlsv3.RateLimitResponse_RateLimit_HOUR), 0, 7200*time.Millisecond),
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, "100, 10;w=60, 100;w=3600", HeaderRemaining, "0", HeaderReset, "8", HeaderRetryAfter, "8",
					headers.LimitRequests, "100", headers.RemainingRequests, "0", headers.ResetRequests, "7.2s",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Rate limit exceeded. Retry after 8 seconds.","type":"requests","code":"rate_limit_exceeded"}}`),
			},
		},
		{
			name: "week unit, multiplier and a name that needs escaping",
			give: &admission.Decision{Code: limit.CodeOK, Statuses: []limit.Status{
				{Code: limit.CodeOK, Limit: &limit.Limit{Name: "a\"b\\c\n", Amount: 7, Unit: limit.Week, Multiplier: 2}, Remaining: 6, ResetAfter: time.Hour},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, &rlsv3.RateLimitResponse_RateLimit{
					Name: "a\"b\\c\n", RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_WEEK, UnitMultiplier: wrapperspb.UInt32(2),
				}, 6, time.Hour)},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `7, 7;w=1209600;name="a\"b\\c"`, HeaderRemaining, "6", HeaderReset, "3600",
					headers.LimitRequests, "7", headers.RemainingRequests, "6", headers.ResetRequests, "1h0m0s"),
			},
		},
		{
			name: "admitted under a request limit and a token budget: each kind in its own headers",
			give: &admission.Decision{Code: limit.CodeOK, Reason: admission.ReasonNone, Statuses: []limit.Status{
				{Code: limit.CodeOK, Limit: rpm, Remaining: 99, ResetAfter: 59500 * time.Millisecond},
				{Code: limit.CodeOK, Limit: tph, Remaining: 2016, ResetAfter: 3600 * time.Second},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: ok,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(ok, rl("tenant_requests", 100, rlsv3.RateLimitResponse_RateLimit_MINUTE), 99, 59500*time.Millisecond),
					st(ok, rl("tenant_gpt4o_tokens", 3000, rlsv3.RateLimitResponse_RateLimit_HOUR), 2016, time.Hour),
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `100, 100;w=60;name="tenant_requests", 3000;w=3600;name="tenant_gpt4o_tokens"`, HeaderRemaining, "99", HeaderReset, "60",
					headers.LimitRequests, "100", headers.RemainingRequests, "99", headers.ResetRequests, "59.5s",
					headers.LimitTokens, "3000", headers.RemainingTokens, "2016", headers.ResetTokens, "1h0m0s"),
			},
		},
		{
			name: "a token budget denies: OpenAI's tokens rate limit error, and the budget in the -tokens headers",
			give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonLimit, Statuses: []limit.Status{
				{Code: limit.CodeOK, Limit: rpm, Remaining: 98, ResetAfter: 59500 * time.Millisecond},
				{Code: limit.CodeOverLimit, Limit: tph, Remaining: 984, RetryAfter: 3742400 * time.Millisecond},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode: over,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					st(ok, rl("tenant_requests", 100, rlsv3.RateLimitResponse_RateLimit_MINUTE), 98, 59500*time.Millisecond),
					st(over, rl("tenant_gpt4o_tokens", 3000, rlsv3.RateLimitResponse_RateLimit_HOUR), 0, 3742400*time.Millisecond),
				},
				ResponseHeadersToAdd: hdrs(HeaderLimit, `3000, 100;w=60;name="tenant_requests", 3000;w=3600;name="tenant_gpt4o_tokens"`, HeaderRemaining, "0", HeaderReset, "3743", HeaderRetryAfter, "3743",
					headers.LimitRequests, "100", headers.RemainingRequests, "98", headers.ResetRequests, "59.5s",
					headers.LimitTokens, "3000", headers.RemainingTokens, "0", headers.ResetTokens, "1h2m22.4s",
					"content-type", "application/json"),
				RawBody: []byte(`{"error":{"message":"Token budget exceeded (tenant_gpt4o_tokens). Retry after 3743 seconds.","type":"tokens","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`),
			},
		},
		{
			name: "a concurrency cap denies: OpenAI has none, so a requests rate limit error",
			give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonLimit, Statuses: []limit.Status{
				{Code: limit.CodeOverLimit, Concurrency: true, RetryAfter: 30 * time.Second},
			}},
			want: &rlsv3.RateLimitResponse{
				OverallCode:          over,
				Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: over}},
				ResponseHeadersToAdd: hdrs("content-type", "application/json"),
				RawBody:              []byte(`{"error":{"message":"Too many requests are in flight. Retry after 30 seconds.","type":"requests","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := toResponse(tt.give)
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	calls := []*rlsv3.RateLimitRequest{
		request("ai", 5, desc("tenant", "acme")), // spends the limit
		request("ai", 0, desc("tenant", "acme")), // over
		request("ai", 0, desc("tenant", "b", "model", "gpt-4o"), desc("other", "x")),
		request("ai", 0, withLimit(desc("other", "y"), 1, typev3.RateLimitUnit_SECOND, nil)),
		request("ai", 0, desc("shadow", "s")),
		request("ai", 0, desc("shadow", "s")),
		request("made-up", 0, desc("tenant", "acme")),
	}
	for _, c := range calls {
		if _, err := f.svc.ShouldRateLimit(ctx, c); err != nil {
			t.Fatalf("ShouldRateLimit(%v): %v", c, err)
		}
	}
	_, _ = f.svc.ShouldRateLimit(ctx, request("", 0))
	f.store.err = errors.New("boom")
	_, _ = f.svc.ShouldRateLimit(ctx, request("ai", 0, desc("tenant", "acme")))

	got := testutil.Gather(t, f.reg)
	want := map[string]float64{
		`tollgate_rls_decisions_total{domain="ai",result="ok",rule="tenant",tier="none"}`:                                              1,
		`tollgate_rls_decisions_total{domain="ai",result="over_limit",rule="tenant",tier="none"}`:                                      1,
		`tollgate_rls_decisions_total{domain="ai",result="ok",rule="tenant.model_gpt-4o",tier="none"}`:                                 1,
		`tollgate_rls_decisions_total{domain="ai",result="unknown",rule="none",tier="none"}`:                                           1,
		`tollgate_rls_decisions_total{domain="ai",result="ok",rule="override",tier="none"}`:                                            1,
		`tollgate_rls_decisions_total{domain="ai",result="ok",rule="shadow",tier="none"}`:                                              1,
		`tollgate_rls_decisions_total{domain="ai",result="shadow_over",rule="shadow",tier="none"}`:                                     1,
		`tollgate_rls_decisions_total{domain="unknown",result="unknown",rule="none",tier="none"}`:                                      1,
		`tollgate_rls_detailed_decisions_total{descriptor="tenant=b,model=gpt-4o",domain="ai",result="ok",rule="tenant.model_gpt-4o"}`: 1,
		`tollgate_rls_detailed_overflow_total{domain="ai",rule="tenant.model_gpt-4o"}`:                                                 0,
		`tollgate_rls_invalid_requests_total`:                                                                                          1,
		`tollgate_rls_decision_duration_seconds_count`:                                                                                 float64(len(calls) + 2),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

func TestNewRejectsDuplicateRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	l := admission.NewLimiter(newCountStore(), fixedClock{now}, nil)
	if _, err := New(l, zap.NewNop(), reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(l, zap.NewNop(), reg); err == nil {
		t.Error("second New on one registry succeeded, want an error")
	}
}

// FuzzShouldRateLimit feeds arbitrary wire bytes through the adapter: it
// must never panic, and an answer has one status per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlsv3.RateLimitRequest{
		request("ai", 0, desc("tenant", "acme")),
		request("ai", 7, withHits(desc("tenant", "acme", "model", "gpt-4o"), 3, true)),
		request("ai", 0, withLimit(desc("other", "x"), 3, typev3.RateLimitUnit_SECOND, wrapperspb.UInt32(30))),
		request("nope", 1, desc("a", "b"), desc("c", "")),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		resp, err := fx.svc.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("code = %v, want InvalidArgument", c)
			}
			return
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
	})
}
