package extauthz

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TestRefusalBodies: every refusal's body has OpenAI's type and code
// where OpenAI has them for the case (a rate limit is type requests or
// tokens, code rate_limit_exceeded; a bad key invalid_request_error,
// invalid_api_key; an unavailable service server_error), Tollgate's own
// code where OpenAI sends none, and Tollgate's reason in tollgate_reason,
// the word x-tollgate-reason carries where that header is sent.
func TestRefusalBodies(t *testing.T) {
	t.Parallel()
	requests := &limit.Limit{Name: "tenant_requests", Kind: limit.Requests, Amount: 10, Unit: limit.Minute}
	tokens := &limit.Limit{Name: "tenant_model_tokens", Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour}
	ok := limit.Status{Code: limit.CodeOK, Limit: requests, Remaining: 5, ResetAfter: time.Minute}
	overLimit := func(sts ...limit.Status) *admission.Decision {
		return &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonLimit, Statuses: sts}
	}
	tests := []struct {
		name       string
		give       *admission.Decision
		giveErr    error
		wantStatus int32
		want       headers.Error
		wantHeader string // x-tollgate-reason
	}{
		{
			name:       "a request limit",
			give:       overLimit(limit.Status{Code: limit.CodeOverLimit, Limit: requests, RetryAfter: 1500 * time.Millisecond}),
			wantStatus: 429,
			want:       headers.Error{Message: "Rate limit exceeded (tenant_requests). Retry after 2 seconds.", Type: "requests", Code: "rate_limit_exceeded", Reason: "limit"},
		},
		{
			name:       "a token budget, beside a request limit with room",
			give:       overLimit(ok, limit.Status{Code: limit.CodeOverLimit, Limit: tokens, RetryAfter: time.Hour}),
			wantStatus: 429,
			want:       headers.Error{Message: "Token budget exceeded (tenant_model_tokens). Retry after 3600 seconds.", Type: "tokens", Code: "rate_limit_exceeded", Reason: "limit"},
		},
		{
			name: "both denied: the longer wait names the kind",
			give: overLimit(limit.Status{Code: limit.CodeOverLimit, Limit: tokens, RetryAfter: time.Second},
				limit.Status{Code: limit.CodeOverLimit, Limit: requests, RetryAfter: 30 * time.Second}),
			wantStatus: 429,
			want:       headers.Error{Message: "Rate limit exceeded (tenant_requests). Retry after 30 seconds.", Type: "requests", Code: "rate_limit_exceeded", Reason: "limit"},
		},
		{
			name:       "a concurrency cap: OpenAI has none, so a request rate limit",
			give:       overLimit(limit.Status{Code: limit.CodeOverLimit, Concurrency: true, Limit: requests, RetryAfter: 5 * time.Second}),
			wantStatus: 429,
			want:       headers.Error{Message: "Too many requests are in flight. Retry after 5 seconds.", Type: "requests", Code: "rate_limit_exceeded", Reason: "limit"},
		},
		{
			name: "a request too large for a budget",
			give: &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonTooLarge, Statuses: []limit.Status{
				{Code: limit.CodeOverLimit, Limit: tokens, Remaining: 1000, TooLarge: true, Cost: 1001, Capacity: 1000}}},
			wantStatus: 413,
			want: headers.Error{Message: `Request too large for the tokens limit "tenant_model_tokens": Limit 1000, Requested 1001. The request must be made smaller; retrying it cannot succeed.`,
				Type: "invalid_request_error", Code: "request_too_large", Reason: "too_large"},
			wantHeader: "too_large",
		},
		{
			name:       "shed",
			give:       &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonShed, RetryAfter: time.Second},
			wantStatus: 503,
			want:       headers.Error{Message: "The service is overloaded; requests of your plan are paused. Retry after 1 second.", Type: "server_error", Code: "overloaded", Reason: "shed"},
			wantHeader: "shed",
		},
		{
			name:       "breaker",
			give:       &admission.Decision{Code: limit.CodeOverLimit, Reason: admission.ReasonBreaker, RetryAfter: 10 * time.Second},
			wantStatus: 503,
			want:       headers.Error{Message: "The model is failing and temporarily unavailable. Retry after 10 seconds.", Type: "server_error", Code: "upstream_unavailable", Reason: "breaker"},
			wantHeader: "breaker",
		},
		{
			name:       "no key: OpenAI's type, no OpenAI code, so Tollgate's",
			giveErr:    errMissingKey,
			wantStatus: 401,
			want:       headers.Error{Message: "No API key was provided. Send it as Authorization: Bearer <key>.", Type: "invalid_request_error", Code: "missing_api_key", Reason: "unauthenticated"},
		},
		{
			name:       "an unknown key: OpenAI's type and code",
			giveErr:    errUnknownKey,
			wantStatus: 401,
			want:       headers.Error{Message: "The API key provided is not valid.", Type: "invalid_request_error", Code: "invalid_api_key", Reason: "unauthenticated"},
		},
		{
			name:       "the request's own fault: Tollgate's code, no reason",
			giveErr:    errInvalidRequest,
			wantStatus: 400,
			want:       headers.Error{Message: "The request cannot be rate limited as sent.", Type: "invalid_request_error", Code: "invalid_request"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, _, err := toAnswer(context.Background(), tt.giveErr, &call{dec: tt.give})
			if err != nil {
				t.Fatalf("toAnswer: %v", err)
			}
			d := resp.GetDeniedResponse()
			if got := int32(d.GetStatus().GetCode()); got != tt.wantStatus {
				t.Errorf("status = %d, want %d", got, tt.wantStatus)
			}
			var body struct{ Error headers.Error }
			if err := json.Unmarshal([]byte(d.GetBody()), &body); err != nil {
				t.Fatalf("body %q: %v", d.GetBody(), err)
			}
			if body.Error != tt.want {
				t.Errorf("body = %+v, want %+v", body.Error, tt.want)
			}
			got := ""
			for _, o := range d.GetHeaders() {
				if o.GetHeader().GetKey() == headers.Reason {
					got = o.GetHeader().GetValue()
				}
			}
			if got != tt.wantHeader {
				t.Errorf("x-tollgate-reason = %q, want %q", got, tt.wantHeader)
			}
		})
	}
}
