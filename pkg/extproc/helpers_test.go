package extproc

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/test/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor bounds every wait on the server in these tests; nothing waits
// this long unless something is broken.
const waitFor = 10 * time.Second

const testTicket = "v2.ticket-bytes.signature"

// settled is one Settle call.
type settled struct {
	Ticket string
	Usage  Usage
}

// fakeSettler records Settle calls and signals each on calls.
type fakeSettler struct {
	mu    sync.Mutex
	all   []settled
	calls chan settled
	// block, if set, is waited on inside Settle (with the context).
	block chan struct{}
	// ctxErr is the context's error seen when Settle returned.
	ctxErr error
}

func newFakeSettler() *fakeSettler { return &fakeSettler{calls: make(chan settled, 16)} }

func (f *fakeSettler) Settle(ctx context.Context, ticket string, u Usage) {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
		}
	}
	f.mu.Lock()
	f.all = append(f.all, settled{ticket, u})
	f.ctxErr = ctx.Err()
	f.mu.Unlock()
	f.calls <- settled{ticket, u}
}

// next waits for the next Settle call.
func (f *fakeSettler) next(t testing.TB) settled {
	t.Helper()
	select {
	case s := <-f.calls:
		return s
	case <-time.After(waitFor):
		t.Fatal("no Settle call")
		return settled{}
	}
}

func (f *fakeSettler) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.all)
}

// harness is a Service on a loopback gRPC server with a client.
type harness struct {
	svc     *Service
	settler *fakeSettler
	reg     *prometheus.Registry
	client  extprocv3.ExternalProcessorClient
}

func newHarness(t testing.TB, opts Options) *harness {
	t.Helper()
	f := newFakeSettler()
	h := newHarnessWith(t, f, opts)
	h.settler = f
	return h
}

// newHarnessWith serves a Service with settler s.
func newHarnessWith(t testing.TB, s Settler, opts Options) *harness {
	t.Helper()
	h := &harness{reg: prometheus.NewRegistry()}
	svc, err := New(s, nil, h.reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	h.svc = svc
	h.client = extprocv3.NewExternalProcessorClient(testutil.Serve(t, svc))
	return h
}

// metadata is the ext_authz dynamic metadata with the ticket.
func metadata(ticket *structpb.Value) *corev3.Metadata {
	fields := map[string]*structpb.Value{"tenant": structpb.NewStringValue("acme")}
	if ticket != nil {
		fields[DefaultTicketField] = ticket
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		DefaultNamespace: {Fields: fields},
	}}
}

// headers builds an HttpHeaders with raw values from name, value pairs.
func headers(eos bool, kv ...string) *extprocv3.HttpHeaders {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}
}

// observed builds the messages Envoy sends in observability mode for a
// response with these headers and body chunks; eos ends the body.
func observed(meta *corev3.Metadata, h *extprocv3.HttpHeaders, eos bool, chunks ...[]byte) []*extprocv3.ProcessingRequest {
	msgs := []*extprocv3.ProcessingRequest{{
		Request:           &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h},
		MetadataContext:   meta,
		ObservabilityMode: true,
	}}
	for i, c := range chunks {
		msgs = append(msgs, &extprocv3.ProcessingRequest{
			Request:           &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: c, EndOfStream: eos && i == len(chunks)-1}},
			MetadataContext:   meta,
			ObservabilityMode: true,
		})
	}
	return msgs
}

// play sends msgs on one stream as Envoy does in observability mode
// (never waiting for an answer), then half-closes when closeSend, and
// reads until the server ends the stream. It returns what the server
// sent (nothing, in observability mode) and how the stream ended.
func play(t testing.TB, c extprocv3.ExternalProcessorClient, closeSend bool, msgs ...*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			// The server may have closed the stream already (no
			// ticket); Recv below reports how it ended.
			break
		}
	}
	if closeSend {
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}
	var got []*extprocv3.ProcessingResponse
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, r)
	}
}

// chunked cuts b into n-byte pieces.
func chunked(b []byte, n int) [][]byte {
	var out [][]byte
	for i := 0; i < len(b); i += n {
		out = append(out, b[i:min(i+n, len(b))])
	}
	return out
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
