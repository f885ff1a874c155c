package app

import (
	"errors"
	"flag"

	"github.com/tollgate-dev/tollgate/pkg/server"
)

// tlsFlags are serve's TLS settings for the gRPC port.
type tlsFlags struct {
	cert, key, clientCA string
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "tls-cert", "", "PEM certificate chain: serve the gRPC port over TLS (with --tls-key); re-read when it changes; empty serves plaintext")
	fs.StringVar(&t.key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&t.clientCA, "tls-client-ca", "", "PEM CA bundle: require client certificates that it signed (mutual TLS); re-read when it changes")
}

// check rejects settings that cannot mean what they seem to.
func (t *tlsFlags) check() error {
	switch {
	case (t.cert == "") != (t.key == ""):
		return errors.New("--tls-cert and --tls-key must be given together")
	case t.clientCA != "" && t.cert == "":
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first")
	}
	return nil
}

// server is the server's TLS option; nil serves plaintext.
func (t *tlsFlags) server() *server.TLS {
	if t.cert == "" {
		return nil
	}
	return &server.TLS{CertFile: t.cert, KeyFile: t.key, ClientCAFile: t.clientCA}
}
