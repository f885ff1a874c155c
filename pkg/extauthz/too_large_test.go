package extauthz

import (
	"encoding/json"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/headers"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// TestCheckTooLarge: a request whose estimate is more than the whole
// token budget (after the key's override and the plan) gets a 413 that
// invites no retry: no Retry-After, no x-ratelimit-reset, the reason
// headers, and an OpenAI-style body naming the limit and the cost. It
// charges nothing: a request that fits is admitted after it.
func TestCheckTooLarge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		key       string
		maxTokens int    // after a 400-character (100-token) prompt
		whole     int    // the max_tokens that uses the whole budget
		tier      string // the metric's tier label
		wantMsg   string // "" for admitted
	}{
		{name: "free: the whole budget fits", key: keyFree, maxTokens: 9900},
		{name: "free: one token more never fits", key: keyFree, maxTokens: 9901, whole: 9900, tier: "free",
			wantMsg: `Request too large for the tokens limit "tenant_model_tokens": Limit 10000, Requested 10001. The request must be made smaller; retrying it cannot succeed.`},
		{name: "premium: three times the budget", key: keyAcme, maxTokens: 29900},
		{name: "premium: past three times", key: keyAcme, maxTokens: 30000, whole: 29900, tier: "premium",
			wantMsg: `Request too large for the tokens limit "tenant_model_tokens": Limit 30000, Requested 30100. The request must be made smaller; retrying it cannot succeed.`},
		{name: "the key's own budget", key: keySmall, maxTokens: 2000, whole: 1900, tier: "free",
			wantMsg: `Request too large for the tokens limit "tenant_model_tokens": Limit 2000, Requested 2100. The request must be made smaller; retrying it cannot succeed.`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newTierHarness(t, testutil.StoreKinds[0].Make(t), newSettings(t, testSettings))
			resp := h.check(t, checkRequest(chatBody("gpt-4o", 400, tt.maxTokens), "authorization", bearer(tt.key)))
			if tt.wantMsg == "" {
				if resp.GetOkResponse() == nil {
					t.Fatalf("Check = %v, want admitted", resp)
				}
				return
			}
			d := resp.GetDeniedResponse()
			if d == nil {
				t.Fatalf("Check = %v, want denied", resp)
			}
			if got := d.GetStatus().GetCode(); got != 413 {
				t.Errorf("status = %v, want 413", got)
			}
			got := map[string]string{}
			for _, o := range d.GetHeaders() {
				got[o.GetHeader().GetKey()] = o.GetHeader().GetValue()
			}
			for _, k := range []string{headers.RetryAfter, headers.Reset} {
				if v, ok := got[k]; ok {
					t.Errorf("header %s = %q, want none", k, v)
				}
			}
			for k, want := range map[string]string{headers.Reason: headers.ReasonTooLarge, headers.ShouldRetry: "false", "content-type": "application/json"} {
				if got[k] != want {
					t.Errorf("header %s = %q, want %q", k, got[k], want)
				}
			}
			var body struct{ Error headers.Error }
			if err := json.Unmarshal([]byte(d.GetBody()), &body); err != nil {
				t.Fatalf("body %q: %v", d.GetBody(), err)
			}
			if want := (headers.Error{Message: tt.wantMsg, Type: "invalid_request_error", Code: "request_too_large", Reason: "too_large"}); body.Error != want {
				t.Errorf("body = %+v, want %+v", body.Error, want)
			}
			if n := testutil.Gather(t, h.reg)[`tollgate_authz_checks_total{domain="ai",result="too_large",tier="`+tt.tier+`"}`]; n != 1 {
				t.Errorf("too_large checks = %v, want 1", n)
			}
			// Nothing was charged: the whole budget is still there.
			if resp := h.check(t, checkRequest(chatBody("gpt-4o", 400, tt.whole), "authorization", bearer(tt.key))); resp.GetOkResponse() == nil {
				t.Errorf("the whole budget, after: %v, want admitted", resp)
			}
		})
	}
}

// TestTooLargeReasonName: the x-tollgate-reason that headers.Append
// writes for a request that can never fit is the name admission's table
// gives ReasonTooLarge (pkg/headers may not import admission, so it
// spells the name again), as the 503 answers take theirs from the table.
func TestTooLargeReasonName(t *testing.T) {
	t.Parallel()
	if got, want := headers.ReasonTooLarge, admission.ReasonTooLarge.String(); got != want {
		t.Errorf("headers.ReasonTooLarge = %q, the table's name is %q", got, want)
	}
	if got, want := resultTooLarge, admission.ReasonTooLarge.Answer().Result; got != want {
		t.Errorf("resultTooLarge = %q, the table's result is %q", got, want)
	}
}
