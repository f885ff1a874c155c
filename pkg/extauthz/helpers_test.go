package extauthz

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// t0 is on a 180 s boundary, the bucket width of an hour's sliding window,
// so resets and retries come out in round numbers.
var t0 = time.Unix(1_800_000_000, 0)

// testRules: every tenant gets 1000 requests a minute and, per model,
// 10,000 tokens an hour.
const testRules = `
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000, name: tenant_requests}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 10000, name: tenant_model_tokens}
`

// Demo keys, at least 16 bytes each, as authn requires.
const (
	keyAcme  = "sk-acme-0123456789abcdef"
	keyFree  = "sk-free-0123456789abcdef"
	keySmall = "sk-small-0123456789abcdef"
	keyOff   = "sk-off-0123456789abcdef0"
)

const testKeys = `
tenants:
  acme: {tier: premium}
keys:
  - {key: "` + keyAcme + `", tenant: acme, name: ci}
  - {key: "` + keyFree + `", tenant: freeco, tier: free}
  - {key: "` + keySmall + `", tenant: small, limits: {tenant_model_tokens: {amount: 2000}}}
  - {key: "` + keyOff + `", tenant: acme, disabled: true}
`

const testSettings = `
domain: ai
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
model: {body_field: model, header: x-model}
estimate: {chars_per_token: 4, default_max_tokens: 100, max_body_bytes: 4096}
usage_header: x-usage-total-tokens
`

// newSettings parses an authz config and, when it names one, testKeys.
func newSettings(t testing.TB, yaml string) *Settings {
	t.Helper()
	s, err := ParseSettings("authz.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("ParseSettings: %v", err)
	}
	if s.KeysFile != "" {
		if s.Keys, err = authn.Parse(s.KeysFile, []byte(testKeys)); err != nil {
			t.Fatalf("keys: %v", err)
		}
	}
	return s
}

func newRules(t testing.TB, yaml string) *limit.RuleSet {
	t.Helper()
	d, err := config.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return rs
}

type harness struct {
	svc    *Service
	client authv3.AuthorizationClient
	clock  *storetest.FakeClock
	reg    *prometheus.Registry
	// sealer opens the tickets the service seals.
	sealer *ticket.Sealer
}

// newHarness serves a Service over real gRPC on a loopback port. Its
// reservation IDs are the request ID and a counter.
func newHarness(t testing.TB, store limit.Store, set *Settings, log *zap.Logger) *harness {
	t.Helper()
	clock := storetest.NewFakeClock(t0)
	reg := prometheus.NewRegistry()
	svc, err := New(admission.NewLimiter(store, clock, newRules(t, testRules)), set, log, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	var n atomic.Int64
	svc.newID = func(id string) string { return fmt.Sprintf("%s.%d", id, n.Add(1)) }
	keys, err := ticket.NewKeys([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := ticket.NewSealer(keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetSealer(sealer)
	return &harness{svc: svc, client: authv3.NewAuthorizationClient(testutil.Serve(t, svc)), clock: clock, reg: reg, sealer: sealer}
}

func (h *harness) check(t testing.TB, req *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.client.Check(ctx, req)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return resp
}

// checkRequest is a POST to /v1/chat/completions with headers (name,
// value pairs) and body.
func checkRequest(body string, kv ...string) *authv3.CheckRequest {
	hs := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		hs[kv[i]] = kv[i+1]
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "req", Method: "POST", Path: "/v1/chat/completions?stream=false", Host: "api.example",
			Headers: hs, Body: body, Size: int64(len(body)),
		}},
	}}
}

// chatBody asks model for maxTokens after a prompt of promptChars
// characters: with 4 characters a token, it costs promptChars/4+maxTokens.
func chatBody(model string, promptChars, maxTokens int) string {
	prompt := make([]byte, promptChars)
	for i := range prompt {
		prompt[i] = 'a' + byte(i%26)
	}
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, model, prompt, maxTokens)
}

func bearer(key string) string { return "Bearer " + key }

func hv(key, value string) *corev3.HeaderValueOption { return option(key, value) }

// checkCase is a Check request and the answer it must get (its ticket
// shown opened, see opened), under settings (default testSettings).
type checkCase struct {
	name     string
	settings string
	give     *authv3.CheckRequest
	want     *authv3.CheckResponse
}

// runCheckCases runs each case on a fresh harness of every store kind.
func runCheckCases(t *testing.T, tests []checkCase) {
	t.Helper()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					settings := tt.settings
					if settings == "" {
						settings = testSettings
					}
					h := newHarness(t, sk.Make(t), newSettings(t, settings), nil)
					got := opened(t, h, h.check(t, tt.give))
					if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
						t.Errorf("Check (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}
