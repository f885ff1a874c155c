package admission_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/admission"
)

// TestReasonAnswers pins the table every adapter answers a refusal by:
// the statuses docs/architecture.md#the-admission-stages gives each reason, the names clients and
// dashboards see, and which answers carry Retry-After.
func TestReasonAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give admission.Reason
		want admission.Answer
	}{
		{name: "none", give: admission.ReasonNone, want: admission.Answer{Name: "none", Result: "ok", Status: 200}},
		{name: "limit", give: admission.ReasonLimit, want: admission.Answer{Name: "limit", Status: 429, RetryAfter: true}},
		{name: "shed", give: admission.ReasonShed, want: admission.Answer{Name: "shed", Result: "shed", Status: 503, RetryAfter: true, BeforeLimits: true,
			Type: "server_error", Code: "overloaded", Message: "The service is overloaded; requests of your plan are paused"}},
		{name: "breaker", give: admission.ReasonBreaker, want: admission.Answer{Name: "breaker", Result: "breaker_open", Status: 503, RetryAfter: true, BeforeLimits: true,
			Type: "server_error", Code: "upstream_unavailable", Message: "The model is failing and temporarily unavailable"}},
		{name: "too large", give: admission.ReasonTooLarge, want: admission.Answer{Name: "too_large", Result: "too_large", Status: 413}},
		{name: "unauthenticated", give: admission.ReasonUnauthenticated, want: admission.Answer{Name: "unauthenticated", Result: "unauthenticated", Status: 401}},
		{name: "out of the table", give: admission.Reason(200), want: admission.Answer{Name: "none", Result: "ok", Status: 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.give.Answer(); got != tt.want {
				t.Errorf("Answer() = %+v, want %+v", got, tt.want)
			}
			if got := tt.give.String(); got != tt.want.Name {
				t.Errorf("String() = %q, want %q", got, tt.want.Name)
			}
		})
	}
}
