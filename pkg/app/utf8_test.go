package app

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/pkg/utf8esc"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// Envoy is C++: header values, descriptor values and bodies reach Tollgate
// as the bytes the client sent, valid UTF-8 or not. These tests send such
// bytes with the real clients and expect normal answers.

const utf8Rules = `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000, name: tenant_requests}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 100000, name: tenant_model_tokens}
`

const utf8Authz = `
domain: ai
keys_file: keys.yaml
model: {body_field: model, header: x-model}
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
  - [{key: user, from: "header:x-user"}]
estimate: {chars_per_token: 4, default_max_tokens: 100}
usage_header: x-usage-total-tokens
`

// rawCodec marshals as grpc-go's proto codec does, then puts bytes that
// are not UTF-8 where placeholders stood: proto.Marshal refuses to write
// them, Envoy sends them.
type rawCodec struct {
	swaps   [][2]string
	swapped *atomic.Int64 // messages that carried a placeholder
}

// withBytes returns a call option that sends each of bad in place of the
// placeholder returned for it; each bad value is at least 3 bytes, so
// the placeholders are unique and of the same length. The test fails if
// no message sent with the option carried a placeholder.
func withBytes(t testing.TB, bad ...string) (grpc.CallOption, []string) {
	t.Helper()
	c := rawCodec{swapped: new(atomic.Int64)}
	t.Cleanup(func() {
		if c.swapped.Load() == 0 {
			t.Errorf("no message carried the placeholders for %q", bad)
		}
	})
	var holders []string
	for i, b := range bad {
		p := "~" + strconv.Itoa(i) + "~"
		if len(b) < len(p) {
			t.Fatalf("bad value %q shorter than its placeholder %q", b, p)
		}
		p += strings.Repeat("~", len(b)-len(p))
		c.swaps = append(c.swaps, [2]string{p, b})
		holders = append(holders, p)
	}
	return grpc.ForceCodec(c), holders
}

func (rawCodec) Name() string { return "proto" }

func (c rawCodec) Marshal(v any) ([]byte, error) {
	b, err := proto.Marshal(v.(proto.Message))
	if err != nil {
		return nil, err
	}
	swapped := false
	for _, s := range c.swaps {
		if bytes.Contains(b, []byte(s[0])) {
			b, swapped = bytes.ReplaceAll(b, []byte(s[0]), []byte(s[1])), true
		}
	}
	if swapped {
		c.swapped.Add(1)
	}
	return b, nil
}

func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }

func startUTF8Replica(t *testing.T, ctx context.Context, store string) *outcomeReplica {
	t.Helper()
	rules, authz := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(rules, "rules.yaml"), utf8Rules)
	writeFile(t, filepath.Join(authz, "authz.yaml"), utf8Authz)
	writeFile(t, filepath.Join(authz, "keys.yaml"), "keys:\n  - {key: \""+outcomeKey+"\", tenant: loop}\n")
	var flags []string
	if store == "redis" {
		flags = []string{"--redis-url", redistest.Start(t).URL(), "--lease-fraction", "0"}
	}
	return startOutcomeReplica(t, ctx, rules, filepath.Join(authz, "authz.yaml"), flags...)
}

// TestInvalidUTF8RateLimit: a descriptor value with bytes that are not
// UTF-8 is answered and counted, the same bytes always on the same key,
// other bytes on another.
func TestInvalidUTF8RateLimit(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
			defer cancel()
			r := startUTF8Replica(t, ctx, store)
			steps := []struct {
				name string
				give string
				want rlsv3.RateLimitResponse_Code
			}{
				{name: "first", give: "u\xff\xff", want: rlsv3.RateLimitResponse_OK},
				{name: "second", give: "u\xff\xff", want: rlsv3.RateLimitResponse_OK},
				{name: "third, same bytes, same key", give: "u\xff\xff", want: rlsv3.RateLimitResponse_OVER_LIMIT},
				{name: "other bytes, other key", give: "u\xfe\xff", want: rlsv3.RateLimitResponse_OK},
				{name: "a truncated sequence", give: "u\xe2\x82", want: rlsv3.RateLimitResponse_OK},
			}
			for _, st := range steps {
				opt, holders := withBytes(t, st.give)
				resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*commonrl.RateLimitDescriptor{{
					Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: holders[0]}},
				}}}, opt)
				if err != nil {
					t.Fatalf("%s: ShouldRateLimit: %v", st.name, err)
				}
				if got := resp.GetOverallCode(); got != st.want {
					t.Fatalf("%s: code %v, want %v", st.name, got, st.want)
				}
				if name := resp.GetStatuses()[0].GetCurrentLimit().GetName(); name != "per_user" {
					t.Fatalf("%s: limit %q, want per_user", st.name, name)
				}
			}
			if _, m := r.get("/metrics"); !strings.Contains(m, `tollgate_grpc_invalid_utf8_messages_total{message="envoy.service.ratelimit.v3.RateLimitRequest"} 5`) {
				t.Errorf("/metrics lacks 5 repaired rate limit requests:\n%s", grepLines(m, "invalid_utf8"))
			}
		})
	}
}

// TestInvalidUTF8Check: a header and a body with bytes that are not UTF-8
// get a normal Check answer, counted on one key per byte string, and the
// model echoed in a header is valid UTF-8: the escaped bytes.
func TestInvalidUTF8Check(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	r := startUTF8Replica(t, ctx, "memory")
	const user, other, model = "\xffuser\xff", "\xfeuser\xff", "gpt-\xc0\xaf"
	steps := []struct {
		name      string
		give      string // how the model travels: "body", "raw_body" or "header"
		user      string
		wantAdmit bool
		wantModel string // echoed in x-tollgate-model
	}{
		// In a body the model is read as the backend's encoding/json reads
		// it, invalid bytes as U+FFFD, whether Envoy packs the body as a
		// string or as bytes.
		{name: "model in body", give: "body", user: user, wantAdmit: true, wantModel: "gpt-\uFFFD\uFFFD"},
		{name: "model in raw_body", give: "raw_body", user: user, wantAdmit: true, wantModel: "gpt-\uFFFD\uFFFD"},
		{name: "same user bytes, third request over", give: "body", user: user, wantAdmit: false},
		// A header value is escaped: valid UTF-8, one key per byte string.
		{name: "other user bytes, model in a header", give: "header", user: other, wantAdmit: true, wantModel: utf8esc.String(model)},
	}
	for _, st := range steps {
		opt, holders := withBytes(t, st.user, model)
		body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":10,"model":"` + holders[1] + `"}`
		hs := map[string]string{"authorization": "Bearer " + outcomeKey, "x-user": holders[0], PartialHeader: "false"}
		h := &authv3.AttributeContext_HttpRequest{Id: "req", Method: "POST", Path: "/v1/chat/completions", Headers: hs}
		switch st.give {
		case "body":
			h.Body = body
		case "raw_body":
			h.RawBody = []byte(body)
		case "header":
			hs["x-model"] = holders[1]
			body = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":10}`
			h.Body = body
		}
		hs["content-length"] = strconv.Itoa(len(body))
		h.Size = int64(len(body))
		resp, err := r.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: h}}}, opt)
		if err != nil {
			t.Fatalf("%s: Check: %v", st.name, err)
		}
		if admitted := resp.GetOkResponse() != nil; admitted != st.wantAdmit {
			t.Fatalf("%s: admitted %t, want %t: %v", st.name, admitted, st.wantAdmit, resp)
		}
		if !st.wantAdmit {
			if got := resp.GetDeniedResponse().GetStatus().GetCode(); got != 429 {
				t.Fatalf("%s: denied with %v, want 429", st.name, got)
			}
			continue
		}
		var echoed string
		for _, o := range resp.GetOkResponse().GetHeaders() {
			if o.GetHeader().GetKey() == extauthz.HeaderModel {
				echoed = o.GetHeader().GetValue()
			}
		}
		if echoed != st.wantModel {
			t.Fatalf("%s: %s = %q, want %q", st.name, extauthz.HeaderModel, echoed, st.wantModel)
		}
	}
}

// TestInvalidUTF8AccessLogBatch: one entry with bytes that are not UTF-8
// costs the batch nothing: every entry settles, and a metric counts the
// repair.
func TestInvalidUTF8AccessLogBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	r := startUTF8Replica(t, ctx, "memory")
	entry := func(meta *structpb.Struct, usage, path string) *datav3.HTTPAccessLogEntry {
		return &datav3.HTTPAccessLogEntry{
			CommonProperties: &datav3.AccessLogCommon{
				UpstreamCluster: "llm", Duration: durationpb.New(time.Second), AccessLogType: datav3.AccessLogType_DownstreamEnd,
				Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ticket.MetadataNamespace: meta}},
			},
			Request:  &datav3.HTTPRequestProperties{Path: path},
			Response: &datav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200), ResponseHeaders: map[string]string{"x-usage-total-tokens": usage}},
		}
	}
	opt, holders := withBytes(t, "/v1/\xff\xfe")
	before := r.counted()
	a, b, c := r.check(false), r.check(false), r.check(false)
	if got := r.counted() - before; got != 3000 {
		t.Fatalf("three Checks reserved %d tokens, want 3000", got)
	}
	stream, err := r.als.StreamAccessLogs(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&alsv3.StreamAccessLogsMessage{
		Identifier: &alsv3.StreamAccessLogsMessage_Identifier{Node: &corev3.Node{Id: "envoy-1"}, LogName: "tollgate"},
		LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*datav3.HTTPAccessLogEntry{
			entry(a, "100", "/v1/chat/completions"), entry(b, "200", holders[0]), entry(c, "300", "/v1/chat/completions"),
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("StreamAccessLogs: %v", err)
	}
	if got := r.counted() - before; got != 600 {
		t.Fatalf("after the batch the budget counts %d tokens, want 600 (100+200+300 settled)", got)
	}
	_, m := r.get("/metrics")
	for _, want := range []string{
		`tollgate_grpc_invalid_utf8_messages_total{message="envoy.service.accesslog.v3.StreamAccessLogsMessage"} 1`,
		`tollgate_grpc_invalid_utf8_values_total{message="envoy.service.accesslog.v3.StreamAccessLogsMessage"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "invalid_utf8"))
		}
	}
}

// TestInvalidUTF8Process: a response header that is not UTF-8 does not
// cost ext_proc the usage in the body that follows it.
func TestInvalidUTF8Process(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	r := startUTF8Replica(t, ctx, "memory")
	before := r.counted()
	meta := r.check(false)
	opt, holders := withBytes(t, "v\xff\xfe")
	s, err := r.proc.Process(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ticket.MetadataNamespace: meta}}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("application/json")}, {Key: "x-junk", Value: holders[0]},
		}}}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(`{"usage":{"prompt_tokens":100,"completion_tokens":150,"total_tokens":250}}`), EndOfStream: true,
		}}},
	} {
		m.MetadataContext, m.ObservabilityMode = md, true
		if err := s.Send(m); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	_ = s.CloseSend()
	for {
		if _, err := s.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("Process ended with %v", err)
			}
			break
		}
	}
	if got := r.counted() - before; got != 250 {
		t.Fatalf("the budget counts %d tokens, want 250 settled", got)
	}
}
