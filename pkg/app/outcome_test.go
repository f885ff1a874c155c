package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// The outcome loop as Envoy plays it: Check reserves, ext_proc reads the
// usage from the response body and settles, the access log entry that
// follows (without usage, as real servers send none) releases and
// settles nothing more. On Redis the three calls go to different
// replicas, as Envoy's load balancing sends them.

const outcomeRules = `
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000, name: tenant_requests}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 100000, name: tenant_model_tokens}
`

const outcomeAuthz = `
domain: ai
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
estimate: {chars_per_token: 4, default_max_tokens: 100}
usage_header: x-usage-total-tokens
`

const outcomeKey = "sk-loop-0123456789abcdef"

// outcomeReplica is one tollgate serve, with clients for the four APIs.
type outcomeReplica struct {
	*replica
	authz authv3.AuthorizationClient
	proc  extprocv3.ExternalProcessorClient
}

func startOutcomeReplica(t *testing.T, ctx context.Context, rules, authz string, extra ...string) *outcomeReplica {
	t.Helper()
	r := startReplica(t, ctx, rules, append([]string{"--authz-config", authz}, extra...)...)
	conn, err := grpc.NewClient("passthrough:///"+r.addrs.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &outcomeReplica{replica: r, authz: authv3.NewAuthorizationClient(conn), proc: extprocv3.NewExternalProcessorClient(conn)}
}

// check makes a chat request estimated at 1,000 tokens (a 400-character
// prompt and max_tokens 900) and returns Check's dynamic metadata.
func (r *outcomeReplica) check(stream bool) *structpb.Struct {
	r.t.Helper()
	body := fmt.Sprintf(`{"model":"gpt-4o","stream":%t,"messages":[{"role":"user","content":%q}],"max_tokens":900}`, stream, strings.Repeat("a", 400))
	resp, err := r.authz.Check(r.ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Id: "req", Method: "POST", Path: "/v1/chat/completions",
			Headers: map[string]string{"authorization": "Bearer " + outcomeKey, "content-length": strconv.Itoa(len(body)), PartialHeader: "false"},
			Body:    body, Size: int64(len(body))},
	}}})
	if err != nil || resp.GetOkResponse() == nil {
		r.t.Fatalf("Check = %v, %v; want admitted", resp, err)
	}
	if got := resp.GetDynamicMetadata().GetFields()[ticket.FieldReservedTokens].GetNumberValue(); got != 1000 {
		r.t.Fatalf("reserved %v tokens, want 1000", got)
	}
	return resp.GetDynamicMetadata()
}

// PartialHeader is the header Envoy adds to every Check with a body.
const PartialHeader = "x-envoy-auth-partial-body"

// process plays one response through ext_proc as Envoy does in
// observability mode: the headers, then the body in chunks of size (the
// last one ends the stream unless reset), each message carrying Check's
// metadata; reset cancels the stream before the end, as a client that
// goes away makes Envoy do.
func (r *outcomeReplica) process(meta *structpb.Struct, contentType, body string, size int, reset bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, wait)
	defer cancel()
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ticket.MetadataNamespace: meta}}
	s, err := r.proc.Process(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	send := func(m *extprocv3.ProcessingRequest) {
		m.MetadataContext, m.ObservabilityMode = md, true
		if err := s.Send(m); err != nil && !errors.Is(err, io.EOF) {
			r.t.Fatalf("Send: %v", err)
		}
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte(contentType)},
		}},
	}}})
	for i := 0; i < len(body); i += size {
		end := min(i+size, len(body))
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(body[i:end]), EndOfStream: end == len(body) && !reset,
		}}})
	}
	if reset {
		cancel()
		return
	}
	_ = s.CloseSend()
	for {
		if _, err := s.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				r.t.Fatalf("Process ended with %v", err)
			}
			return
		}
	}
}

// logged sends the request's final access log entry: Check's metadata,
// the status, and a usage header when usage is not empty.
func (r *outcomeReplica) logged(meta *structpb.Struct, status uint32, usage string) {
	r.t.Helper()
	hs := map[string]string{}
	if usage != "" {
		hs["x-usage-total-tokens"] = usage
	}
	sendEntries(r.t, r.ctx, r.als, &datav3.HTTPAccessLogEntry{
		CommonProperties: &datav3.AccessLogCommon{
			UpstreamCluster: "llm", Duration: durationpb.New(time.Second), AccessLogType: datav3.AccessLogType_DownstreamEnd,
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ticket.MetadataNamespace: meta}},
		},
		Response: &datav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(status), ResponseHeaders: hs},
	})
}

// counted is what the tenant's token budget holds: a ShouldRateLimit on
// its descriptor charges 0 tokens (hits_addend 0) and reports the room.
func (r *outcomeReplica) counted() uint64 {
	r.t.Helper()
	resp, err := r.client.ShouldRateLimit(r.ctx, &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*commonrl.RateLimitDescriptor{{
		Entries:    []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "loop"}, {Key: "model", Value: "gpt-4o"}},
		HitsAddend: wrapperspb.UInt64(0),
	}}})
	if err != nil || len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit().GetName() != "tenant_model_tokens" {
		r.t.Fatalf("budget probe = %v, %v", resp, err)
	}
	return 100000 - uint64(resp.GetStatuses()[0].GetLimitRemaining())
}

func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString("data: " + e + "\n\n")
	}
	return b.String()
}

func TestOutcomeLoop(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
			defer cancel()
			rules, authz := t.TempDir(), t.TempDir()
			writeFile(t, filepath.Join(rules, "rules.yaml"), outcomeRules)
			writeFile(t, filepath.Join(authz, "authz.yaml"), outcomeAuthz)
			writeFile(t, filepath.Join(authz, "keys.yaml"), "keys:\n  - {key: \""+outcomeKey+"\", tenant: loop}\n")
			path := filepath.Join(authz, "authz.yaml")
			var checker, reader, logger *outcomeReplica
			if store == "memory" {
				checker = startOutcomeReplica(t, ctx, rules, path)
				reader, logger = checker, checker
			} else {
				srv := redistest.Start(t)
				// Leases off: a replica answers a leased key's room from
				// its lease, which would hide another replica's refund
				// from counted for up to a lease's life.
				flags := []string{"--redis-url", srv.URL(), "--store-timeout", "250ms", "--lease-fraction", "0"}
				checker = startOutcomeReplica(t, ctx, rules, path, append(flags, "--replica-id", "a")...)
				reader = startOutcomeReplica(t, ctx, rules, path, append(flags, "--replica-id", "b")...)
				logger = startOutcomeReplica(t, ctx, rules, path, append(flags, "--replica-id", "c")...)
			}
			var want int64
			settles := func(what string, add int64) {
				t.Helper()
				want += add
				if got := int64(checker.counted()); got != want {
					_, m := reader.get("/metrics")
					t.Logf("reader metrics:\n%s\n%s", grepLines(m, "tollgate_extproc"), grepLines(m, "tollgate_outcome"))
					t.Fatalf("%s: the budget counts %d, want %d", what, got, want)
				}
			}
			round := func(what string, stream bool, contentType, body string, size int, reset bool, add int64) *structpb.Struct {
				t.Helper()
				meta := checker.check(stream)
				reader.process(meta, contentType, body, size, reset)
				// Envoy's access log entry comes after the response,
				// without usage: it must not settle a second time.
				logger.logged(meta, 200, "")
				settles(what, add)
				return meta
			}
			chat := round("a JSON chat completion", false, "application/json",
				`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],`+
					`"usage":{"prompt_tokens":100,"completion_tokens":150,"total_tokens":250}}`, 1<<20, false, 250)
			round("an SSE stream split at odd bytes", true, "text/event-stream", sse(
				`{"choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
				`{"choices":[{"index":0,"delta":{"content":"lo, wörld 👋"}}]}`,
				`{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":200,"total_tokens":300}}`,
				`[DONE]`), 7, false, 300)
			round("a Responses API body", false, "application/json",
				`{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":100,"output_tokens":20,"total_tokens":120}}`,
				3, false, 120)
			round("a Responses API stream", true, "text/event-stream",
				"event: response.output_text.delta\n"+sse(`{"type":"response.output_text.delta","delta":"Hi"}`)+
					"event: response.completed\n"+sse(`{"type":"response.completed","response":{"usage":{"input_tokens":60,"output_tokens":20,"total_tokens":80}}}`),
				5, false, 80)
			// The access log entry may arrive before ext_proc's report:
			// without usage, it must leave the tokens to it.
			early := checker.check(false)
			logger.logged(early, 200, "")
			settles("the access log first, reservation kept", 1000)
			reader.process(early, "application/json", `{"usage":{"prompt_tokens":100,"completion_tokens":300,"total_tokens":400}}`, 16, false)
			settles("then ext_proc's usage", 400-1000)
			// A client that goes away mid-stream: no usage, and only a
			// few characters streamed, so the reservation stands.
			round("a stream cut before its usage", true, "text/event-stream",
				sse(`{"choices":[{"index":0,"delta":{"content":"partial answer"}}]}`), 11, true, 1000)

			// Reported again, by either channel, on any replica: once.
			reader.process(chat, "application/json", `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, 64, false)
			logger.logged(chat, 200, "5")
			settles("the first ticket reported again", 0)

			// An altered ticket, a forged one and an unsigned one change
			// nothing, whatever usage they claim.
			altered := proto2(chat)
			s := altered.Fields[ticket.Field].GetStringValue()
			altered.Fields[ticket.Field] = structpb.NewStringValue(s[:20] + flip(s[20]) + s[21:])
			forged, err := ticket.NewSealer(ticket.RandomKeys(), 0)
			if err != nil {
				t.Fatal(err)
			}
			made := proto2(chat)
			made.Fields[ticket.Field] = structpb.NewStringValue(forged.Seal(&ticket.Ticket{ID: "req.x", Domain: "ai", Reserved: true, Tokens: 50000, At: time.Now()}))
			for _, m := range []*structpb.Struct{altered, made} {
				reader.process(m, "application/json", `{"usage":{"total_tokens":0}}`, 64, false)
				logger.logged(m, 200, "0")
			}
			settles("forged and altered tickets", 0)
			if _, metrics := reader.get("/metrics"); !strings.Contains(metrics, `tollgate_outcome_tickets_total{channel="extproc",result="forged"} 2`) {
				t.Errorf("/metrics lacks the two forged ext_proc tickets:\n%s", grepLines(metrics, "tollgate_outcome_tickets_total"))
			}
		})
	}
}

// proto2 copies a Struct's top-level fields.
func proto2(s *structpb.Struct) *structpb.Struct {
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range s.GetFields() {
		out.Fields[k] = v
	}
	return out
}

// flip is another base64url character than c.
func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}
