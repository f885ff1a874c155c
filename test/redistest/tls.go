package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs are PEM files of a throwaway CA and the certificates it signed,
// for servers started WithTLS and the clients that talk to them.
type Certs struct {
	// CAFile is the CA's certificate: what clients and servers trust.
	CAFile string
	// ServerCertFile and ServerKeyFile are every server's certificate,
	// for 127.0.0.1 and localhost. Servers present it to each other too
	// (replication, the cluster bus), so it is also a client certificate.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate.
	ClientCertFile, ClientKeyFile string
}

// NewCerts makes a CA, a server and a client certificate, ECDSA P-256,
// valid for a day, in a temporary directory.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	c, err := newCerts(t.TempDir(), "redistest CA")
	if err != nil {
		t.Fatalf("redistest: certificates: %v", err)
	}
	return c
}

func newCerts(dir, caName string) (*Certs, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: caName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	c := &Certs{
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaves := []struct {
		certFile, keyFile string
		tmpl              x509.Certificate
	}{
		{c.ServerCertFile, c.ServerKeyFile, x509.Certificate{
			Subject:     pkix.Name{CommonName: "localhost"},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}},
		{c.ClientCertFile, c.ClientKeyFile, x509.Certificate{
			Subject:     pkix.Name{CommonName: "tollgate"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	}
	for i, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl := l.tmpl
		tmpl.SerialNumber = big.NewInt(int64(i + 2))
		tmpl.NotBefore, tmpl.NotAfter = caTmpl.NotBefore, caTmpl.NotAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := writePEM(l.certFile, "CERTIFICATE", der); err != nil {
			return nil, err
		}
		if err := writePEM(l.keyFile, "PRIVATE KEY", keyDER); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func writePEM(path, typ string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ClientTLS is a tls.Config that trusts the CA and presents the client
// certificate.
func (c *Certs) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	tc, err := c.clientTLS()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return tc
}

func (c *Certs) clientTLS() (*tls.Config, error) {
	pemCA, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemCA)
	cert, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// TLS client authentication modes of WithTLS (tls-auth-clients).
const (
	ClientCertNo       = "no"
	ClientCertOptional = "optional"
	ClientCertRequired = "yes"
)

// WithTLS makes the server listen with TLS only (--port 0), with the
// certificates of c, asking clients for a certificate as authClients says
// (ClientCertNo, ClientCertOptional or ClientCertRequired). Replication
// and the cluster bus use TLS too; a Sentinel reaches its master over TLS.
func WithTLS(c *Certs, authClients string) Option {
	return func(cfg *config) { cfg.tls, cfg.authClients = c, authClients }
}

func (s *Server) tlsArgs() []string {
	if s.cfg.tls == nil {
		return nil
	}
	a := []string{
		"--tls-cert-file", s.cfg.tls.ServerCertFile,
		"--tls-key-file", s.cfg.tls.ServerKeyFile,
		"--tls-ca-cert-file", s.cfg.tls.CAFile,
		"--tls-auth-clients", s.cfg.authClients,
		"--tls-replication", "yes",
	}
	if s.cfg.cluster {
		a = append(a, "--tls-cluster", "yes")
	}
	return a
}
