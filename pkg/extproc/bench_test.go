package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
)

// chatChunk is one realistic chat.completion.chunk event.
func chatChunk(content string) string {
	return `data: {"id":"chatcmpl-AZ9tY0n7","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_831e067d82","choices":[{"index":0,"delta":{"content":"` + content + `"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
}

// tenChunks is an OpenAI chat stream with include_usage, one event per
// body chunk: eight text chunks, the usage chunk and [DONE].
func tenChunks() [][]byte {
	var out [][]byte
	for _, w := range strings.Fields("The quick brown fox jumps over the dog") {
		out = append(out, []byte(chatChunk(w+" ")))
	}
	out = append(out,
		[]byte(`data: {"id":"chatcmpl-AZ9tY0n7","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_831e067d82","choices":[],"usage":{"prompt_tokens":25,"completion_tokens":8,"total_tokens":33,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return out
}

// BenchmarkProcessSSE is one 10-chunk SSE stream through Process over a
// real loopback gRPC connection, as Envoy sends it in observability mode:
// the response headers, ten body chunks, then the server settles and
// closes. B/op and allocs/op count both ends of the connection.
func BenchmarkProcessSSE(b *testing.B) {
	var settles atomic.Int64
	h := newHarnessWith(b, settleFunc(func(context.Context, string, Usage) { settles.Add(1) }), Options{})
	msgs := observed(metadata(structpb.NewStringValue(testTicket)), hdrs(sseHeaders), true, tenChunks()...)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s, err := h.client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if err := s.Send(m); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			b.Fatalf("Recv = %v, want EOF", err)
		}
	}
	b.StopTimer()
	if n := settles.Load(); n != int64(b.N) {
		b.Fatalf("%d Settle calls for %d streams", n, b.N)
	}
}

// settleFunc is a Settler from a function.
type settleFunc func(context.Context, string, Usage)

func (f settleFunc) Settle(ctx context.Context, ticket string, u Usage) { f(ctx, ticket, u) }

// BenchmarkHandleSSE is the same stream through the handler's own work,
// without gRPC: what Tollgate adds per stream beyond the transport.
func BenchmarkHandleSSE(b *testing.B) {
	svc, settler := benchService(b)
	msgs := observed(metadata(structpb.NewStringValue(testTicket)), hdrs(sseHeaders), true, tenChunks()...)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		st := stream{svc: svc}
		st.start(msgs[0])
		for _, m := range msgs {
			st.handle(m, false)
		}
		st.end(ctx, nil)
	}
	b.StopTimer()
	if settler.n != b.N || !settler.last.Reported || settler.last.Total != 33 || settler.last.StreamedChars != 39 {
		b.Fatalf("%d settles, last %v", settler.n, settler.last)
	}
}

// countingSettler counts calls without locking, for a one-goroutine
// benchmark.
type countingSettler struct {
	n    int
	last Usage
}

func (c *countingSettler) Settle(_ context.Context, _ string, u Usage) { c.n, c.last = c.n+1, u }

func benchService(b *testing.B) (*Service, *countingSettler) {
	b.Helper()
	c := &countingSettler{}
	svc, err := New(c, nil, prometheus.NewRegistry(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	return svc, c
}

// bigStream is n bytes (or a little more) of chat stream in chunk-sized
// pieces, ending with the usage chunk.
func bigStream(n, chunk int) [][]byte {
	ev := chatChunk("token ")
	body := bytes.Repeat([]byte(ev), n/len(ev)+1)
	body = append(body, tenChunks()[8]...)
	return chunked(body, chunk)
}

// BenchmarkReader10MB reads a 10 MB stream in 16 KiB chunks: the reader
// keeps its fixed state and allocates nothing per chunk, so B/op does not
// grow with the stream.
func BenchmarkReader10MB(b *testing.B) {
	chunks := bigStream(10<<20, 16<<10)
	total := 0
	for _, c := range chunks {
		total += len(c)
	}
	b.SetBytes(int64(total))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r := newUsageReader(kindSSE)
		for _, c := range chunks {
			r.write(c)
		}
		r.finish()
		if !r.result().Reported {
			b.Fatal("no usage")
		}
	}
}

// BenchmarkReaderGzip10MB is the same stream gzip-encoded, through the
// decoder goroutine.
func BenchmarkReaderGzip10MB(b *testing.B) {
	plain := bytes.Join(bigStream(10<<20, 16<<10), nil)
	chunks := chunked(gzipped(b, plain), 16<<10)
	b.SetBytes(int64(len(plain)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r := newUsageReader(kindSSE)
		g := startGunzip(r, DefaultMaxDecodedBytes)
		for _, c := range chunks {
			if !g.write(c) {
				b.Fatal("decoder stopped")
			}
		}
		if err := g.close(); err != nil {
			b.Fatal(err)
		}
		r.finish()
		if !r.result().Reported {
			b.Fatal("no usage")
		}
	}
}

// requestBody2KB is a 2 KB streaming chat request without include_usage.
func requestBody2KB() []byte {
	msg := strings.Repeat("Summarise the following paragraph in one sentence. ", 34)
	body := fmt.Sprintf(`{"model":"gpt-4o","stream":true,"temperature":0.2,"max_tokens":256,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}]}`, msg)
	return []byte(body)
}

// BenchmarkWithIncludeUsage2KB is the request-phase edit of a 2 KB body.
func BenchmarkWithIncludeUsage2KB(b *testing.B) {
	body := requestBody2KB()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for range b.N {
		if _, ok := withIncludeUsage(body); !ok {
			b.Fatal("unchanged")
		}
	}
}

// BenchmarkRequestPhase2KB is the latency the request-phase filter adds
// to one request: the request headers and the 2 KB body, each answered
// over a real loopback gRPC stream, as Envoy waits for them.
func BenchmarkRequestPhase2KB(b *testing.B) {
	h := newHarnessWith(b, settleFunc(func(context.Context, string, Usage) {}), Options{})
	meta := metadata(structpb.NewStringValue(testTicket))
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(false, ":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json")}, MetadataContext: meta},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: requestBody2KB(), EndOfStream: true}}, MetadataContext: meta},
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s, err := h.client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if err := s.Send(m); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.CloseSend(); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			b.Fatalf("Recv = %v, want EOF", err)
		}
	}
}

// TestReaderMemoryIsBounded shows the memory bound: the reader's state is
// a fixed struct, and writing a 10 MB stream into it, or into the gzip
// decoder feeding it, allocates nothing per chunk. Not parallel:
// AllocsPerRun counts every goroutine's allocations.
func TestReaderMemoryIsBounded(t *testing.T) {
	size := unsafe.Sizeof(usageReader{})
	t.Logf("usageReader state: %d bytes", size)
	if size > 4<<10 {
		t.Errorf("usageReader is %d bytes", size)
	}
	chunks := bigStream(10<<20, 16<<10)
	r := newUsageReader(kindSSE)
	i := 0
	if n := testing.AllocsPerRun(len(chunks)-1, func() { r.write(chunks[i%len(chunks)]); i++ }); n != 0 {
		t.Errorf("identity: %v allocations per 16 KiB chunk", n)
	}
	plain := bytes.Join(chunks, nil)
	gz := chunked(gzipped(t, plain), 16<<10)
	gr := newUsageReader(kindSSE)
	g := startGunzip(gr, DefaultMaxDecodedBytes)
	if !g.write(gz[0]) { // the decoder's buffers are made on the first read
		t.Fatal("decoder stopped")
	}
	j := 1
	if n := testing.AllocsPerRun(len(gz)-2, func() { g.write(gz[j]); j++ }); n != 0 {
		t.Errorf("gzip: %v allocations per 16 KiB compressed chunk", n)
	}
	for ; j < len(gz); j++ {
		g.write(gz[j])
	}
	if err := g.close(); err != nil {
		t.Fatal(err)
	}
	gr.finish()
	if u := gr.result(); !u.Reported || u.Total != 33 {
		t.Errorf("gzip usage = %v", u)
	}
}
