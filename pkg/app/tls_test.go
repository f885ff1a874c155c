package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

func TestTLSFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		give       []string
		env        map[string]string
		want       tlsFlags
		wantStderr string
	}{
		{name: "none", want: tlsFlags{}},
		{
			name: "from the environment",
			env:  map[string]string{"TOLLGATE_TLS_CERT": "/tls/tls.crt", "TOLLGATE_TLS_KEY": "/tls/tls.key", "TOLLGATE_TLS_CLIENT_CA": "/tls/ca.crt"},
			want: tlsFlags{cert: "/tls/tls.crt", key: "/tls/tls.key", clientCA: "/tls/ca.crt"},
		},
		{
			name: "flags beat variables",
			give: []string{"--tls-cert", "c", "--tls-key", "k"},
			env:  map[string]string{"TOLLGATE_TLS_CERT": "/tls/tls.crt"},
			want: tlsFlags{cert: "c", key: "k"},
		},
		{name: "a certificate without its key", give: []string{"--tls-cert", "c"}, wantStderr: "tollgate serve: --tls-cert and --tls-key must be given together\n"},
		{name: "a key without its certificate", env: map[string]string{"TOLLGATE_TLS_KEY": "k"}, wantStderr: "tollgate serve: --tls-cert and --tls-key must be given together\n"},
		{
			name:       "client CAs without TLS",
			give:       []string{"--tls-client-ca", "ca"},
			wantStderr: "tollgate serve: --tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr buffer
			a := &App{Stderr: &stderr, LookupEnv: env(tt.env)}
			got, err := a.parseServeFlags(tt.give)
			if tt.wantStderr != "" {
				if err == nil || stderr.String() != tt.wantStderr {
					t.Errorf("parseServeFlags = %v; stderr %q, want %q", err, stderr.String(), tt.wantStderr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseServeFlags: %v\n%s", err, stderr.String())
			}
			if got.tls != tt.want {
				t.Errorf("tls flags = %+v, want %+v", got.tls, tt.want)
			}
		})
	}
	t.Run("exit code", func(t *testing.T) {
		t.Parallel()
		a := &App{Stdout: io.Discard, Stderr: io.Discard}
		if got := a.Run(context.Background(), []string{"serve", "--tls-key", "k"}); got != ExitUsage {
			t.Errorf("exit code = %d, want %d", got, ExitUsage)
		}
	})
}

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate to dir, and returns client credentials that trust the
// server and present the client certificate, and a function that issues
// more such credentials, each with a client certificate of those URI SANs.
func pki(t *testing.T, dir string) (creds credentials.TransportCredentials, client func(uris ...string) credentials.TransportCredentials) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ca.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})))

	issue := func(serial int64, usage x509.ExtKeyUsage, ips []net.IP, uris ...string) (certPEM, keyPEM []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "test"},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	}
	serverCert, serverKey := issue(2, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	writeFile(t, filepath.Join(dir, "tls.crt"), string(serverCert))
	writeFile(t, filepath.Join(dir, "tls.key"), string(serverKey))
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	serial := int64(3)
	client = func(uris ...string) credentials.TransportCredentials {
		clientCert, clientKey := issue(serial, x509.ExtKeyUsageClientAuth, nil, uris...)
		serial++
		pair, err := tls.X509KeyPair(clientCert, clientKey)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	}
	return client(), client
}

func TestServeMutualTLS(t *testing.T) {
	t.Parallel()
	ctx, cancelTest := context.WithTimeout(context.Background(), wait)
	defer cancelTest()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeFile(t, rules, goodRules)
	creds, _ := pki(t, dir)

	addrs := make(chan Addrs, 1)
	stderr := &buffer{}
	a := &App{
		Stdout: io.Discard,
		Stderr: stderr,
		LookupEnv: env(map[string]string{
			"TOLLGATE_TLS_CERT":      filepath.Join(dir, "tls.crt"),
			"TOLLGATE_TLS_KEY":       filepath.Join(dir, "tls.key"),
			"TOLLGATE_TLS_CLIENT_CA": filepath.Join(dir, "ca.crt"),
		}),
		Listening: func(ad Addrs) { addrs <- ad },
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	exit := make(chan int, 1)
	go func() {
		exit <- a.Run(runCtx, []string{"serve", "--config", rules, "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"})
	}()
	var grpcAddr string
	select {
	case ad := <-addrs:
		grpcAddr = ad.GRPC.String()
	case code := <-exit:
		t.Fatalf("serve exited with %d before listening:\n%s", code, stderr.String())
	case <-ctx.Done():
		t.Fatal("serve never listened")
	}

	call := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient("passthrough:///"+grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:      "e2e",
			Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}},
		})
		return err
	}
	if err := call(creds); err != nil {
		t.Errorf("call with a client certificate: %v", err)
	}
	if err := call(insecure.NewCredentials()); err == nil {
		t.Errorf("a plaintext call succeeded")
	}
	if !strings.Contains(stderr.String(), `"grpc_mtls":true`) {
		t.Errorf("the log does not say the gRPC port is mutual TLS:\n%s", stderr.String())
	}

	stop()
	select {
	case code := <-exit:
		if code != ExitOK {
			t.Errorf("serve exited with %d, want 0\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("serve did not exit after cancel")
	}
}

func TestServeTLSFilesMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeFile(t, rules, goodRules)
	var stderr buffer
	a := &App{Stdout: io.Discard, Stderr: &stderr}
	cert := filepath.Join(dir, "tls.crt")
	got := a.Run(context.Background(), []string{"serve", "--config", rules, "--tls-cert", cert, "--tls-key", filepath.Join(dir, "tls.key"),
		"--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"})
	if got != ExitError {
		t.Errorf("exit code = %d, want %d", got, ExitError)
	}
	if want := "server: tls: stat " + cert + ": no such file or directory"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
	}
}
