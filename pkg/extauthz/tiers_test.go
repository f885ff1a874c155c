package extauthz

import (
	"fmt"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"strings"
	"sync/atomic"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// tierRules is testRules with plans: premium x3, free x1 (the default).
const tierRules = testRules + `
tiers:
  key: tier
  default: free
  plans: {premium: 3, free: 1}
`

func newTierHarness(t testing.TB, store limit.Store, set *Settings) *harness {
	t.Helper()
	clock := storetest.NewFakeClock(t0)
	reg := prometheus.NewRegistry()
	svc, err := New(admission.NewLimiter(store, clock, newRules(t, tierRules)), set, nil, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	var n atomic.Int64
	svc.newID = func(id string) string { return fmt.Sprintf("%s.%d", id, n.Add(1)) }
	return &harness{svc: svc, client: authv3.NewAuthorizationClient(testutil.Serve(t, svc)), clock: clock, reg: reg}
}

// admitted sends req until it is denied, at most limit+1 times, and
// returns how many were admitted and the last header x-ratelimit-limit.
func admitted(t *testing.T, h *harness, max int, kv ...string) (int, string) {
	t.Helper()
	// 400 characters and max_tokens 900: 1,000 tokens each.
	req := checkRequest(chatBody("gpt-4o", 400, 900), kv...)
	n, limitHeader := 0, ""
	for range max + 1 {
		resp := h.check(t, req)
		ok := resp.GetOkResponse()
		if ok == nil {
			break
		}
		n++
		for _, hv := range ok.GetResponseHeadersToAdd() {
			if hv.GetHeader().GetKey() == "x-ratelimit-limit" {
				limitHeader = hv.GetHeader().GetValue()
			}
		}
	}
	return n, limitHeader
}

// TestCheckTiers: the budget is 10,000 tokens an hour; a premium key gets
// three times what a free key gets, and the headers say so.
func TestCheckTiers(t *testing.T) {
	t.Parallel()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			h := newTierHarness(t, sk.Make(t), newSettings(t, testSettings))
			free, freeLimit := admitted(t, h, 40, "authorization", bearer(keyFree))
			premium, premiumLimit := admitted(t, h, 40, "authorization", bearer(keyAcme))
			if free != 10 || premium != 30 {
				t.Errorf("admitted free %d, premium %d; want 10 and 30", free, premium)
			}
			if !strings.Contains(freeLimit, `10000;w=3600;name="tenant_model_tokens"`) {
				t.Errorf("free x-ratelimit-limit = %q, want the 10000 budget", freeLimit)
			}
			if !strings.Contains(premiumLimit, `30000;w=3600;name="tenant_model_tokens"`) || !strings.Contains(premiumLimit, `3000;w=60;name="tenant_requests"`) {
				t.Errorf("premium x-ratelimit-limit = %q, want the 30000 budget and 3000 requests", premiumLimit)
			}
			got := testutil.Gather(t, h.reg)
			for k, want := range map[string]float64{
				`tollgate_authz_checks_total{domain="ai",result="ok",tier="free"}`:            10,
				`tollgate_authz_checks_total{domain="ai",result="over_limit",tier="free"}`:    1,
				`tollgate_authz_checks_total{domain="ai",result="ok",tier="premium"}`:         30,
				`tollgate_authz_checks_total{domain="ai",result="over_limit",tier="premium"}`: 1,
			} {
				if got[k] != want {
					t.Errorf("%s = %v, want %v", k, got[k], want)
				}
			}
		})
	}
}

// TestCheckTiersTrustedHeader: without API keys the tier comes from the
// trusted header; an unknown one gets the default plan.
func TestCheckTiersTrustedHeader(t *testing.T) {
	t.Parallel()
	set := newSettings(t, `
domain: ai
require_api_key: false
trusted_headers: {tenant: x-tenant, tier: x-tier}
descriptors:
  - [{key: tenant, from: tenant}, {key: model, from: model}]
  - [{key: tenant, from: tenant}, {key: tier, from: tier}]
estimate: {chars_per_token: 4, default_max_tokens: 100, max_body_bytes: 4096}
`)
	tests := []struct {
		name string
		give string // x-tier
		want int
	}{
		{name: "premium", give: "premium", want: 30},
		{name: "unknown tier", give: "platinum", want: 10},
		{name: "no tier", give: "", want: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newTierHarness(t, testutil.StoreKinds[0].Make(t), set)
			if got, _ := admitted(t, h, 40, "x-tenant", "t-"+tt.name, "x-tier", tt.give); got != tt.want {
				t.Errorf("admitted %d, want %d", got, tt.want)
			}
		})
	}
}

// TestCheckTierHeaderIsGranted: the tier sent upstream (x-tollgate-tier,
// and the tier in the dynamic metadata) is the plan the request was
// decided under, not the one the trusted header claimed.
func TestCheckTierHeaderIsGranted(t *testing.T) {
	t.Parallel()
	set := newSettings(t, `
domain: ai
require_api_key: false
trusted_headers: {tenant: x-tenant, tier: x-tier}
descriptors:
  - [{key: tenant, from: tenant}, {key: model, from: model}]
estimate: {chars_per_token: 4, default_max_tokens: 100, max_body_bytes: 4096}
`)
	tests := []struct {
		name string
		give string // x-tier
		want string // x-tollgate-tier and metadata tier
	}{
		{name: "a listed plan", give: "premium", want: "premium"},
		{name: "a plan no rule lists", give: "platinum", want: "free"},
		{name: "no tier", give: "", want: "free"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newTierHarness(t, testutil.StoreKinds[0].Make(t), set)
			resp := h.check(t, checkRequest(chatBody("gpt-4o", 40, 10), "x-tenant", "acme", "x-tier", tt.give))
			ok := resp.GetOkResponse()
			if ok == nil {
				t.Fatalf("Check = %v, want OK", resp)
			}
			got := ""
			for _, hv := range ok.GetHeaders() {
				if hv.GetHeader().GetKey() == HeaderTier {
					got = hv.GetHeader().GetValue()
				}
			}
			if got != tt.want {
				t.Errorf("%s = %q, want %q", HeaderTier, got, tt.want)
			}
			if meta := resp.GetDynamicMetadata().GetFields()[ticket.FieldTier].GetStringValue(); meta != tt.want {
				t.Errorf("metadata %s = %q, want %q", ticket.FieldTier, meta, tt.want)
			}
		})
	}
}
