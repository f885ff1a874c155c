package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// TLS is TLS on the gRPC port. The files are PEM, as cert-manager and
// Kubernetes TLS Secrets hold them. They are checked for changes at most
// every few seconds, on a handshake, and re-read when one changed, so a
// rotated certificate or CA bundle is served without a restart.
type TLS struct {
	// CertFile is the server's certificate chain (Required).
	CertFile string
	// KeyFile is the certificate's private key (Required).
	KeyFile string
	// ClientCAFile turns on mutual TLS: every client must present a
	// certificate that one of these CAs signed (Optional; default no
	// client certificate is asked for).
	ClientCAFile string
}

// tlsCheckEvery is how often, at most, a handshake looks at the files'
// modification times: often enough that a rotation is served within
// seconds, rarely enough that a burst of handshakes costs no I/O.
const tlsCheckEvery = 5 * time.Second

// tlsFiles serves the TLS configuration built from the files, rebuilding
// it when one of them changes. Each handshake asks for the configuration
// (tls.Config.GetConfigForClient), so a new certificate and a new CA
// bundle take effect together, on new connections; connections already
// open keep theirs.
type tlsFiles struct {
	files TLS
	log   *zap.Logger
	now   func() time.Time // tests move it instead of sleeping

	mu      sync.Mutex
	checked time.Time    // when the files were last looked at
	stamps  [3]fileStamp // of CertFile, KeyFile and ClientCAFile when conf was built
	conf    *tls.Config  // what handshakes get
}

// fileStamp tells a changed file from the one read before. A Kubernetes
// Secret swap replaces the file, so its time changes even when its size
// does not.
type fileStamp struct {
	modNanos, size int64
}

// newTLSFiles reads the files once, so that bad ones stop the server
// before it listens.
func newTLSFiles(files TLS, log *zap.Logger) (*tlsFiles, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("tls: a certificate file and a key file are both required")
	}
	f := &tlsFiles{files: files, log: log, now: time.Now}
	stamps, err := f.stat()
	if err != nil {
		return nil, err
	}
	conf, err := f.load()
	if err != nil {
		return nil, err
	}
	f.stamps, f.conf, f.checked = stamps, conf, f.now()
	log.Info("tls files loaded", certFields(conf)...)
	return f, nil
}

// serverConfig is the configuration for grpc's credentials: every
// handshake gets the current one from GetConfigForClient.
func (f *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: f.config}
}

func (f *tlsFiles) mutual() bool { return f.files.ClientCAFile != "" }

// config returns the configuration for a handshake. When a file has
// changed but does not load (a writer between the certificate and its
// key, a bad rotation), the previous configuration keeps serving and the
// files are tried again at the next check.
func (f *tlsFiles) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if now.Sub(f.checked) < tlsCheckEvery {
		return f.conf, nil
	}
	f.checked = now
	stamps, err := f.stat()
	if err == nil && stamps == f.stamps {
		return f.conf, nil
	}
	var conf *tls.Config
	if err == nil {
		conf, err = f.load()
	}
	if err != nil {
		f.log.Warn("tls files changed and do not load; the previous certificate keeps serving", zap.Error(err))
		return f.conf, nil
	}
	f.stamps, f.conf = stamps, conf
	f.log.Info("tls files reloaded", certFields(conf)...)
	return f.conf, nil
}

// stat is taken before the files are read: a change during the read is
// then seen, and read, at the next check.
func (f *tlsFiles) stat() ([3]fileStamp, error) {
	var stamps [3]fileStamp
	for i, name := range []string{f.files.CertFile, f.files.KeyFile, f.files.ClientCAFile} {
		if name == "" {
			continue
		}
		fi, err := os.Stat(name) // follows a Secret volume's symlinks
		if err != nil {
			return stamps, fmt.Errorf("tls: %w", err)
		}
		stamps[i] = fileStamp{modNanos: fi.ModTime().UnixNano(), size: fi.Size()}
	}
	return stamps, nil
}

func (f *tlsFiles) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.files.CertFile, f.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load certificate %q and key %q: %w", f.files.CertFile, f.files.KeyFile, err)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.mutual() {
		pem, err := os.ReadFile(f.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load client CAs: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: load client CAs: %q holds no PEM certificate", f.files.ClientCAFile)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// certFields describe the certificate served, for the log.
func certFields(conf *tls.Config) []zap.Field {
	leaf := conf.Certificates[0].Leaf // LoadX509KeyPair sets it
	if leaf == nil {
		return nil
	}
	return []zap.Field{
		zap.String("subject", leaf.Subject.String()),
		zap.String("serial", leaf.SerialNumber.String()),
		zap.Time("not_after", leaf.NotAfter),
		zap.Bool("mutual", conf.ClientCAs != nil),
	}
}
