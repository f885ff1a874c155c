package extauthz

import (
	"context"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// fuzzSettings uses every kind of source, in trusted-headers mode with
// keys, so both ways of identifying a caller are reached.
const fuzzSettings = `
domain: ai
keys_file: keys.yaml
require_api_key: false
trusted_headers: {tenant: x-tenant-id, tier: x-tier}
model: {body_field: model, header: x-model}
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
  - [{key: tier, from: tier}, {key: path, from: path}, {key: method, from: method}]
  - [{key: team, from: "header:x-team"}, {key: plan, from: "literal:gold"}]
estimate: {max_body_bytes: 8192}
`

// FuzzCheckToDescriptors: any CheckRequest on the wire gets an answer, an
// OK or a denial, or a gRPC status; never a panic and never a bare error.
func FuzzCheckToDescriptors(f *testing.F) {
	seeds := []*authv3.CheckRequest{
		checkRequest(chatBody("gpt-4o", 40, 10), "authorization", bearer(keyAcme)),
		checkRequest(chatBody("gpt-4o", 40, 10), "x-tenant-id", "acme", "x-tier", "gold", "x-team", "t"),
		checkRequest(`{"model":"m","prompt":["a",[1,2]]}`, "x-api-key", keySmall, "x-model", "n"),
		checkRequest(`{"mod`, "x-tenant-id", "a", PartialBodyHeader, "true"),
		checkRequest(`{"model":"m","messages":[{"content":"ab`, "x-tenant-id", "a", PartialBodyHeader, "true", "content-length", "100"),
		checkRequest(`{"messages":[],"model":"m"}`, "x-tenant-id", "a", PartialBodyHeader, "false", "content-length", "99999999999"),
		checkRequest("", "x-tenant-id", "a", "content-length", "30", "transfer-encoding", "chunked"),
		checkRequest(`[]`, "x-tenant-id", strings.Repeat("t", 2000)),
		checkRequest(`{"model":"cheap","MODEL":"big","max_tokens":1,"MAX_TOKENS":30000}`, "x-tenant-id", "a"),
		checkRequest(`{"mod\u0065l":"m","max_to\u212Aens":9,"messages":[{"content":"a","Content":"bbbb"}]}`, "authorization", bearer(keyAcme)),
		{},
		{Attributes: &authv3.AttributeContext{ContextExtensions: map[string]string{ContextDomain: "other"}}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0x22, 0x00})
	svc, err := New(admission.NewLimiter(memstore.New(), storetest.NewFakeClock(t0), newRules(f, testRules)),
		newSettings(f, fuzzSettings), nil, prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var req authv3.CheckRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		resp, err := svc.Check(context.Background(), &req)
		if err != nil {
			if st, ok := status.FromError(err); !ok || st.Code() == codes.Unknown {
				t.Fatalf("Check error %v is not a gRPC status", err)
			}
			return
		}
		switch r := resp.GetHttpResponse().(type) {
		case *authv3.CheckResponse_OkResponse:
			if resp.GetStatus().GetCode() != 0 {
				t.Fatalf("OK answer with status %v", resp.GetStatus())
			}
		case *authv3.CheckResponse_DeniedResponse:
			d := r.DeniedResponse
			if resp.GetStatus().GetCode() == 0 || d.GetStatus().GetCode() < 400 || !strings.HasPrefix(d.GetBody(), `{"error":{"message":`) {
				t.Fatalf("malformed denial %v", resp)
			}
		default:
			t.Fatalf("Check answered %v", resp)
		}
	})
}
