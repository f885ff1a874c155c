package app

import (
	"errors"
	"flag"
	"sync/atomic"

	"github.com/tollgate-dev/tollgate/pkg/limit/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/limit/storeguard"
)

// recoveries passes the Redis client's news that an address answers again
// to the store circuit, which is made after the client.
type recoveries struct {
	guard atomic.Pointer[storeguard.Guard]
}

func (r *recoveries) retry() {
	if g := r.guard.Load(); g != nil {
		g.Retry()
	}
}

// redisFlags are serve's TLS settings for the connection to Redis; the
// URL's scheme (rediss://, rediss+sentinel://, rediss+cluster://) turns
// TLS on, and its userinfo carries the ACL user and password.
type redisFlags struct {
	tlsCA, tlsCert, tlsKey, tlsServerName string
}

func (r *redisFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.tlsCA, "redis-tls-ca", "", "PEM CA bundle that signs the Redis servers' certificates (sentinels and cluster nodes too), for a rediss URL; empty trusts the system's roots")
	fs.StringVar(&r.tlsCert, "redis-tls-cert", "", "PEM client certificate for Redis servers with tls-auth-clients (with --redis-tls-key); re-read at every new connection")
	fs.StringVar(&r.tlsKey, "redis-tls-key", "", "PEM private key of --redis-tls-cert")
	fs.StringVar(&r.tlsServerName, "redis-tls-server-name", "", "name every Redis server's certificate must carry; empty checks each against the host it is dialled on")
}

// check rejects settings that cannot mean what they seem to. A rediss URL
// is checked by redisstore.NewClient, which refuses TLS settings on a
// plain one.
func (r *redisFlags) check(redisURL string) error {
	switch {
	case (r.tlsCert == "") != (r.tlsKey == ""):
		return errors.New("--redis-tls-cert and --redis-tls-key must be given together")
	case redisURL == "" && *r != redisFlags{}:
		return errors.New("--redis-tls-* need --redis-url: without it counters stay in memory")
	}
	return nil
}

// options are redisstore.NewClient's options for these flags.
func (r *redisFlags) options() []redisstore.Option {
	return []redisstore.Option{redisstore.WithTLS(redisstore.TLS{
		CAFile:     r.tlsCA,
		CertFile:   r.tlsCert,
		KeyFile:    r.tlsKey,
		ServerName: r.tlsServerName,
	})}
}
