package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// ca is a test certificate authority.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// issued is a certificate and its key, in PEM and as tls wants them.
type issued struct {
	certPEM, keyPEM []byte
	pair            tls.Certificate
}

var serial struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serial.Lock()
	defer serial.Unlock()
	serial.n++
	return big.NewInt(serial.n)
}

func newCA(tb testing.TB, name string) *ca {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &ca{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a server certificate for 127.0.0.1 and localhost, or a
// client certificate, with uris as its URI SANs.
func (c *ca) issue(tb testing.TB, name string, client bool, uris ...string) *issued {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	if client {
		tmpl.ExtKeyUsage, tmpl.IPAddresses, tmpl.DNSNames = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			tb.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	is := &issued{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	is.pair, err = tls.X509KeyPair(is.certPEM, is.keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return is
}

// tlsDir holds the server's files as the TLS options name them.
type tlsDir struct {
	dir  string
	opts TLS
	// stamp is the modification time of the next write: each is later
	// than the last, however coarse the filesystem's clock.
	stamp time.Time
}

func newTLSDir(tb testing.TB, mutual bool) *tlsDir {
	d := &tlsDir{dir: tb.TempDir(), stamp: time.Now()}
	d.opts = TLS{CertFile: filepath.Join(d.dir, "tls.crt"), KeyFile: filepath.Join(d.dir, "tls.key")}
	if mutual {
		d.opts.ClientCAFile = filepath.Join(d.dir, "ca.crt")
	}
	return d
}

// write replaces the named files (tls.crt, tls.key, ca.crt).
func (d *tlsDir) write(tb testing.TB, files map[string][]byte) {
	tb.Helper()
	d.stamp = d.stamp.Add(time.Minute)
	for name, data := range files {
		p := filepath.Join(d.dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chtimes(p, d.stamp, d.stamp); err != nil {
			tb.Fatal(err)
		}
	}
}

func (d *tlsDir) serve(tb testing.TB, server *issued, clientCA *ca) {
	files := map[string][]byte{"tls.crt": server.certPEM, "tls.key": server.keyPEM}
	if clientCA != nil {
		files["ca.crt"] = clientCA.pem
	}
	d.write(tb, files)
}

// fakeClock is the time tlsFiles sees.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// startTLS serves an OK-answering RLS over opts on loopback until the test
// ends, with clock as the time the TLS files are checked by.
func startTLS(t *testing.T, opts TLS, clock *fakeClock, log *zap.Logger) string {
	t.Helper()
	if log == nil {
		log = zap.NewNop()
	}
	srv, err := New(Config{
		Services: []Service{&fakeRLS{handle: okHandler}},
		Gatherer: prometheus.NewRegistry(),
		Logger:   log,
		TLS:      &opts,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if clock != nil {
		srv.tls.now = clock.Now
		srv.tls.checked = clock.Now()
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, gl, al) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(wait):
			t.Error("Serve did not return after cancel")
		}
	})
	return gl.Addr().String()
}

// callRLS makes one ShouldRateLimit call on a new connection and returns
// the serial number of the certificate the server presented.
func callRLS(t *testing.T, addr string, creds credentials.TransportCredentials) (string, error) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var p peer.Peer
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"}, grpc.Peer(&p))
	if err != nil {
		return "", err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		t.Fatalf("the call's peer has no TLS state: %#v", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber.String(), nil
}

// clientTLS trusts roots and presents cert, if any.
func clientTLS(roots *ca, cert *issued) credentials.TransportCredentials {
	pool := x509.NewCertPool()
	pool.AddCert(roots.cert)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.Certificates = []tls.Certificate{cert.pair}
	}
	return credentials.NewTLS(c)
}

func TestTLS(t *testing.T) {
	t.Parallel()
	serverCA, clientCA, rogueCA := newCA(t, "server CA"), newCA(t, "client CA"), newCA(t, "rogue CA")
	serverCert := serverCA.issue(t, "tollgate", false)
	envoy := clientCA.issue(t, "envoy", true)
	rogue := rogueCA.issue(t, "envoy", true)

	mtls := newTLSDir(t, true)
	mtls.serve(t, serverCert, clientCA)
	mtlsAddr := startTLS(t, mtls.opts, nil, nil)
	plain := newTLSDir(t, false)
	plain.serve(t, serverCert, nil)
	tlsAddr := startTLS(t, plain.opts, nil, nil)

	roots := x509.NewCertPool()
	roots.AddCert(serverCA.cert)
	old := &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11, RootCAs: roots, Certificates: []tls.Certificate{envoy.pair}}
	// A client that sends its certificate even when the server's list of
	// CAs does not name its issuer, as crypto/tls would not.
	insistent := &tls.Config{RootCAs: roots, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &rogue.pair, nil
	}}
	tests := []struct {
		name   string
		addr   string
		give   credentials.TransportCredentials
		wantOK bool
	}{
		{name: "mTLS with a client certificate", addr: mtlsAddr, give: clientTLS(serverCA, envoy), wantOK: true},
		{name: "mTLS without a client certificate", addr: mtlsAddr, give: clientTLS(serverCA, nil)},
		{name: "mTLS with a certificate from another CA", addr: mtlsAddr, give: credentials.NewTLS(insistent)},
		{name: "mTLS with plaintext", addr: mtlsAddr, give: insecure.NewCredentials()},
		{name: "mTLS with TLS 1.1", addr: mtlsAddr, give: credentials.NewTLS(old)},
		{name: "TLS without a client certificate", addr: tlsAddr, give: clientTLS(serverCA, nil), wantOK: true},
		{name: "TLS with plaintext", addr: tlsAddr, give: insecure.NewCredentials()},
		{name: "TLS with a server it does not trust", addr: tlsAddr, give: clientTLS(rogueCA, envoy)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := callRLS(t, tt.addr, tt.give)
			if err != nil {
				t.Logf("refused: %v", err) // -v shows why
			}
			if tt.wantOK {
				if err != nil {
					t.Errorf("call: %v", err)
				}
				return
			}
			if status.Code(err) != codes.Unavailable {
				t.Errorf("call error = %v, want code Unavailable", err)
			}
		})
	}
}

func TestTLSRotation(t *testing.T) {
	t.Parallel()
	serverCA, clientCA, nextCA := newCA(t, "server CA"), newCA(t, "client CA"), newCA(t, "next client CA")
	first, second := serverCA.issue(t, "tollgate", false), serverCA.issue(t, "tollgate", false)
	envoy, nextEnvoy := clientCA.issue(t, "envoy", true), nextCA.issue(t, "envoy", true)

	d := newTLSDir(t, true)
	d.serve(t, first, clientCA)
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	core, logs := observer.New(zap.InfoLevel)
	addr := startTLS(t, d.opts, clock, zap.New(core))

	serves := func(want *issued, client *issued) {
		t.Helper()
		got, err := callRLS(t, addr, clientTLS(serverCA, client))
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		if w := want.pair.Leaf.SerialNumber.String(); got != w {
			t.Errorf("server presented serial %s, want %s", got, w)
		}
	}
	serves(first, envoy)

	// A rotation: the certificate and the client CA bundle change together.
	d.serve(t, second, nextCA)
	clock.Add(tlsCheckEvery - time.Millisecond)
	serves(first, envoy) // checked at most every tlsCheckEvery
	clock.Add(time.Millisecond)
	serves(second, nextEnvoy)
	if _, err := callRLS(t, addr, clientTLS(serverCA, envoy)); status.Code(err) != codes.Unavailable {
		t.Errorf("a client of the replaced CA: error = %v, want code Unavailable", err)
	}
	if n := logs.FilterMessage("tls files reloaded").Len(); n != 1 {
		t.Errorf("%d reloads logged, want 1", n)
	}

	// A rotation caught halfway, the key not yet written: the previous
	// certificate keeps serving, and the next check takes the new one.
	third := serverCA.issue(t, "tollgate", false)
	d.write(t, map[string][]byte{"tls.crt": third.certPEM})
	clock.Add(tlsCheckEvery)
	serves(second, nextEnvoy)
	if n := logs.FilterMessage("tls files changed and do not load; the previous certificate keeps serving").Len(); n != 1 {
		t.Errorf("%d failed reloads logged, want 1", n)
	}
	d.write(t, map[string][]byte{"tls.key": third.keyPEM})
	clock.Add(tlsCheckEvery)
	serves(third, nextEnvoy)

	// Removed files: the certificate in memory keeps serving.
	if err := os.Remove(d.opts.CertFile); err != nil {
		t.Fatal(err)
	}
	clock.Add(tlsCheckEvery)
	serves(third, nextEnvoy)
}

func TestTLSErrors(t *testing.T) {
	t.Parallel()
	serverCA := newCA(t, "server CA")
	a, b := serverCA.issue(t, "a", false), serverCA.issue(t, "b", false)
	d := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(d, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, otherKey := write("tls.crt", a.certPEM), write("tls.key", a.keyPEM), write("other.key", b.keyPEM)
	notPEM := write("ca.crt", []byte("not PEM"))
	missing := filepath.Join(d, "missing.crt")
	tests := []struct {
		name string
		give TLS
		want string
	}{
		{name: "no key", give: TLS{CertFile: cert}, want: "server: tls: a certificate file and a key file are both required"},
		{name: "no certificate", give: TLS{KeyFile: key, ClientCAFile: notPEM}, want: "server: tls: a certificate file and a key file are both required"},
		{name: "missing certificate", give: TLS{CertFile: missing, KeyFile: key}, want: "server: tls: stat " + missing + ": no such file or directory"},
		{name: "missing client CAs", give: TLS{CertFile: cert, KeyFile: key, ClientCAFile: missing}, want: "server: tls: stat " + missing + ": no such file or directory"},
		{
			name: "key of another certificate", give: TLS{CertFile: cert, KeyFile: otherKey},
			want: `server: tls: load certificate "` + cert + `" and key "` + otherKey + `": tls: private key does not match public key`,
		},
		{
			name: "key as certificate", give: TLS{CertFile: key, KeyFile: key},
			want: `server: tls: load certificate "` + key + `" and key "` + key + `": tls: failed to find certificate PEM data in certificate input, but did find a private key; PEM inputs may have been switched`,
		},
		{
			name: "client CAs not PEM", give: TLS{CertFile: cert, KeyFile: key, ClientCAFile: notPEM},
			want: `server: tls: load client CAs: "` + notPEM + `" holds no PEM certificate`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(Config{Services: []Service{&fakeRLS{handle: okHandler}}, Gatherer: prometheus.NewRegistry(), TLS: &tt.give})
			if err == nil || err.Error() != tt.want {
				t.Errorf("New error = %v\nwant %s", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("the error shows key material: %v", err)
			}
		})
	}
}
