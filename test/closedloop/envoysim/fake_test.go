package envoysim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

const (
	authzBootstrap = "../../../envoy/envoy-ext-authz.yaml"
	rlsBootstrap   = "../../../envoy/envoy.yaml"
	waitLimit      = 10 * time.Second
)

// fakeTollgate is a real gRPC server with the four services Envoy calls,
// recording what it receives.
type fakeTollgate struct {
	authv3.UnimplementedAuthorizationServer
	extprocv3.UnimplementedExternalProcessorServer
	alsv3.UnimplementedAccessLogServiceServer
	rlsv3.UnimplementedRateLimitServiceServer

	addr  string
	check func(*authv3.CheckRequest) (*authv3.CheckResponse, error)
	limit func(*rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every record
	checks   []*authv3.CheckRequest
	procs    [][]*extprocv3.ProcessingRequest // ended streams
	alsLogs  [][]*alsv3.StreamAccessLogsMessage
	rlsCalls []*rlsv3.RateLimitRequest
}

func startFake(t testing.TB) *fakeTollgate {
	t.Helper()
	f := &fakeTollgate{changed: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	authv3.RegisterAuthorizationServer(srv, f)
	extprocv3.RegisterExternalProcessorServer(srv, f)
	alsv3.RegisterAccessLogServiceServer(srv, f)
	rlsv3.RegisterRateLimitServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	f.addr = l.Addr().String()
	return f
}

func (f *fakeTollgate) record(fn func()) {
	f.mu.Lock()
	fn()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// waitFor waits until cond holds over the recorded calls.
func (f *fakeTollgate) waitFor(t testing.TB, what string, cond func(*fakeTollgate) bool) {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		ok, ch := cond(f), f.changed
		f.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no %s within %v", what, waitLimit)
		}
	}
}

func (f *fakeTollgate) Check(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	f.record(func() { f.checks = append(f.checks, r) })
	if f.check == nil {
		return okResponse(nil, nil), nil
	}
	return f.check(r)
}

// Process records a stream's messages and closes it on the body's end,
// as Tollgate does.
func (f *fakeTollgate) Process(srv grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	var msgs []*extprocv3.ProcessingRequest
	defer func() { f.record(func() { f.procs = append(f.procs, msgs) }) }()
	for {
		m, err := srv.Recv()
		if err != nil {
			return nil
		}
		msgs = append(msgs, m)
		if m.GetResponseBody().GetEndOfStream() || m.GetResponseTrailers() != nil || m.GetResponseHeaders().GetEndOfStream() {
			return nil
		}
	}
}

func (f *fakeTollgate) StreamAccessLogs(srv grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	var idx int
	f.record(func() { idx = len(f.alsLogs); f.alsLogs = append(f.alsLogs, nil) })
	for {
		m, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return srv.SendAndClose(&alsv3.StreamAccessLogsResponse{})
		}
		if err != nil {
			return err
		}
		f.record(func() { f.alsLogs[idx] = append(f.alsLogs[idx], m) })
	}
}

func (f *fakeTollgate) ShouldRateLimit(_ context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.record(func() { f.rlsCalls = append(f.rlsCalls, r) })
	if f.limit == nil {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	return f.limit(r), nil
}

func (f *fakeTollgate) entries() int {
	n := 0
	for _, s := range f.alsLogs {
		for _, m := range s {
			n += len(m.GetHttpLogs().GetLogEntry())
		}
	}
	return n
}

// clone copies recorded messages for comparison outside the lock.
func clone[M proto.Message](ms []M) []M {
	out := make([]M, len(ms))
	for i, m := range ms {
		out[i] = proto.Clone(m).(M)
	}
	return out
}

// upstreamFunc starts an httptest upstream.
func upstreamFunc(t testing.TB, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// variant writes a copy of a bootstrap with text replaced, for settings
// the shipped files do not have.
func variant(t testing.TB, path string, pairs ...string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	s := string(data)
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("%s has no %q", path, pairs[i])
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(out, []byte(s), 0o600); err != nil {
		t.Fatalf("write %s: %v", out, err)
	}
	return out
}

// newGateway builds a Gateway closed at the test's end.
func newGateway(t testing.TB, cfg Config) *Gateway {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// manualTick is a flush timer the test fires.
type manualTick chan time.Time

func (m manualTick) tick(time.Duration) (<-chan time.Time, func()) { return m, func() {} }
