package extauthz

import (
	"context"
	"errors"
	"fmt"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// okResp is an OK answer.
func okResp(headers []*corev3.HeaderValueOption, remove []string, respHeaders []*corev3.HeaderValueOption, meta map[string]*structpb.Value) *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			Headers: headers, HeadersToRemove: remove, ResponseHeadersToAdd: respHeaders,
		}},
		DynamicMetadata: &structpb.Struct{Fields: meta},
	}
}

// deniedResp is a denial with a JSON body and, after content-type, headers.
func deniedResp(code codes.Code, httpStatus typev3.StatusCode, body string, headers ...*corev3.HeaderValueOption) *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: httpStatus},
			Headers: append([]*corev3.HeaderValueOption{hv("content-type", "application/json")}, headers...),
			Body:    body,
		}},
	}
}

func str(s string) *structpb.Value  { return structpb.NewStringValue(s) }
func num(n float64) *structpb.Value { return structpb.NewNumberValue(n) }

// reserved is the ticket an OK answer for the test rules carries, shown
// as opened (see opened): tokens reserved, prompt of them the prompt's.
func reserved(id, tenant, model string, tokens, prompt uint64, overrides map[string]limit.Override) *structpb.Value {
	return str(fmt.Sprintf("%+v", ticket.Ticket{
		ID: id, Domain: "ai", Reserved: true, Tokens: tokens, Prompt: prompt, At: t0, Overrides: overrides, Model: model,
		Descriptors: []limit.Descriptor{
			{Entries: []limit.Entry{{Key: "tenant", Value: tenant}}},
			{Entries: []limit.Entry{{Key: "tenant", Value: tenant}, {Key: "model", Value: model}}},
		},
	}))
}

// opened replaces the ticket in resp's metadata by the ticket it opens
// to under h's keys (or by the error), so answers compare by what the
// ticket says: a sealed ticket is opaque.
func opened(t testing.TB, h *harness, resp *authv3.CheckResponse) *authv3.CheckResponse {
	t.Helper()
	f := resp.GetDynamicMetadata().GetFields()
	v, ok := f[ticket.Field]
	if !ok {
		return resp
	}
	tk, err := h.sealer.Open(v.GetStringValue(), t0)
	if err != nil {
		f[ticket.Field] = str(err.Error())
		return resp
	}
	f[ticket.Field] = str(fmt.Sprintf("%+v", *tk))
	return resp
}

// rateHeaders are the rate limit headers of a request admitted first
// under the test rules: the draft-03 trio from tenant_requests (one of
// 1000 taken: the least room), its -requests trio and, when budget is not
// 0, the -tokens trio of the model's token budget of budget with reserved
// taken. policies is x-ratelimit-limit's value.
func rateHeaders(policies string, budget, reserved uint64) []*corev3.HeaderValueOption {
	hs := []*corev3.HeaderValueOption{
		hv("x-ratelimit-limit", policies), hv("x-ratelimit-remaining", "999"), hv("x-ratelimit-reset", resetHeader),
		hv("x-ratelimit-limit-requests", "1000"), hv("x-ratelimit-remaining-requests", "999"), hv("x-ratelimit-reset-requests", "1m3s"),
	}
	if budget > 0 {
		// An hour's sliding window counts 21 buckets of 180 s.
		hs = append(hs, hv("x-ratelimit-limit-tokens", strconv.FormatUint(budget, 10)),
			hv("x-ratelimit-remaining-tokens", strconv.FormatUint(budget-reserved, 10)), hv("x-ratelimit-reset-tokens", "1h3m0s"))
	}
	return hs
}

const (
	limitHeader = `1000, 1000;w=60;name="tenant_requests", 10000;w=3600;name="tenant_model_tokens"`
	// A minute's sliding window counts 21 buckets of 3 s: a request made at
	// t0 leaves the count 63 s later.
	resetHeader = "63"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []checkCase{
		{
			name: "ok sets identity headers, rate limit headers and the reservation",
			give: checkRequest(chatBody("gpt-4o", 400, 900), "authorization", bearer(keyAcme), "x-tollgate-tenant", "evil"),
			want: okResp(
				[]*corev3.HeaderValueOption{hv(HeaderTenant, "acme"), hv(HeaderTier, "premium"), hv(HeaderModel, "gpt-4o")},
				nil,
				rateHeaders(limitHeader, 10000, 1000),
				map[string]*structpb.Value{
					"tenant": str("acme"), "tier": str("premium"), "model": str("gpt-4o"),
					"reservation_id": str("req.1"), "reserved_tokens": num(1000), "reserved_at_ms": num(float64(t0.UnixMilli())),
					"tollgate_reservation": reserved("req.1", "acme", "gpt-4o", 1000, 100, nil),
				}),
		},
		{
			name: "the key's own token limit travels with the reservation",
			give: checkRequest(chatBody("gpt-4o", 40, 90), "x-api-key", keySmall),
			want: okResp(
				[]*corev3.HeaderValueOption{hv(HeaderTenant, "small"), hv(HeaderModel, "gpt-4o")},
				[]string{HeaderTier},
				rateHeaders(`1000, 1000;w=60;name="tenant_requests", 2000;w=3600;name="tenant_model_tokens"`, 2000, 100),
				map[string]*structpb.Value{
					"tenant": str("small"), "model": str("gpt-4o"),
					"reservation_id": str("req.1"), "reserved_tokens": num(100), "reserved_at_ms": num(float64(t0.UnixMilli())),
					"tollgate_reservation": reserved("req.1", "small", "gpt-4o", 100, 10, map[string]limit.Override{"tenant_model_tokens": {Amount: 2000}}),
				}),
		},
		{
			name: "without a model the model descriptor is dropped, nothing is reserved, and unset headers are removed",
			give: checkRequest(`{"messages":[]}`, "authorization", bearer(keySmall)),
			want: okResp(
				[]*corev3.HeaderValueOption{hv(HeaderTenant, "small")},
				[]string{HeaderTier, HeaderModel},
				rateHeaders(`1000, 1000;w=60;name="tenant_requests"`, 0, 0),
				// Nothing reserved, but a ticket all the same: the
				// outcome of an admitted request feeds breakers and
				// pressure only with one.
				map[string]*structpb.Value{"tenant": str("small"), "tollgate_reservation": str(fmt.Sprintf("%+v", ticket.Ticket{
					ID: "req.1", Domain: "ai", At: t0, Overrides: map[string]limit.Override{"tenant_model_tokens": {Amount: 2000}},
					Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "small"}}}},
				}))}),
		},
		{
			name: "the model header is read when the body names none",
			give: apiRequest("/v1/completions", `{"prompt":"abcdefgh","max_tokens":8}`, "authorization", bearer(keyFree), "x-model", "llama"),
			want: okResp(
				[]*corev3.HeaderValueOption{hv(HeaderTenant, "freeco"), hv(HeaderTier, "free"), hv(HeaderModel, "llama")},
				nil,
				rateHeaders(limitHeader, 10000, 10),
				map[string]*structpb.Value{
					"tenant": str("freeco"), "tier": str("free"), "model": str("llama"),
					"reservation_id": str("req.1"), "reserved_tokens": num(10), "reserved_at_ms": num(float64(t0.UnixMilli())),
					"tollgate_reservation": reserved("req.1", "freeco", "llama", 10, 2, nil),
				}),
		},
		{
			name: "a partial body is estimated from its full size and says so",
			give: checkRequest(chatBody("gpt-4o", 400, 5)[:200], "authorization", bearer(keyAcme), PartialBodyHeader, "true", "content-length", "2000"),
			want: okResp(
				[]*corev3.HeaderValueOption{hv(HeaderTenant, "acme"), hv(HeaderTier, "premium"), hv(HeaderModel, "gpt-4o")},
				nil,
				// 2000 bytes at 4 a token, and no max_tokens in the prefix: 500 + 100.
				append(rateHeaders(limitHeader, 10000, 600), hv(HeaderEstimate, "partial-body")),
				map[string]*structpb.Value{
					"tenant": str("acme"), "tier": str("premium"), "model": str("gpt-4o"),
					"reservation_id": str("req.1"), "reserved_tokens": num(600), "reserved_at_ms": num(float64(t0.UnixMilli())),
					"tollgate_reservation": reserved("req.1", "acme", "gpt-4o", 600, 500, nil),
				}),
		},
		{
			name: "no key is 401",
			give: checkRequest(chatBody("gpt-4o", 4, 1), "authorization", "Basic dXNlcjpwYXNz"),
			want: deniedResp(codes.Unauthenticated, 401,
				`{"error":{"message":"No API key was provided. Send it as Authorization: Bearer \u003ckey\u003e.","type":"invalid_request_error","code":"missing_api_key","tollgate_reason":"unauthenticated"}}`),
		},
		{
			name: "an unknown key is 401",
			give: checkRequest(chatBody("gpt-4o", 4, 1), "authorization", bearer("sk-nobody-0123456789")),
			want: deniedResp(codes.Unauthenticated, 401,
				`{"error":{"message":"The API key provided is not valid.","type":"invalid_request_error","code":"invalid_api_key","tollgate_reason":"unauthenticated"}}`),
		},
		{
			name: "a disabled key is 401",
			give: checkRequest(chatBody("gpt-4o", 4, 1), "x-api-key", keyOff),
			want: deniedResp(codes.Unauthenticated, 401,
				`{"error":{"message":"The API key provided is not valid.","type":"invalid_request_error","code":"invalid_api_key","tollgate_reason":"unauthenticated"}}`),
		},
		{
			name: "a body that is not JSON is 400",
			give: checkRequest(`model=gpt-4o`, "authorization", bearer(keyAcme)),
			want: deniedResp(codes.InvalidArgument, 400,
				`{"error":{"message":"The request body is not valid JSON.","type":"invalid_request_error","code":"invalid_json"}}`),
		},
		{
			name: "a body with the model twice, as a Go backend would read it, is 400",
			give: checkRequest(`{"model":"gpt-4o","MODEL":"gpt-4-32k","messages":[]}`, "authorization", bearer(keyAcme)),
			want: deniedResp(codes.InvalidArgument, 400,
				`{"error":{"message":"The field \"model\" is given more than once, or in another letter case, in one object; give it once, as \"model\".","type":"invalid_request_error","code":"ambiguous_key","param":"model"}}`),
		},
		{
			name: "a cut body without Envoy's partial header is 400",
			give: checkRequest(chatBody("gpt-4o", 40, 1)[:30], "authorization", bearer(keyAcme)),
			want: deniedResp(codes.InvalidArgument, 400,
				`{"error":{"message":"The request body is not valid JSON.","type":"invalid_request_error","code":"invalid_json"}}`),
		},
		{
			name: "a body over max_body_bytes is 413",
			give: checkRequest(chatBody("gpt-4o", 5000, 1), "authorization", bearer(keyAcme)),
			want: deniedResp(codes.InvalidArgument, 413,
				`{"error":{"message":"The request body is larger than 4096 bytes.","type":"invalid_request_error","code":"request_too_large"}}`),
		},
		{
			name: "a partial body of which Envoy received more than max_body_bytes is 413",
			give: func() *authv3.CheckRequest {
				r := checkRequest(chatBody("gpt-4o", 400, 5)[:100], "authorization", bearer(keyAcme), PartialBodyHeader, "true")
				r.Attributes.Request.Http.Size = 1 << 20
				return r
			}(),
			want: deniedResp(codes.InvalidArgument, 413,
				`{"error":{"message":"The request body is larger than 4096 bytes.","type":"invalid_request_error","code":"request_too_large"}}`),
		},
		{
			name: "a descriptor value longer than a descriptor holds is 400",
			give: checkRequest(`{}`, "authorization", bearer(keyAcme), "x-model", strings.Repeat("m", limit.MaxValueBytes+1)),
			want: deniedResp(codes.InvalidArgument, 400,
				`{"error":{"message":"A request field or header that rate limits are keyed on is longer than 1024 bytes.","type":"invalid_request_error","code":"invalid_request"}}`),
		},
		{
			name: "a model with a control character is 400",
			give: checkRequest(`{"model":"gpt\n4o"}`, "authorization", bearer(keyAcme)),
			want: deniedResp(codes.InvalidArgument, 400,
				`{"error":{"message":"The model field must be a string of printable characters.","type":"invalid_request_error","code":"invalid_model"}}`),
		},
		{
			name:     "trusted headers give tenant and tier when no key is sent",
			settings: trustedSettings,
			give:     checkRequest(chatBody("gpt-4o", 40, 10), "x-tenant-id", "acme", "x-tier", "gold"),
			want: okResp(
				[]*corev3.HeaderValueOption{hv(HeaderTenant, "acme"), hv(HeaderTier, "gold"), hv(HeaderModel, "gpt-4o")},
				nil,
				rateHeaders(limitHeader, 10000, 20),
				map[string]*structpb.Value{
					"tenant": str("acme"), "tier": str("gold"), "model": str("gpt-4o"),
					"reservation_id": str("req.1"), "reserved_tokens": num(20), "reserved_at_ms": num(float64(t0.UnixMilli())),
					"tollgate_reservation": reserved("req.1", "acme", "gpt-4o", 20, 10, nil),
				}),
		},
		{
			name:     "trusted headers mode still checks a key that is sent",
			settings: trustedSettings,
			give:     checkRequest(chatBody("gpt-4o", 40, 10), "x-tenant-id", "acme", "x-api-key", "sk-wrong-0123456789"),
			want: deniedResp(codes.Unauthenticated, 401,
				`{"error":{"message":"The API key provided is not valid.","type":"invalid_request_error","code":"invalid_api_key","tollgate_reason":"unauthenticated"}}`),
		},
		{
			name:     "trusted headers mode without the tenant header is 401",
			settings: trustedSettings,
			give:     checkRequest(chatBody("gpt-4o", 40, 10), "x-tier", "gold"),
			want: deniedResp(codes.Unauthenticated, 401,
				`{"error":{"message":"No API key was provided. Send it as Authorization: Bearer \u003ckey\u003e.","type":"invalid_request_error","code":"missing_api_key","tollgate_reason":"unauthenticated"}}`),
		},
	}
	runCheckCases(t, tests)
}

const trustedSettings = `
domain: ai
keys_file: keys.yaml
require_api_key: false
trusted_headers: {tenant: x-tenant-id, tier: x-tier}
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
`

// TestCheckTokenBudget spends a tenant's token budget: ten requests of
// 1,000 tokens fit in 10,000, the eleventh gets a 429 with the OpenAI
// error shape and retry-after, and another tenant is unaffected.
func TestCheckTokenBudget(t *testing.T) {
	t.Parallel()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, sk.Make(t), newSettings(t, testSettings), nil)
			req := checkRequest(chatBody("gpt-4o", 400, 900), "authorization", bearer(keyAcme))
			for i := range 10 {
				if resp := h.check(t, req); resp.GetOkResponse() == nil {
					t.Fatalf("request %d: %v", i, resp)
				}
			}
			h.clock.Advance(time.Second)
			// The tokens were all reserved at t0, in the bucket that leaves
			// the hour's count 21 buckets of 180 s later.
			want := deniedResp(codes.ResourceExhausted, 429,
				// OpenAI's rate limit error for tokens, as it answers a TPM
				// limit: type tokens, code rate_limit_exceeded.
				`{"error":{"message":"Token budget exceeded (tenant_model_tokens). Retry after 3779 seconds.","type":"tokens","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`,
				// The figures are the token budget's: it denied.
				hv("x-ratelimit-limit", `10000, 1000;w=60;name="tenant_requests", 10000;w=3600;name="tenant_model_tokens"`),
				hv("x-ratelimit-remaining", "0"),
				hv("x-ratelimit-reset", "3779"),
				hv("retry-after", "3779"),
				// Each kind's own: the requests with room, the budget without.
				hv("x-ratelimit-limit-requests", "1000"),
				hv("x-ratelimit-remaining-requests", "990"),
				hv("x-ratelimit-reset-requests", "1m2s"),
				hv("x-ratelimit-limit-tokens", "10000"),
				hv("x-ratelimit-remaining-tokens", "0"),
				hv("x-ratelimit-reset-tokens", "1h2m59s"),
			)
			if diff := cmp.Diff(want, h.check(t, req), protocmp.Transform()); diff != "" {
				t.Errorf("11th Check (-want +got):\n%s", diff)
			}
			if resp := h.check(t, checkRequest(chatBody("gpt-4o", 400, 900), "authorization", bearer(keyFree))); resp.GetOkResponse() == nil {
				t.Errorf("another tenant: %v", resp)
			}
			if got := testutil.Gather(t, h.reg)[`tollgate_authz_checks_total{domain="ai",result="`+resultOverLimit+`",tier="none"}`]; got != 1 {
				t.Errorf("over_limit checks = %v, want 1", got)
			}
			if got := testutil.Gather(t, h.reg)[`tollgate_authz_checks_total{domain="ai",result="`+resultOK+`",tier="none"}`]; got != 11 {
				t.Errorf("ok checks = %v, want 11", got)
			}
		})
	}
}

// TestCheckConcurrentReservations: 50 concurrent requests of 1,000 tokens
// against a 10,000 budget admit exactly 10, because each reserves its
// estimate before it runs, where charging after the fact would have let
// all 50 through.
func TestCheckConcurrentReservations(t *testing.T) {
	t.Parallel()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, sk.Make(t), newSettings(t, testSettings), nil)
			req := checkRequest(chatBody("gpt-4o", 400, 900), "authorization", bearer(keyAcme))
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted := 0
			for range 50 {
				wg.Go(func() {
					if h.check(t, req).GetOkResponse() != nil {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if admitted != 10 {
				t.Errorf("admitted %d of 50, want 10", admitted)
			}
		})
	}
}

// failStore fails every Apply.
type failStore struct{ err error }

func (f failStore) Apply(context.Context, time.Time, []limit.Charge, []limit.Result) (bool, error) {
	return false, f.err
}

func TestCheckStoreFailureIsUnavailable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, failStore{errors.New("dial tcp 10.0.0.7:6379: connection refused")}, newSettings(t, testSettings), nil)
	_, err := h.client.Check(context.Background(), checkRequest(chatBody("gpt-4o", 4, 1), "authorization", bearer(keyAcme)))
	if status.Code(err) != codes.Unavailable || strings.Contains(err.Error(), "10.0.0.7") {
		t.Errorf("Check = %v, want Unavailable without the store's error text", err)
	}
	if got := testutil.Gather(t, h.reg)[`tollgate_authz_checks_total{domain="ai",result="`+resultError+`",tier="none"}`]; got != 1 {
		t.Errorf("error checks = %v, want 1", got)
	}
}

func TestCheckContextDomain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, failStore{errors.New("must not be called")}, newSettings(t, testSettings), nil)
	req := checkRequest(chatBody("gpt-4o", 4, 1), "authorization", bearer(keyAcme))
	req.Attributes.ContextExtensions = map[string]string{ContextDomain: "elsewhere"}
	// A domain the rules do not know admits without asking the store.
	if resp := h.check(t, req); resp.GetOkResponse() == nil {
		t.Fatalf("Check = %v", resp)
	}
	if got := testutil.Gather(t, h.reg)[`tollgate_authz_checks_total{domain="unknown",result="ok",tier="none"}`]; got != 1 {
		t.Errorf("ok checks in unknown domains = %v, want 1", got)
	}
}

func TestNewRejectsDuplicateRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	lim := admission.NewLimiter(failStore{}, nil, nil)
	set := newSettings(t, testSettings)
	if _, err := New(lim, set, nil, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(lim, set, nil, reg); err == nil {
		t.Error("second New on one registry succeeded")
	}
	if _, err := New(nil, set, nil, reg); err == nil {
		t.Error("New without a Decider succeeded")
	}
}
