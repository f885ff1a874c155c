package headers

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestLimitError(t *testing.T) {
	t.Parallel()
	requests := &limit.Limit{Name: "rpm", Kind: limit.Requests, Amount: 10, Unit: limit.Minute}
	tokens := &limit.Limit{Name: "tpm", Kind: limit.Tokens, Amount: 1000, Unit: limit.Minute}
	tests := []struct {
		name string
		give []limit.Status
		want Error
	}{
		{
			name: "a request limit, waiting its reset when it gives no retry time",
			give: []limit.Status{{Code: limit.CodeOverLimit, Limit: requests, ResetAfter: 2500 * time.Millisecond}},
			want: Error{Message: "Rate limit exceeded (rpm). Retry after 3 seconds.", Type: "requests", Code: "rate_limit_exceeded"},
		},
		{
			name: "a token budget, the one denial among several statuses",
			give: []limit.Status{{Code: limit.CodeOK, Limit: requests}, {Code: limit.CodeOverLimit, Limit: tokens, RetryAfter: 400 * time.Millisecond}},
			want: Error{Message: "Token budget exceeded (tpm). Retry after 1 second.", Type: "tokens", Code: "rate_limit_exceeded"},
		},
		{
			name: "a concurrency cap names no limit",
			give: []limit.Status{{Code: limit.CodeOverLimit, Concurrency: true, Limit: requests, RetryAfter: time.Minute}},
			want: Error{Message: "Too many requests are in flight. Retry after 60 seconds.", Type: "requests", Code: "rate_limit_exceeded"},
		},
		{
			name: "an override without a name",
			give: []limit.Status{{Code: limit.CodeOverLimit, Limit: &limit.Limit{Amount: 1, Unit: limit.Second}, RetryAfter: time.Second}},
			want: Error{Message: "Rate limit exceeded. Retry after 1 second.", Type: "requests", Code: "rate_limit_exceeded"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := LimitError(tt.give); got != tt.want {
				t.Errorf("LimitError = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestErrorBody: OpenAI's shape, param only when set, and Tollgate's
// reason beside OpenAI's fields.
func TestErrorBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give Error
		want string
	}{
		{name: "with a reason", give: Error{Message: "m <x>", Type: "tokens", Code: "rate_limit_exceeded", Reason: "limit"},
			want: `{"error":{"message":"m \u003cx\u003e","type":"tokens","code":"rate_limit_exceeded","tollgate_reason":"limit"}}`},
		{name: "with a param, no reason", give: Error{Message: "m", Type: "invalid_request_error", Code: "invalid_model", Param: "model"},
			want: `{"error":{"message":"m","type":"invalid_request_error","code":"invalid_model","param":"model"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := string(tt.give.Body()); got != tt.want {
				t.Errorf("Body = %s, want %s", got, tt.want)
			}
		})
	}
}
