package envoysim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/test/closedloop"
)

const usageJSON = `{"id":"c1","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`

func okResponse(set map[string]string, md map[string]any) *authv3.CheckResponse {
	ok := &authv3.OkHttpResponse{}
	for k, v := range set {
		ok.Headers = append(ok.Headers, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}})
	}
	resp := &authv3.CheckResponse{Status: &statuspb.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok}}
	if md != nil {
		resp.DynamicMetadata, _ = structpb.NewStruct(md)
	}
	return resp
}

func chatRequest(body string) *closedloop.Request {
	return &closedloop.Request{
		Method: http.MethodPost, Path: "/v1/chat/completions",
		Header:  http.Header{"Authorization": {"Bearer k"}, "Content-Type": {"application/json"}, "X-Envoy-Max-Retries": {"9"}},
		Body:    []byte(body),
		Timeout: 5 * time.Second,
	}
}

// onlyEntry waits for n entries and returns the last.
func lastEntry(t *testing.T, f *fakeTollgate, g *Gateway, n int) *datav3.HTTPAccessLogEntry {
	t.Helper()
	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	f.waitFor(t, "access log entries", func(f *fakeTollgate) bool { return f.entries() >= n })
	f.mu.Lock()
	defer f.mu.Unlock()
	var last *datav3.HTTPAccessLogEntry
	for _, s := range f.alsLogs {
		for _, m := range s {
			for _, e := range m.GetHttpLogs().GetLogEntry() {
				last = e
			}
		}
	}
	return proto.Clone(last).(*datav3.HTTPAccessLogEntry)
}

// TestAdmitted follows one admitted request: the CheckRequest as Envoy
// builds it, the headers Check set reaching the upstream, the response
// observed through ext_proc with the ticket, and the access log entry.
func TestAdmitted(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	f.check = func(*authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(map[string]string{"x-tollgate-tenant": "acme"}, map[string]any{"tollgate_reservation": "ticket-1"}), nil
	}
	var got http.Header
	up := upstreamFunc(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Usage-Total-Tokens", "18")
		_, _ = w.Write([]byte(usageJSON))
	})
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: up.URL, Instances: 1})
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	res := g.Do(context.Background(), chatRequest(body))

	if want := (closedloop.Result{Status: 200, Source: closedloop.SourceUpstream, Attempts: 1, PromptTokens: 11, CompletionTokens: 7}); !sameResult(res, want) {
		t.Errorf("result = %+v, want %+v", res, want)
	}
	if got.Get("X-Tollgate-Tenant") != "acme" || got.Get("X-Envoy-Max-Retries") != "" {
		t.Errorf("upstream headers = %v, want x-tollgate-tenant from Check and no client x-envoy-*", got)
	}

	f.mu.Lock()
	check := proto.Clone(f.checks[0]).(*authv3.CheckRequest)
	f.mu.Unlock()
	hr := check.GetAttributes().GetRequest().GetHttp()
	wantCheck := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: check.GetAttributes().GetSource().GetAddress()},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress("127.0.0.1", 10000)},
		Request: &authv3.AttributeContext_Request{
			Time: check.GetAttributes().GetRequest().GetTime(),
			Http: &authv3.AttributeContext_HttpRequest{
				Id: hr.GetId(), Method: "POST", Path: "/v1/chat/completions", Host: "localhost:10000",
				Scheme: "http", Protocol: "HTTP/1.1", Size: int64(len(body)), RawBody: []byte(body),
				Headers: map[string]string{
					":authority": "localhost:10000", ":path": "/v1/chat/completions", ":method": "POST", ":scheme": "http",
					"authorization": "Bearer k", "content-type": "application/json", "content-length": strconv.Itoa(len(body)),
					"x-forwarded-for": "127.0.0.1", "x-forwarded-proto": "http", "x-request-id": hr.GetHeaders()["x-request-id"],
					"x-envoy-auth-partial-body": "false",
				},
			},
		},
		MetadataContext: &corev3.Metadata{}, RouteMetadataContext: &corev3.Metadata{},
	}}
	if d := cmp.Diff(wantCheck, check, protocmp.Transform()); d != "" {
		t.Errorf("CheckRequest (-want +got):\n%s", d)
	}
	if _, err := strconv.ParseUint(hr.GetId(), 10, 64); err != nil || len(hr.GetHeaders()["x-request-id"]) != 36 {
		t.Errorf("id %q, x-request-id %q: want a stream id and a UUID", hr.GetId(), hr.GetHeaders()["x-request-id"])
	}

	ticket, _ := structpb.NewStruct(map[string]any{"tollgate_reservation": "ticket-1"})
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.ext_authz": ticket}}
	f.waitFor(t, "ext_proc stream", func(f *fakeTollgate) bool { return len(f.procs) == 1 })
	f.mu.Lock()
	proc := clone(f.procs[0])
	f.mu.Unlock()
	if len(proc) < 2 {
		t.Fatalf("ext_proc messages = %d, want headers and body", len(proc))
	}
	hdrs := proc[0].GetResponseHeaders().GetHeaders().GetHeaders()
	if hdrs[0].GetKey() != ":status" || string(hdrs[0].GetRawValue()) != "200" {
		t.Errorf("first response header = %v, want :status 200", hdrs[0])
	}
	var seen []byte
	for i, m := range proc {
		if !m.GetObservabilityMode() || !proto.Equal(m.GetMetadataContext(), md) {
			t.Errorf("message %d: observability_mode %v, metadata %v; want true and the ticket", i, m.GetObservabilityMode(), m.GetMetadataContext())
		}
		seen = append(seen, m.GetResponseBody().GetBody()...)
	}
	if !bytes.Equal(seen, []byte(usageJSON)) || !proc[len(proc)-1].GetResponseBody().GetEndOfStream() {
		t.Errorf("ext_proc body = %q, last end_of_stream %v; want the response, ended", seen, proc[len(proc)-1].GetResponseBody().GetEndOfStream())
	}

	e := lastEntry(t, f, g, 1)
	c := e.GetCommonProperties()
	if c.GetUpstreamCluster() != "inference_backend" || c.GetRouteName() != "inference" || c.GetUpstreamRequestAttemptCount() != 1 ||
		c.GetResponseFlags() != nil || !proto.Equal(c.GetMetadata(), md) || c.GetTimeToFirstUpstreamRxByte() == nil ||
		c.GetAccessLogType() != datav3.AccessLogType_DownstreamEnd || c.GetUpstreamRemoteAddress() == nil {
		t.Errorf("common properties = %v", c)
	}
	wantResp := &datav3.HTTPResponseProperties{
		ResponseCode: wrapperspb.UInt32(200), ResponseCodeDetails: "via_upstream",
		ResponseHeadersBytes: e.GetResponse().GetResponseHeadersBytes(), ResponseBodyBytes: uint64(len(usageJSON)),
		ResponseHeaders: map[string]string{"x-usage-total-tokens": "18"},
	}
	if d := cmp.Diff(wantResp, e.GetResponse(), protocmp.Transform()); d != "" {
		t.Errorf("response properties (-want +got):\n%s", d)
	}
}

func sameResult(got, want closedloop.Result) bool {
	// Timings vary; MaxRetries and Replica have their own checks
	// (TestMaxRetries), and default to none here.
	got.Latency, got.Check, got.CheckAfter = 0, 0, 0
	if want.MaxRetries == 0 {
		want.MaxRetries = got.MaxRetries
	}
	if want.Replica == 0 {
		want.Replica = got.Replica
	}
	return got == want
}

// TestDenied: a Denied answer becomes Envoy's local reply with Check's
// status, headers and body, never reaches the upstream, and is logged
// with UAEX and ext_authz_denied.
func TestDenied(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	f.check = func(*authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return &authv3.CheckResponse{
			Status: &statuspb.Status{Code: 8},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
				Headers: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: "x-tollgate-reason", Value: "rate_limited"}},
					{Header: &corev3.HeaderValue{Key: "retry-after", Value: "3"}},
				},
				Body: `{"error":{}}`,
			}},
		}, nil
	}
	up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) { t.Error("a denied request reached the upstream") })
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: up.URL})
	res := g.Do(context.Background(), chatRequest(`{}`))
	want := closedloop.Result{Status: 429, Source: closedloop.SourceTollgate, Reason: "rate_limited", RetryAfter: 3 * time.Second}
	if !sameResult(res, want) {
		t.Errorf("result = %+v, want %+v", res, want)
	}
	e := lastEntry(t, f, g, 1)
	wantFlags := &datav3.ResponseFlags{UnauthorizedDetails: &datav3.ResponseFlags_Unauthorized{Reason: datav3.ResponseFlags_Unauthorized_EXTERNAL_SERVICE}}
	if d := cmp.Diff(wantFlags, e.GetCommonProperties().GetResponseFlags(), protocmp.Transform()); d != "" {
		t.Errorf("flags (-want +got):\n%s", d)
	}
	if e.GetResponse().GetResponseCode().GetValue() != 429 || e.GetResponse().GetResponseCodeDetails() != "ext_authz_denied" ||
		e.GetCommonProperties().GetUpstreamCluster() != "" || e.GetResponse().GetResponseBodyBytes() != uint64(len(`{"error":{}}`)) {
		t.Errorf("entry = %v", e)
	}
}

// TestBody: the body Check gets, whole or cut at max_request_bytes.
func TestBody(t *testing.T) {
	t.Parallel()
	const max = 1 << 20
	tests := []struct {
		name        string
		give        int
		wantSent    int
		wantPartial string
		wantSize    int64
	}{
		{name: "small", give: 100, wantSent: 100, wantPartial: "false", wantSize: 100},
		{name: "at the limit", give: max, wantSent: max, wantPartial: "false", wantSize: max},
		{name: "over the limit", give: max + 100, wantSent: max, wantPartial: "true", wantSize: max + 100},
		{name: "far over the limit", give: 3 * max, wantSent: max, wantPartial: "true", wantSize: max + bodyChunk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := startFake(t)
			f.check = func(*authv3.CheckRequest) (*authv3.CheckResponse, error) {
				return &authv3.CheckResponse{Status: &statuspb.Status{Code: 7}}, nil
			}
			g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: "http://127.0.0.1:1"})
			body := bytes.Repeat([]byte("é"), tt.give/2+1)[:tt.give] // cut mid-character: raw_body carries it
			_ = g.Do(context.Background(), chatRequest(string(body)))
			f.mu.Lock()
			hr := f.checks[0].GetAttributes().GetRequest().GetHttp()
			f.mu.Unlock()
			if !bytes.Equal(hr.GetRawBody(), body[:tt.wantSent]) || hr.GetBody() != "" {
				t.Errorf("raw_body %d bytes, body %d bytes; want %d raw", len(hr.GetRawBody()), len(hr.GetBody()), tt.wantSent)
			}
			if hr.GetHeaders()["x-envoy-auth-partial-body"] != tt.wantPartial || hr.GetSize() != tt.wantSize {
				t.Errorf("partial %q size %d, want %q %d", hr.GetHeaders()["x-envoy-auth-partial-body"], hr.GetSize(), tt.wantPartial, tt.wantSize)
			}
		})
	}
}

// TestTooLarge: without allow_partial_message, Envoy answers 413 itself
// and sends no Check.
func TestTooLarge(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	boot := variant(t, authzBootstrap, "allow_partial_message: true", "allow_partial_message: false")
	g := newGateway(t, Config{Bootstrap: boot, Replicas: []string{f.addr}, Upstream: "http://127.0.0.1:1"})
	res := g.Do(context.Background(), chatRequest(string(make([]byte, 1<<20+1))))
	if res.Status != 413 || res.Source != closedloop.SourceEnvoy {
		t.Errorf("result = %+v, want Envoy's 413", res)
	}
	e := lastEntry(t, f, g, 1)
	if len(f.checks) != 0 || e.GetResponse().GetResponseCodeDetails() != "request_payload_too_large" {
		t.Errorf("checks %d, details %q", len(f.checks), e.GetResponse().GetResponseCodeDetails())
	}
}

// TestStreamed: an SSE response with a usage trailer goes to ext_proc in
// order: headers, every body chunk (the last without end_of_stream),
// then the trailers; the entry logs the trailer.
func TestStreamed(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	f.check = func(*authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil, map[string]any{"tollgate_reservation": "t"}), nil
	}
	var chunks []string
	for i := range 5 {
		chunks = append(chunks, fmt.Sprintf("data: {\"n\":%d}\n\n", i))
	}
	chunks = append(chunks, `data: {"usage":{"prompt_tokens":3,"completion_tokens":5}}`+"\n\ndata: [DONE]\n\n")
	up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Trailer", "X-Usage-Total-Tokens")
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			_, _ = w.Write([]byte(c))
			w.(http.Flusher).Flush()
		}
		w.Header().Set("X-Usage-Total-Tokens", "8")
	})
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: up.URL})
	res := g.Do(context.Background(), chatRequest(`{"stream":true}`))
	if res.Status != 200 || res.PromptTokens != 3 || res.CompletionTokens != 5 {
		t.Errorf("result = %+v", res)
	}
	f.waitFor(t, "ext_proc stream", func(f *fakeTollgate) bool { return len(f.procs) == 1 })
	f.mu.Lock()
	proc := clone(f.procs[0])
	f.mu.Unlock()
	var body []byte
	for i, m := range proc {
		switch {
		case i == 0:
			if m.GetResponseHeaders() == nil || m.GetResponseHeaders().GetEndOfStream() {
				t.Errorf("message 0 = %v, want response headers with a body to follow", m)
			}
		case i == len(proc)-1:
			want := &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-usage-total-tokens", RawValue: []byte("8")}}}}
			if d := cmp.Diff(want, m.GetResponseTrailers(), protocmp.Transform()); d != "" {
				t.Errorf("last message (-want +got):\n%s", d)
			}
		default:
			if m.GetResponseBody() == nil || m.GetResponseBody().GetEndOfStream() {
				t.Errorf("message %d = %v, want a body chunk without end_of_stream", i, m)
			}
			body = append(body, m.GetResponseBody().GetBody()...)
		}
	}
	var all []byte
	for _, c := range chunks {
		all = append(all, c...)
	}
	if !bytes.Equal(body, all) {
		t.Errorf("ext_proc body = %q, want %q", body, all)
	}
	e := lastEntry(t, f, g, 1)
	if e.GetResponse().GetResponseTrailers()["x-usage-total-tokens"] != "8" {
		t.Errorf("trailers = %v", e.GetResponse().GetResponseTrailers())
	}
}

// TestClientTimeout: a client that gives up cancels the upstream request
// and is logged as a downstream disconnect.
func TestClientTimeout(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	cancelled := make(chan struct{})
	testDone := make(chan struct{})
	up := upstreamFunc(t, func(_ http.ResponseWriter, r *http.Request) {
		// Go's server notices a closed connection once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-testDone:
		}
	})
	t.Cleanup(func() { close(testDone) }) // runs before the upstream's Close
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: up.URL})
	req := chatRequest(`{}`)
	req.Timeout = 100 * time.Millisecond
	res := g.Do(context.Background(), req)
	if res.Source != closedloop.SourceClient || res.Status != 0 || res.Attempts != 1 || res.Latency < req.Timeout {
		t.Errorf("result = %+v, want the client's give-up after %v", res, req.Timeout)
	}
	select {
	case <-cancelled:
	case <-time.After(waitLimit):
		t.Fatal("the upstream request was not cancelled")
	}
	e := lastEntry(t, f, g, 1)
	wantFlags := &datav3.ResponseFlags{DownstreamConnectionTermination: true}
	if d := cmp.Diff(wantFlags, e.GetCommonProperties().GetResponseFlags(), protocmp.Transform()); d != "" {
		t.Errorf("flags (-want +got):\n%s", d)
	}
	if e.GetResponse().GetResponseCode() != nil || e.GetResponse().GetResponseCodeDetails() != "downstream_remote_disconnect" ||
		e.GetCommonProperties().GetUpstreamCluster() != "inference_backend" {
		t.Errorf("response = %v", e.GetResponse())
	}
	if s := g.Stats(); s.ClientTimeouts != 1 {
		t.Errorf("ClientTimeouts = %d, want 1", s.ClientTimeouts)
	}
}

// BenchmarkDo is one admitted request end to end: Check, upstream,
// ext_proc, access log, against the in-process fakes (their cost
// included).
func BenchmarkDo(b *testing.B) {
	f := startFake(b)
	f.check = func(*authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(map[string]string{"x-tollgate-tenant": "acme"}, map[string]any{"tollgate_reservation": "ticket-1"}), nil
	}
	up := upstreamFunc(b, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(usageJSON)) })
	g := newGateway(b, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: up.URL})
	req := chatRequest(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if res := g.Do(context.Background(), req); res.Status != 200 {
			b.Fatalf("result = %+v", res)
		}
	}
}
