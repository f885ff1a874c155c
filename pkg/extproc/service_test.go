package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/test/testutil"
)

var (
	jsonHeaders = []string{":status", "200", "content-type", "application/json"}
	sseHeaders  = []string{":status", "200", "content-type", "text/event-stream; charset=utf-8"}
)

func hdrs(kv []string, extra ...string) *extprocv3.HttpHeaders {
	return headers(false, append(append([]string{}, kv...), extra...)...)
}

// TestProcessObserved plays Envoy in observability mode over a real gRPC
// connection: the response headers and body arrive, split at odd bytes;
// the server answers nothing, settles once at the body's end and closes.
func TestProcessObserved(t *testing.T) {
	t.Parallel()
	ticket := structpb.NewStringValue(testTicket)
	chat := testdata(t, "chat.json")
	stream := testdata(t, "chat_stream.sse")
	responses := testdata(t, "responses.json")
	responsesStream := testdata(t, "responses_stream.sse")
	crlf := []byte(strings.ReplaceAll(string(stream), "\n", "\r\n"))
	tests := []struct {
		name        string
		give        []*extprocv3.ProcessingRequest
		closeSend   bool // half-close after the messages, as Envoy's deferred close does
		opts        Options
		want        Usage
		wantMetrics map[string]float64
	}{
		{
			name: "JSON", give: observed(metadata(ticket), hdrs(jsonHeaders), true, chunked(chat, 13)...),
			want:        Usage{Input: 19, Output: 10, Total: 29, Reported: true, Complete: true, Status: 200},
			wantMetrics: map[string]float64{`tollgate_extproc_streams_total{result="usage"}`: 1, "tollgate_extproc_response_body_bytes_total": float64(len(chat))},
		},
		{
			name: "SSE in 7-byte chunks", give: observed(metadata(ticket), hdrs(sseHeaders), true, chunked(stream, 7)...),
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57, Complete: true, Status: 200},
		},
		{
			name: "SSE with CRLF in 2-byte chunks", give: observed(metadata(ticket), hdrs(sseHeaders), true, chunked(crlf, 2)...),
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57, Complete: true, Status: 200},
		},
		{
			name: "Responses API JSON", give: observed(metadata(ticket), hdrs(jsonHeaders), true, chunked(responses, 100)...),
			want: Usage{Input: 36, Output: 87, Total: 123, Reported: true, Complete: true, Status: 200},
		},
		{
			name: "Responses API stream in 5-byte chunks", give: observed(metadata(ticket), hdrs(sseHeaders), true, chunked(responsesStream, 5)...),
			want: Usage{Input: 36, Output: 87, Total: 123, Reported: true, StreamedChars: 9, Complete: true, Status: 200},
		},
		{
			name: "gzip JSON", give: observed(metadata(ticket), hdrs(jsonHeaders, "content-encoding", "gzip"), true, chunked(gzipped(t, chat), 11)...),
			want: Usage{Input: 19, Output: 10, Total: 29, Reported: true, Complete: true, Status: 200},
		},
		{
			name: "gzip SSE", give: observed(metadata(ticket), hdrs(sseHeaders, "content-encoding", "gzip"), true, chunked(gzipped(t, stream), 3)...),
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57, Complete: true, Status: 200},
		},
		{
			name: "gzip over the decoded bound", opts: Options{MaxDecodedBytes: 1000},
			give:        observed(metadata(ticket), hdrs(sseHeaders, "content-encoding", "gzip"), true, chunked(gzipped(t, []byte(strings.Repeat(textEvent("a"), 1000)+usageEvent(`{"total_tokens":5}`))), 64)...),
			want:        Usage{StreamedChars: uint64(1000 / len(textEvent("a"))), Complete: true, Status: 200}, // the events that fit in the bound
			wantMetrics: map[string]float64{`tollgate_extproc_no_usage_total{reason="too_large"}`: 1, `tollgate_extproc_streams_total{result="no_usage"}`: 1},
		},
		{
			name: "corrupt gzip", give: observed(metadata(ticket), hdrs(jsonHeaders, "content-encoding", "gzip"), true, chat),
			want:        Usage{Complete: true, Status: 200},
			wantMetrics: map[string]float64{`tollgate_extproc_no_usage_total{reason="encoding"}`: 1},
		},
		{
			name: "brotli is not read, but drained", give: observed(metadata(ticket), hdrs(jsonHeaders, "content-encoding", "br"), true, chat, chat),
			want:        Usage{Complete: true, Status: 200},
			wantMetrics: map[string]float64{`tollgate_extproc_no_usage_total{reason="encoding"}`: 1},
		},
		{
			name: "stream without usage", give: observed(metadata(ticket), hdrs(sseHeaders), true, []byte(textEvent("hello")+"data: [DONE]\n\n")),
			want:        Usage{StreamedChars: 5, Complete: true, Status: 200},
			wantMetrics: map[string]float64{`tollgate_extproc_no_usage_total{reason="not_reported"}`: 1},
		},
		{
			name: "garbage body", give: observed(metadata(ticket), hdrs(jsonHeaders), true, []byte("\x00\xff{\"usage\":{\"total_tokens\":"), []byte("-1}}}}]]\"")),
			want: Usage{Complete: true, Status: 200},
		},
		{
			name: "no body", give: observed(metadata(ticket), headers(true, ":status", "204"), false),
			want: Usage{Complete: true, Status: 204},
		},
		{
			name: "body without response headers", give: observed(metadata(ticket), nil, true, chat)[1:],
			want: Usage{Input: 19, Output: 10, Total: 29, Reported: true, Complete: true},
		},
		{
			name: "trailers end the body", closeSend: false,
			give: append(observed(metadata(ticket), hdrs(sseHeaders), false, stream), &extprocv3.ProcessingRequest{
				Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}, ObservabilityMode: true,
			}),
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57, Complete: true, Status: 200},
		},
		{
			name: "stream half-closed before the body ended", closeSend: true,
			give:        observed(metadata(ticket), hdrs(sseHeaders), false, stream[:len(stream)/2]),
			want:        Usage{StreamedChars: 14, Status: 200}, // the three events before the cut
			wantMetrics: map[string]float64{`tollgate_extproc_no_usage_total{reason="cut"}`: 1},
		},
		{
			name: "header values in value, not raw_value",
			give: observed(metadata(ticket), &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":status", Value: "201"}, {Key: "content-type", Value: "text/event-stream"},
			}}}, true, chunked(stream, 50)...),
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57, Complete: true, Status: 201},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tt.opts)
			got, err := play(t, h.client, tt.closeSend, tt.give...)
			if err != nil {
				t.Fatalf("stream ended with %v", err)
			}
			if len(got) != 0 {
				t.Fatalf("in observability mode the server sent %d messages", len(got))
			}
			s := h.settler.next(t)
			if s.Ticket != testTicket {
				t.Errorf("ticket = %q, want %q", s.Ticket, testTicket)
			}
			if diff := cmp.Diff(tt.want, s.Usage); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			if n := h.settler.count(); n != 1 {
				t.Errorf("Settle called %d times, want 1", n)
			}
			m := testutil.Gather(t, h.reg)
			for k, v := range tt.wantMetrics {
				if m[k] != v {
					t.Errorf("%s = %v, want %v", k, m[k], v)
				}
			}
		})
	}
}

// TestProcessClientReset: the client goes away mid-stream and Envoy
// resets the ext_proc stream. The server sees a cancel without
// end_of_stream and settles once, incomplete, with the streamed text
// counted, even though the stream's context is already cancelled.
func TestProcessClientReset(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Options{})
	stream := testdata(t, "chat_stream.sse")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := h.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Three whole events ("", "Hello", ", wörld 👋": 14 characters) and
	// part of the fourth.
	cut := 0
	for range 3 {
		cut += strings.Index(string(stream[cut:]), "\n\n") + 2
	}
	cut += 50
	msgs := observed(metadata(structpb.NewStringValue(testTicket)), hdrs(sseHeaders), false, chunked(stream[:cut], 9)...)
	// The last chunk asks for an answer (observability_mode false), so
	// once it comes the server has read every chunk before the reset.
	msgs[len(msgs)-1].ObservabilityMode = false
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	got := h.settler.next(t)
	want := Usage{StreamedChars: 14, Status: 200}
	if diff := cmp.Diff(want, got.Usage); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
	if h.settler.ctxErr != nil {
		t.Errorf("Settle's context was done: %v", h.settler.ctxErr)
	}
	if _, err := s.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Recv after cancel = %v, want Canceled", err)
	}
	m := testutil.Gather(t, h.reg)
	if m[`tollgate_extproc_no_usage_total{reason="cut"}`] != 1 || m[`tollgate_extproc_streams_total{result="no_usage"}`] != 1 {
		t.Errorf("metrics = %v", m)
	}
}

// TestProcessNoTicket: without a ticket nothing is read or settled, and
// the server closes the stream after the first message, so Envoy sends
// no body.
func TestProcessNoTicket(t *testing.T) {
	t.Parallel()
	chat := testdata(t, "chat.json")
	for _, tt := range []struct {
		name       string
		give       *structpb.Value
		wantResult string
	}{
		{name: "absent", give: nil, wantResult: "no_ticket"},
		{name: "empty", give: structpb.NewStringValue(""), wantResult: "no_ticket"},
		{name: "null", give: structpb.NewNullValue(), wantResult: "no_ticket"},
		{name: "a number", give: structpb.NewNumberValue(7), wantResult: "error"},
		{name: "too long", give: structpb.NewStringValue(strings.Repeat("t", MaxTicketBytes+1)), wantResult: "error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Options{})
			// Many chunks: the server must close without reading them.
			chunks := chunked([]byte(strings.Repeat(string(chat), 100)), 10)
			if _, err := play(t, h.client, false, observed(metadata(tt.give), hdrs(jsonHeaders), true, chunks...)...); err != nil {
				t.Fatalf("stream ended with %v", err)
			}
			m := testutil.Gather(t, h.reg)
			if m[`tollgate_extproc_streams_total{result="`+tt.wantResult+`"}`] != 1 {
				t.Errorf("metrics = %v", m)
			}
			if m["tollgate_extproc_response_body_bytes_total"] != 0 {
				t.Errorf("read %v body bytes without a ticket", m["tollgate_extproc_response_body_bytes_total"])
			}
			if n := h.settler.count(); n != 0 {
				t.Errorf("Settle called %d times", n)
			}
		})
	}
}

// TestProcessSettleTimeout: a Settler that hangs is cut off by the
// settle timeout, and the stream still ends.
func TestProcessSettleTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Options{SettleTimeout: 50 * time.Millisecond})
	h.settler.block = make(chan struct{}) // never closed: Settle waits for its context
	msgs := observed(metadata(structpb.NewStringValue(testTicket)), hdrs(jsonHeaders), true, testdata(t, "chat.json"))
	if _, err := play(t, h.client, false, msgs...); err != nil {
		t.Fatal(err)
	}
	h.settler.next(t)
	if h.settler.ctxErr == nil {
		t.Error("Settle's context had no deadline")
	}
}

// replying plays Envoy outside observability mode: each message waits
// for its answer.
func replying(t testing.TB, c extprocv3.ExternalProcessorClient, msgs ...*extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []*extprocv3.ProcessingResponse
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		got = append(got, r)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err == nil {
		t.Fatal("the server sent a message nobody asked for")
	}
	return got
}

// TestProcessRequestPhase plays the optional request-phase filter: the
// server answers each message; a streaming chat request without
// include_usage gets it added, with content-length removed, and nothing
// is settled from this stream.
func TestProcessRequestPhase(t *testing.T) {
	t.Parallel()
	const body = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	const added = `{"stream_options":{"include_usage":true},"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	meta := metadata(structpb.NewStringValue(testTicket))
	request := func(meta any, path, body string, extra ...string) []*extprocv3.ProcessingRequest {
		md := metadata(structpb.NewStringValue(testTicket))
		if meta == nil {
			md = metadata(nil)
		}
		return []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(false, append([]string{":method", "POST", ":path", path, "content-length", "80"}, extra...)...)}, MetadataContext: md},
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}, MetadataContext: md},
		}
	}
	headersResp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	unchanged := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	mutated := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}},
		BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(added)}},
	}}}}
	for _, tt := range []struct {
		name       string
		give       []*extprocv3.ProcessingRequest
		want       []*extprocv3.ProcessingResponse
		wantResult string
	}{
		{name: "chat stream without include_usage", give: request(meta, "/v1/chat/completions?x=1", body), want: []*extprocv3.ProcessingResponse{headersResp, mutated}, wantResult: "added"},
		{name: "Azure path", give: request(meta, "/openai/deployments/d/chat/completions?api-version=2024-10-21", body), want: []*extprocv3.ProcessingResponse{headersResp, mutated}, wantResult: "added"},
		{name: "Responses API is left alone", give: request(meta, "/v1/responses", body), want: []*extprocv3.ProcessingResponse{headersResp, unchanged}, wantResult: "unchanged"},
		{name: "not streaming", give: request(meta, "/v1/chat/completions", `{"stream":false}`), want: []*extprocv3.ProcessingResponse{headersResp, unchanged}, wantResult: "unchanged"},
		{name: "compressed body", give: request(meta, "/v1/chat/completions", body, "content-encoding", "gzip"), want: []*extprocv3.ProcessingResponse{headersResp, unchanged}, wantResult: "unchanged"},
		{name: "no ticket", give: request(nil, "/v1/chat/completions", body), want: []*extprocv3.ProcessingResponse{headersResp, unchanged}, wantResult: "no_ticket"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Options{})
			got := replying(t, h.client, tt.give...)
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("responses (-want +got):\n%s", diff)
			}
			m := testutil.Gather(t, h.reg)
			if m[`tollgate_extproc_request_bodies_total{result="`+tt.wantResult+`"}`] != 1 {
				t.Errorf("metrics = %v", m)
			}
			// The stream only saw the request: it settles nothing and
			// counts no stream result.
			for _, r := range []string{"usage", "no_usage", "no_ticket", "error"} {
				if v := m[`tollgate_extproc_streams_total{result="`+r+`"}`]; v != 0 {
					t.Errorf("streams_total{result=%q} = %v", r, v)
				}
			}
			if n := h.settler.count(); n != 0 {
				t.Errorf("Settle called %d times", n)
			}
		})
	}
}

// TestProcessReplyingResponse: a filter that sends the response outside
// observability mode gets an answer to every message, and the usage is
// settled as in observability mode.
func TestProcessReplyingResponse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Options{})
	msgs := observed(metadata(structpb.NewStringValue(testTicket)), hdrs(jsonHeaders), true, chunked(testdata(t, "chat.json"), 200)...)
	for _, m := range msgs {
		m.ObservabilityMode = false
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := h.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []*extprocv3.ProcessingResponse
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	want := []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}}
	for range msgs[1:] {
		want = append(want, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("responses (-want +got):\n%s", diff)
	}
	if u := h.settler.next(t).Usage; !u.Reported || u.Total != 29 || !u.Complete {
		t.Errorf("usage = %v", u)
	}
}

// TestNewRequires: a Settler and a Registerer are required, and a second
// Service cannot register on the same Registerer.
func TestNewRequires(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := New(nil, nil, reg, Options{}); err == nil {
		t.Error("New without a Settler succeeded")
	}
	if _, err := New(newFakeSettler(), nil, nil, Options{}); err == nil {
		t.Error("New without a Registerer succeeded")
	}
	if _, err := New(newFakeSettler(), nil, reg, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(newFakeSettler(), nil, reg, Options{}); err == nil {
		t.Error("a second New on the same Registerer succeeded")
	}
}
