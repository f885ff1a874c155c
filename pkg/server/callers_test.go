package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const alsService = "envoy.service.accesslog.v3.AccessLogService"

// fakeALS takes access log streams and answers each once it ends.
type fakeALS struct {
	alsv3.UnimplementedAccessLogServiceServer
}

func (f *fakeALS) Register(r grpc.ServiceRegistrar) { alsv3.RegisterAccessLogServiceServer(r, f) }

func (f *fakeALS) StreamAccessLogs(s alsv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return s.SendAndClose(&alsv3.StreamAccessLogsResponse{})
			}
			return err
		}
	}
}

// streamALS sends one access log message on a new connection and waits
// for the server's answer.
func streamALS(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		return err
	}
	msg := &alsv3.StreamAccessLogsMessage{Identifier: &alsv3.StreamAccessLogsMessage_Identifier{LogName: "tollgate"}}
	// A refused stream may already be closed when the message is sent:
	// the answer below carries the status either way.
	if err := stream.Send(msg); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.CloseAndRecv()
	return err
}

// checkHealth calls the health service on a new connection.
func checkHealth(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func mustCallers(tb testing.TB, allow map[string][]string) *Callers {
	tb.Helper()
	c, err := NewCallers(allow)
	if err != nil {
		tb.Fatalf("NewCallers: %v", err)
	}
	return c
}

// TestCallers serves RLS, the access log service and health over mutual
// TLS with the access log restricted, and calls each with certificates
// that differ in their URI SANs.
func TestCallers(t *testing.T) {
	t.Parallel()
	const (
		gateway = "spiffe://cluster.local/ns/gateway/sa/envoy"
		sleep   = "spiffe://cluster.local/ns/default/sa/sleep"
	)
	serverCA, clientCA, rogueCA := newCA(t, "server CA"), newCA(t, "client CA"), newCA(t, "rogue CA")
	d := newTLSDir(t, true)
	d.serve(t, serverCA.issue(t, "tollgate", false), clientCA)
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	r := start(t, Config{
		Services:   []Service{&fakeRLS{handle: okHandler}, &fakeALS{}},
		TLS:        &d.opts,
		Registerer: reg,
		Logger:     zap.New(core),
		Callers: mustCallers(t, map[string][]string{
			alsService: {gateway, "spiffe://cluster.local/ns/gateways/sa/*"},
		}),
	})

	rogue := rogueCA.issue(t, "envoy", true, gateway)
	roots := x509.NewCertPool()
	roots.AddCert(serverCA.cert)
	// A client that sends its certificate even when the server's list of
	// CAs does not name its issuer, as crypto/tls would not.
	insistent := credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &rogue.pair, nil }})
	tests := []struct {
		name string
		give credentials.TransportCredentials
		// wantALS and wantOpen are the codes of the access log stream and
		// of the open services (RLS, health).
		wantALS, wantOpen codes.Code
	}{
		{name: "listed SAN", give: clientTLS(serverCA, clientCA.issue(t, "envoy", true, gateway)), wantALS: codes.OK, wantOpen: codes.OK},
		{name: "SAN under a listed prefix", give: clientTLS(serverCA, clientCA.issue(t, "gw", true, "spiffe://cluster.local/ns/gateways/sa/ingress")), wantALS: codes.OK, wantOpen: codes.OK},
		{name: "a listed SAN beside another", give: clientTLS(serverCA, clientCA.issue(t, "envoy", true, sleep, gateway)), wantALS: codes.OK, wantOpen: codes.OK},
		{name: "SAN not listed", give: clientTLS(serverCA, clientCA.issue(t, "sleep", true, sleep)), wantALS: codes.PermissionDenied, wantOpen: codes.OK},
		{name: "listed SAN with a suffix", give: clientTLS(serverCA, clientCA.issue(t, "envoy", true, gateway+"-evil")), wantALS: codes.PermissionDenied, wantOpen: codes.OK},
		{name: "listed SAN as a prefix", give: clientTLS(serverCA, clientCA.issue(t, "envoy", true, gateway+"/x")), wantALS: codes.PermissionDenied, wantOpen: codes.OK},
		{name: "beside the listed prefix", give: clientTLS(serverCA, clientCA.issue(t, "gw", true, "spiffe://cluster.local/ns/gateways-evil/sa/ingress")), wantALS: codes.PermissionDenied, wantOpen: codes.OK},
		{name: "listed prefix in another trust domain", give: clientTLS(serverCA, clientCA.issue(t, "gw", true, "spiffe://evil.local/ns/gateways/sa/ingress")), wantALS: codes.PermissionDenied, wantOpen: codes.OK},
		{name: "no URI SAN, the SAN as common name", give: clientTLS(serverCA, clientCA.issue(t, gateway, true)), wantALS: codes.PermissionDenied, wantOpen: codes.OK},
		// The handshake refuses these before any service is chosen.
		{name: "listed SAN from another CA", give: insistent, wantALS: codes.Unavailable, wantOpen: codes.Unavailable},
		{name: "no certificate", give: clientTLS(serverCA, nil), wantALS: codes.Unavailable, wantOpen: codes.Unavailable},
	}
	t.Run("calls", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				err := streamALS(t, r.grpcAddr, tt.give)
				if got := status.Code(err); got != tt.wantALS {
					t.Errorf("access log stream: %v, want code %v", err, tt.wantALS)
				}
				if status.Code(err) == codes.PermissionDenied {
					// The answer names the service, and nothing of the certificate.
					msg := status.Convert(err).Message()
					if !strings.Contains(msg, alsService) || strings.Contains(msg, "spiffe") {
						t.Errorf("refusal message %q: want the service named and no SAN", msg)
					}
				}
				_, err = callRLS(t, r.grpcAddr, tt.give)
				if got := status.Code(err); got != tt.wantOpen {
					t.Errorf("ShouldRateLimit: %v, want code %v", err, tt.wantOpen)
				}
				if got := status.Code(checkHealth(t, r.grpcAddr, tt.give)); got != tt.wantOpen {
					t.Errorf("health check: code %v, want %v", got, tt.wantOpen)
				}
			})
		}
	})

	var wantDenied float64
	for _, tt := range tests {
		if tt.wantALS == codes.PermissionDenied {
			wantDenied++
		}
	}
	if got, _ := metric(t, reg, "tollgate_grpc_caller_denied_total", map[string]string{"service": alsService}); got != wantDenied {
		t.Errorf("tollgate_grpc_caller_denied_total{service=%q} = %v, want %v", alsService, got, wantDenied)
	}
	// Every refusal within callerLogEvery of the first is one line; the
	// SANs are in it.
	denied := logs.FilterMessage("caller not allowed").All()
	if len(denied) == 0 {
		t.Fatal("no refusal logged")
	}
	if e := denied[0]; e.Level != zapcore.WarnLevel || e.ContextMap()["service"] != alsService {
		t.Errorf("refusal logged as %v %v, want warn with the service", e.Level, e.ContextMap())
	}
}

func TestCallersListedHealth(t *testing.T) {
	t.Parallel()
	serverCA, clientCA := newCA(t, "server CA"), newCA(t, "client CA")
	d := newTLSDir(t, true)
	d.serve(t, serverCA.issue(t, "tollgate", false), clientCA)
	r := start(t, Config{
		Services: []Service{&fakeRLS{handle: okHandler}},
		TLS:      &d.opts,
		Callers:  mustCallers(t, map[string][]string{"grpc.health.v1.Health": {"spiffe://cluster.local/ns/kube/sa/prober"}}),
	})
	prober := clientTLS(serverCA, clientCA.issue(t, "prober", true, "spiffe://cluster.local/ns/kube/sa/prober"))
	other := clientTLS(serverCA, clientCA.issue(t, "other", true, "spiffe://cluster.local/ns/kube/sa/other"))
	if err := checkHealth(t, r.grpcAddr, prober); err != nil {
		t.Errorf("the listed prober: %v", err)
	}
	if err := checkHealth(t, r.grpcAddr, other); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another client: %v, want PermissionDenied", err)
	}
	if _, err := callRLS(t, r.grpcAddr, other); err != nil {
		t.Errorf("another client's ShouldRateLimit: %v", err)
	}
}

// tlsPeer is a context with a peer that has chain as its verified chain,
// or only presented is presented.
func tlsPeer(verified, presented *x509.Certificate) context.Context {
	st := tls.ConnectionState{}
	if verified != nil {
		st.VerifiedChains = [][]*x509.Certificate{{verified}}
		st.PeerCertificates = []*x509.Certificate{verified}
	}
	if presented != nil {
		st.PeerCertificates = []*x509.Certificate{presented}
	}
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000},
		AuthInfo: credentials.TLSInfo{State: st},
	})
}

func TestCallerGuardCheck(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "client CA")
	gw := ca.issue(t, "gw", true, "spiffe://td/ns/gw/sa/envoy").pair.Leaf
	other := ca.issue(t, "other", true, "spiffe://td/ns/app/sa/x").pair.Leaf
	g := newCallerGuard(mustCallers(t, map[string][]string{alsService: {"spiffe://td/ns/gw/sa/envoy"}}), zap.NewNop())
	const method = "/" + alsService + "/StreamAccessLogs"
	tests := []struct {
		name   string
		ctx    context.Context
		method string
		want   codes.Code
	}{
		{name: "verified listed SAN", ctx: tlsPeer(gw, nil), method: method, want: codes.OK},
		{name: "verified other SAN", ctx: tlsPeer(other, nil), method: method, want: codes.PermissionDenied},
		// What the peer presented counts only once the handshake verified it.
		{name: "listed SAN presented, not verified", ctx: tlsPeer(nil, gw), method: method, want: codes.PermissionDenied},
		{name: "no peer", ctx: context.Background(), method: method, want: codes.PermissionDenied},
		{name: "plaintext peer", ctx: peer.NewContext(context.Background(), &peer.Peer{}), method: method, want: codes.PermissionDenied},
		{name: "open service", ctx: tlsPeer(other, nil), method: shouldRateLimit, want: codes.OK},
		{name: "open service without a peer", ctx: context.Background(), method: shouldRateLimit, want: codes.OK},
		// grpc-go refuses a name without a method before any interceptor;
		// were one to come, it is read as the service, and refused.
		{name: "service name alone", ctx: context.Background(), method: "/" + alsService, want: codes.PermissionDenied},
		{name: "method of a longer name", ctx: context.Background(), method: "/" + alsService + "X/StreamAccessLogs", want: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := status.Code(g.check(tt.ctx, tt.method)); got != tt.want {
				t.Errorf("check = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCallerGuardLogLimit: one line per service per callerLogEvery, the
// next one saying how many were left out.
func TestCallerGuardLogLimit(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "client CA")
	other := ca.issue(t, "other", true, "spiffe://td/ns/app/sa/x").pair.Leaf
	core, logs := observer.New(zap.InfoLevel)
	const rls = "envoy.service.ratelimit.v3.RateLimitService"
	g := newCallerGuard(mustCallers(t, map[string][]string{alsService: {"spiffe://td/ns/gw/sa/envoy"}, rls: {"spiffe://td/ns/gw/sa/envoy"}}), zap.New(core))
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	g.now = clock.Now
	ctx := tlsPeer(other, nil)
	deny := func(service string) {
		t.Helper()
		if err := g.check(ctx, "/"+service+"/M"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("check: %v, want PermissionDenied", err)
		}
	}
	deny(alsService)
	clock.Add(time.Second)
	deny(alsService)
	deny(rls) // another service has its own budget
	clock.Add(callerLogEvery - time.Second - time.Nanosecond)
	deny(alsService)
	clock.Add(time.Nanosecond)
	deny(alsService)

	var got []string
	for _, e := range logs.FilterMessage("caller not allowed").All() {
		m := e.ContextMap()
		got = append(got, fmt.Sprintf("%v suppressed=%v", m["service"], m["suppressed"]))
		if sans, _ := m["uri_sans"].([]any); len(sans) != 1 || sans[0] != "spiffe://td/ns/app/sa/x" {
			t.Errorf("uri_sans = %v, want the caller's SAN", m["uri_sans"])
		}
		if m["peer"] != "127.0.0.1:40000" {
			t.Errorf("peer = %v", m["peer"])
		}
	}
	want := []string{alsService + " suppressed=0", rls + " suppressed=0", alsService + " suppressed=2"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNewCallers(t *testing.T) {
	t.Parallel()
	const gw = "spiffe://cluster.local/ns/gw/sa/envoy"
	tests := []struct {
		name    string
		give    map[string][]string
		wantErr string
	}{
		{name: "exact", give: map[string][]string{alsService: {gw}}},
		{name: "prefix", give: map[string][]string{alsService: {"spiffe://cluster.local/ns/gw/sa/*"}}},
		{name: "not SPIFFE", give: map[string][]string{alsService: {"urn:example:gateway"}}},
		{name: "nothing", give: nil, wantErr: "callers: no service listed"},
		{name: "no SAN", give: map[string][]string{alsService: {}}, wantErr: "callers: " + alsService + ": no SAN listed, so nothing could call it"},
		{name: "empty service", give: map[string][]string{"": {gw}}, wantErr: `callers: service "": want a gRPC service name`},
		{name: "method as service", give: map[string][]string{alsService + "/StreamAccessLogs": {gw}}, wantErr: "want a gRPC service name"},
		{name: "empty SAN", give: map[string][]string{alsService: {""}}, wantErr: "an empty SAN"},
		{name: "twice", give: map[string][]string{alsService: {gw, gw}}, wantErr: `"` + gw + `" is listed twice`},
		{name: "prefix twice", give: map[string][]string{alsService: {"spiffe://td/a/*", "spiffe://td/a/*"}}, wantErr: "listed twice"},
		{name: "space", give: map[string][]string{alsService: {gw + " "}}, wantErr: "holds a space or control character"},
		{name: "lone star", give: map[string][]string{alsService: {"*"}}, wantErr: "a prefix ends in /*"},
		{name: "prefix inside a segment", give: map[string][]string{alsService: {"spiffe://cluster.local/ns/gw/sa/envoy*"}}, wantErr: "a prefix ends in /*"},
		{name: "star inside", give: map[string][]string{alsService: {"spiffe://cluster.local/ns/*/sa/envoy"}}, wantErr: "* is allowed only as a trailing /*"},
		{name: "scheme only prefix", give: map[string][]string{alsService: {"spiffe:///*"}}, wantErr: "a prefix must name an authority"},
		{name: "relative", give: map[string][]string{alsService: {"cluster.local/ns/gw/sa/envoy"}}, wantErr: "is not an absolute URI"},
		{name: "not a URI", give: map[string][]string{alsService: {"spiffe://cluster.local/%zz"}}, wantErr: "is not a URI"},
		{name: "not canonical", give: map[string][]string{alsService: {"SPIFFE://cluster.local/ns/gw/sa/envoy"}}, wantErr: `write it as "` + gw + `"`},
		{name: "not canonical prefix", give: map[string][]string{alsService: {"SPIFFE://cluster.local/ns/gw/*"}}, wantErr: `write it as "spiffe://cluster.local/ns/gw/*"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewCallers(tt.give)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("NewCallers: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("NewCallers error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCallersNeedMutualTLS(t *testing.T) {
	t.Parallel()
	serverCA := newCA(t, "server CA")
	d := newTLSDir(t, false)
	d.serve(t, serverCA.issue(t, "tollgate", false), nil)
	callers := mustCallers(t, map[string][]string{alsService: {"spiffe://td/ns/gw/sa/envoy"}})
	for _, tt := range []struct {
		name string
		give *TLS
	}{
		{name: "plaintext"},
		{name: "TLS without client CAs", give: &d.opts},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(Config{Services: []Service{&fakeRLS{handle: okHandler}}, Gatherer: prometheus.NewRegistry(), TLS: tt.give, Callers: callers})
			if want := "server: a caller allow-list needs mutual TLS"; err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("New error = %v, want %q...", err, want)
			}
		})
	}
}

// BenchmarkCallerGuard is the cost the guard adds to a call: to an open
// service (every RLS and Check call, when only the outcome APIs are
// restricted) and to a restricted one.
func BenchmarkCallerGuard(b *testing.B) {
	ca := newCA(b, "client CA")
	gw := ca.issue(b, "gw", true, "spiffe://cluster.local/ns/gw/sa/envoy").pair.Leaf
	g := newCallerGuard(mustCallers(b, map[string][]string{alsService: {"spiffe://cluster.local/ns/gw/sa/envoy"}}), zap.NewNop())
	ctx := tlsPeer(gw, nil)
	for _, bb := range []struct{ name, method string }{
		{name: "open", method: shouldRateLimit},
		{name: "restricted", method: "/" + alsService + "/StreamAccessLogs"},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := g.check(ctx, bb.method); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
