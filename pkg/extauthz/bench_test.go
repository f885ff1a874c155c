package extauthz

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/test/testutil"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
)

// benchRules are high limits, so the benchmark measures the admitted path
// (the costly one: a reservation written to the store) and never a denial.
const benchRules = `
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000, name: tenant_requests}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 9000000000000000, name: tenant_model_tokens}
`

// BenchmarkCheck is a whole Check behind the gRPC handler: an API key
// looked up, a 2 KB chat body parsed and estimated, two descriptors, one
// decision reserving tokens in the store, and the answer with headers and
// the reservation ticket.
func BenchmarkCheck(b *testing.B) {
	body := chatBody("gpt-4o", 1900, 256)
	if len(body) < 1900 || len(body) > 2100 {
		b.Fatalf("body is %d bytes, want about 2 KB", len(body))
	}
	// As Envoy sends it with with_request_body: the client's
	// content-length and Envoy's partial-body header.
	req := checkRequest(body, "authorization", bearer(keyAcme), "x-request-id", "r",
		"content-length", strconv.Itoa(len(body)), PartialBodyHeader, "false")
	for _, sk := range testutil.StoreKinds {
		b.Run(sk.Name, func(b *testing.B) {
			set := newSettings(b, testSettings)
			set.MaxBodyBytes = 1 << 20
			svc, err := New(admission.NewLimiter(sk.Make(b), nil, newRules(b, benchRules)), set, nil, prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := svc.Check(ctx, req)
					if err != nil || resp.GetOkResponse() == nil {
						b.Errorf("Check: %v %v", resp, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkParseBody is the body parser alone on the same 2 KB body.
func BenchmarkParseBody(b *testing.B) {
	body := []byte(chatBody("gpt-4o", 1900, 256))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := ParseBody(body, "model", EndpointChat, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseBodyMixed is a conversation of about 2 KB as clients send
// it: several messages with escaped newlines and quotes, non-ASCII text,
// content parts and tools, which take the parser's slower paths.
func BenchmarkParseBodyMixed(b *testing.B) {
	turn := `{"role":"user","content":"Résumé of the \"plan\":\n- step one\n- step two ✓\n\tdone."},` +
		`{"role":"assistant","content":[{"type":"text","text":"Voilà: the plan, in three lines.\nÉtape 1, then 2."}]},`
	body := []byte(`{"model":"gpt-4o-mini","stream":true,"temperature":0.2,"messages":[{"role":"system","content":"You are terse."},` +
		strings.Repeat(turn, 9) + `{"role":"user","content":"和平"}],` +
		`"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}],` +
		`"max_completion_tokens":512}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := ParseBody(body, "model", EndpointChat, false); err != nil {
			b.Fatal(err)
		}
	}
}
