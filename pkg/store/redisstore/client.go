package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client defaults: a rate limit decision has a deadline of tens of
// milliseconds, so a slow Redis must fail fast and let store_failure
// answer rather than hold the request.
const (
	DefaultDialTimeout  = time.Second
	DefaultReadTimeout  = 250 * time.Millisecond
	DefaultWriteTimeout = 250 * time.Millisecond
	// ClusterStateReloadInterval is how old a cluster client's slot map
	// may grow before a command reloads it.
	ClusterStateReloadInterval = time.Second
	// DefaultMinIdleConns is how many idle connections (per node) the
	// pool keeps, dialling them again in the background whenever one is
	// closed. A call that times out closes its connection, so after a
	// stall the next decisions would otherwise each dial and shake hands
	// in their own time. More are opened by Warm, at start.
	DefaultMinIdleConns = 2
	// WarmConns is how many connections (per node, at most the pool's
	// size) Warm opens: about the store calls a busy replica has in
	// flight at once.
	WarmConns = 16
)

// NewClient builds a go-redis client from a URL:
//
//	redis://[user:pass@]host[:port][/db]                            one node
//	rediss://[user:pass@]host[:port][/db]                           one node, TLS
//	unix://[user:pass@]/path/to/redis.sock[?db=N]                   one node, unix socket
//	redis+sentinel://[user:pass@]h1[:port],h2[:port]/master[?db=N]  Sentinel (port 26379 by default)
//	redis+cluster://[user:pass@]h1[:port],h2[:port]                 Cluster
//
// rediss+sentinel:// and rediss+cluster:// use TLS, to the sentinels and
// to every node, verified against the system's roots unless a TLS option
// names a CA. The credentials (an ACL user and its password, or only a
// password for the default user) authenticate to the data nodes;
// Sentinel itself is reached without them. Special characters in the
// password must be percent-encoded.
//
// Query parameters (Optional): dial_timeout (default 1s), read_timeout and
// write_timeout (default 250ms), as Go durations; pool_size (connections
// per node, default go-redis's 10 per CPU); min_idle_conns (connections
// per node kept open, default DefaultMinIdleConns, at most pool_size; 0
// keeps none). Others are rejected.
//
// Commands are not retried on a single node or Sentinel: a script that
// ran but whose reply timed out would charge twice. The caller's context
// deadline bounds every call. NewClient connects to nothing; Store.Ping
// does. Its errors never contain the password.
func NewClient(rawURL string, opts ...Option) (redis.UniversalClient, error) {
	spec, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.password != nil {
		spec.pass = *o.password
	}
	tc, err := o.tls.config(spec.tls)
	if err != nil {
		return nil, err
	}
	return spec.client(tc, newRedialer(spec.dialTimeout, tc, o.onUp)), nil
}

// Option configures NewClient beyond what its URL says.
type Option func(*options)

type options struct {
	tls      TLS
	onUp     func()
	password *string
}

// WithPassword sets the password, in place of the URL's, so that it can
// come from a file or the environment and stay off the command line.
func WithPassword(p string) Option { return func(o *options) { o.password = &p } }

// WithTLS sets the TLS files and server name of a rediss:// URL.
func WithTLS(t TLS) Option { return func(o *options) { o.tls = t } }

// WithRecovered has f called each time a Redis address the client knew
// to be down answers again (see RedialInterval): a circuit in front of
// the store can then probe at once rather than at the end of its
// backoff. f must not block.
func WithRecovered(f func()) Option { return func(o *options) { o.onUp = f } }

// TLS is how a rediss://, rediss+sentinel:// or rediss+cluster:// client
// verifies the servers and proves itself to them. The same settings hold
// for the sentinels and every node.
type TLS struct {
	// CAFile (Optional) is a PEM bundle of the CAs that sign the servers'
	// certificates, read once by NewClient; empty trusts the system's roots.
	CAFile string
	// CertFile and KeyFile (Optional, together) are a PEM client
	// certificate and its key, for servers with tls-auth-clients. They
	// are read by NewClient and again at every new connection, so a
	// renewed certificate is used without a restart.
	CertFile, KeyFile string
	// ServerName (Optional) is the name every server's certificate must
	// carry; empty checks each server against the host it is dialled
	// on, which is what a cluster or Sentinel setup with one certificate
	// per node needs.
	ServerName string
}

func (t TLS) set() bool { return t != TLS{} }

// config builds the client's tls.Config: nil without TLS. TLS settings on
// a URL without TLS are an error rather than ignored: an operator who
// names a CA means the connection to be encrypted.
func (t TLS) config(useTLS bool) (*tls.Config, error) {
	if !useTLS {
		if t.set() {
			return nil, errors.New("TLS settings need a rediss://, rediss+sentinel:// or rediss+cluster:// URL")
		}
		return nil, nil
	}
	// No ServerName by default: go-redis dials with tls.DialWithDialer,
	// which takes it from each node's address.
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA %q: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("a TLS client certificate needs both its certificate and its key file")
	}
	if t.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			return nil, fmt.Errorf("TLS client certificate %q, key %q: %w", t.CertFile, t.KeyFile, err)
		}
		certFile, keyFile := t.CertFile, t.KeyFile
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("TLS client certificate %q, key %q: %w", certFile, keyFile, err)
			}
			return &c, nil
		}
	}
	return tc, nil
}

// Topologies of a clientSpec.
const (
	single   = "single"
	sentinel = "sentinel"
	cluster  = "cluster"
)

// clientSpec is what a URL asks for, before any client is made.
type clientSpec struct {
	topology     string
	network      string   // "tcp" or "unix", for a single node
	addrs        []string // the node, the sentinels or the cluster seeds
	master       string   // the Sentinel master name
	user, pass   string
	db           int
	tls          bool
	dialTimeout  time.Duration
	readTimeout  time.Duration
	writeTimeout time.Duration
	poolSize     int // 0: go-redis's default
	minIdleConns int
}

// idle is the MinIdleConns to ask go-redis for: never above the pool.
func (s *clientSpec) idle() int {
	if s.poolSize > 0 {
		return min(s.minIdleConns, s.poolSize)
	}
	return s.minIdleConns
}

// client makes the client; tc is nil without TLS. Every connection, to
// a node or a sentinel, is dialled by rd.
func (s *clientSpec) client(tc *tls.Config, rd *redialer) redis.UniversalClient {
	switch s.topology {
	case sentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            s.master,
			SentinelAddrs:         s.addrs,
			Dialer:                rd.Dial,
			Username:              s.user,
			Password:              s.pass,
			DB:                    s.db,
			DialTimeout:           s.dialTimeout,
			DialerRetries:         1,
			ReadTimeout:           s.readTimeout,
			WriteTimeout:          s.writeTimeout,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1,
			PoolSize:              s.poolSize,
			MinIdleConns:          s.idle(),
			TLSConfig:             tc,
		})
	case cluster:
		// MaxRedirects stays at go-redis's default: it also counts the
		// retries that follow MOVED and ASK while slots migrate. So a
		// call whose reply timed out may run twice on a cluster: charged
		// twice, it under-admits, never over-admits.
		//
		// A master that died answers no MOVED, and go-redis reloads the
		// slot map on a pipeline's dial error only once it is older than
		// ClusterStateReloadInterval (default 60s): decisions would fail
		// for a minute after the cluster promoted a replica. One CLUSTER
		// SLOTS a second per process is cheap, and bounds that to about
		// a second (test/failover).
		return redis.NewClusterClient(&redis.ClusterOptions{
			ClusterStateReloadInterval: ClusterStateReloadInterval,
			Addrs:                      s.addrs,
			Dialer:                     rd.Dial,
			Username:                   s.user,
			Password:                   s.pass,
			DialTimeout:                s.dialTimeout,
			DialerRetries:              1,
			ReadTimeout:                s.readTimeout,
			WriteTimeout:               s.writeTimeout,
			ContextTimeoutEnabled:      true,
			PoolSize:                   s.poolSize,
			MinIdleConns:               s.idle(),
			TLSConfig:                  tc,
		})
	}
	return redis.NewClient(&redis.Options{
		Network:               s.network,
		Addr:                  s.addrs[0],
		Dialer:                rd.Dial,
		Username:              s.user,
		Password:              s.pass,
		DB:                    s.db,
		DialTimeout:           s.dialTimeout,
		DialerRetries:         1,
		ReadTimeout:           s.readTimeout,
		WriteTimeout:          s.writeTimeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              s.poolSize,
		MinIdleConns:          s.idle(),
		TLSConfig:             tc,
	})
}

const schemes = "redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"

// parseURL reads a NewClient URL. The userinfo is cut off before anything
// else is parsed, and errors quote the URL with the password replaced, so
// no error can echo the password.
func parseURL(raw string) (*clientSpec, error) {
	i := strings.Index(raw, "://")
	if i <= 0 || strings.IndexFunc(raw[:i], notSchemeRune) >= 0 {
		// Not quoted: what stands before "://" may be a password.
		return nil, fmt.Errorf("redis URL has no scheme, want %s", schemes)
	}
	scheme, rest := strings.ToLower(raw[:i]), raw[i+len("://"):]
	spec := &clientSpec{
		dialTimeout:  DefaultDialTimeout,
		readTimeout:  DefaultReadTimeout,
		writeTimeout: DefaultWriteTimeout,
		minIdleConns: DefaultMinIdleConns,
	}
	userinfo := ""
	// The userinfo ends at the last '@', wherever it is: a password whose
	// '/', '?' or '#' was not escaped must still never reach an error.
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		var name, pass string
		var hasPass bool
		name, pass, hasPass = strings.Cut(rest[:at], ":")
		rest = rest[at+1:]
		userinfo = name + "@"
		if hasPass {
			userinfo = name + ":xxxxx@"
		}
		var err error
		if spec.user, err = url.PathUnescape(name); err != nil {
			return nil, fmt.Errorf("redis URL %q: the user name has an invalid %%-escape", scheme+"://"+userinfo+rest)
		}
		if spec.pass, err = url.PathUnescape(pass); err != nil {
			// The escape error would quote part of the password.
			return nil, fmt.Errorf("redis URL %q: the password has an invalid %%-escape", scheme+"://"+userinfo+rest)
		}
	}
	redacted := scheme + "://" + userinfo + rest
	if err := spec.parse(scheme, rest); err != nil {
		return nil, fmt.Errorf("redis URL %q: %w", redacted, err)
	}
	return spec, nil
}

func notSchemeRune(r rune) bool {
	return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '+' || r == '.' || r == '-')
}

// parse reads the scheme and what follows the userinfo.
func (s *clientSpec) parse(scheme, rest string) error {
	switch scheme {
	case "redis", "unix", "redis+sentinel", "redis+cluster":
	case "rediss", "rediss+sentinel", "rediss+cluster":
		s.tls = true
		scheme = "redis" + strings.TrimPrefix(scheme, "rediss")
	default:
		return fmt.Errorf("unknown scheme %q, want %s", scheme, schemes)
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	hosts, tail := rest[:end], rest[end:]
	if strings.Contains(tail, "#") {
		return errors.New("a fragment (#) is not allowed; percent-encode '#' as %23")
	}
	rawPath, rawQuery, _ := strings.Cut(tail, "?")
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		return fmt.Errorf("path: %w", err)
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return fmt.Errorf("query: %w", err)
	}
	if err := s.options(query, scheme == "unix" || scheme == "redis+sentinel"); err != nil {
		return err
	}
	path = strings.TrimPrefix(path, "/")

	switch scheme {
	case "redis":
		s.topology, s.network = single, "tcp"
		if s.addrs, err = hostPorts(hosts, 6379); err != nil {
			return err
		}
		if len(s.addrs) != 1 {
			return fmt.Errorf("%d hosts, want one (redis+cluster:// or redis+sentinel:// take several)", len(s.addrs))
		}
		if path != "" {
			s.db, err = parseDB(path)
		}
		return err
	case "unix":
		s.topology, s.network = single, "unix"
		if hosts != "" {
			return errors.New("a unix URL has no host: unix:///path/to/redis.sock")
		}
		if path == "" {
			return errors.New("a unix URL needs the socket path")
		}
		s.addrs = []string{"/" + path}
		return nil
	case "redis+sentinel":
		s.topology = sentinel
		if s.addrs, err = hostPorts(hosts, 26379); err != nil {
			return err
		}
		if path == "" || strings.Contains(path, "/") {
			return errors.New("a sentinel URL needs the master name as its path: redis+sentinel://host:26379/mymaster")
		}
		s.master = path
		return nil
	}
	s.topology = cluster
	if s.addrs, err = hostPorts(hosts, 6379); err != nil {
		return err
	}
	if path != "" {
		return errors.New("a cluster URL has no path: Redis Cluster has database 0 only")
	}
	return nil
}

// options reads the query parameters over the defaults.
func (s *clientSpec) options(q url.Values, allowDB bool) error {
	known := []string{"dial_timeout", "read_timeout", "write_timeout", "pool_size", "min_idle_conns"}
	if allowDB {
		known = append(known, "db")
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(known, name) {
			return fmt.Errorf("unknown query parameter %q, want one of %s", name, strings.Join(known, ", "))
		}
		if len(q[name]) != 1 {
			return fmt.Errorf("query parameter %q is given %d times", name, len(q[name]))
		}
		v := q[name][0]
		var err error
		switch name {
		case "dial_timeout":
			s.dialTimeout, err = parseTimeout(name, v)
		case "read_timeout":
			s.readTimeout, err = parseTimeout(name, v)
		case "write_timeout":
			s.writeTimeout, err = parseTimeout(name, v)
		case "pool_size":
			if s.poolSize, err = strconv.Atoi(v); err != nil || s.poolSize < 1 {
				err = fmt.Errorf("pool_size %q is not a positive integer", v)
			}
		case "min_idle_conns":
			if s.minIdleConns, err = strconv.Atoi(v); err != nil || s.minIdleConns < 0 {
				err = fmt.Errorf("min_idle_conns %q is not an integer >= 0", v)
			}
		case "db":
			s.db, err = parseDB(v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func parseTimeout(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q is not a positive duration such as 250ms", name, v)
	}
	return d, nil
}

func parseDB(v string) (int, error) {
	db, err := strconv.Atoi(v)
	if err != nil || db < 0 {
		return 0, fmt.Errorf("database %q is not a number >= 0", v)
	}
	return db, nil
}

// hostPorts splits a comma-separated host[:port] list and adds the
// default port where none is given.
func hostPorts(hosts string, defaultPort int) ([]string, error) {
	if hosts == "" {
		return nil, errors.New("no host")
	}
	var out []string
	for h := range strings.SplitSeq(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port: "name" or "[::1]".
			host, port, err = net.SplitHostPort(h + ":" + strconv.Itoa(defaultPort))
			if err != nil {
				return nil, fmt.Errorf("host %q is not host[:port]", h)
			}
		}
		if host == "" {
			return nil, fmt.Errorf("host %q has no host name", h)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("host %q has an invalid port", h)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

// Warm readies the store for its first decisions: it opens WarmConns
// connections (at most the pool's size; on every master of a cluster),
// which stay in the pool, by pinging on that many at once, and loads the
// function library, or the script on a server without functions. A fresh
// process's first decisions otherwise each dialled, shook hands and
// found the library missing, longer than a decision's store timeout:
// three replicas started together answered their first hundred
// decisions by store_failure (issue 12). It returns the first error met;
// the library is then loaded by a later Warm or Ping, or by the first
// call that needs it.
func (s *Store) Warm(ctx context.Context) error {
	wait := warmWait(ctx)
	if s.cluster != nil {
		n := min(WarmConns, max(1, s.cluster.Options().PoolSize))
		err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return pingMany(ctx, m.WithTimeout(wait), n)
		})
		if err != nil {
			return fmt.Errorf("warm up redis cluster: %w", err)
		}
	} else {
		n := 1
		c := s.c
		if rc, ok := s.c.(*redis.Client); ok {
			n = min(WarmConns, max(1, rc.Options().PoolSize))
			c = rc.WithTimeout(wait)
		}
		if err := pingMany(ctx, c, n); err != nil {
			return fmt.Errorf("warm up redis: %w", err)
		}
	}
	s.apply.load(ctx, s.c)
	if s.apply.useScripts.Load() {
		// Best effort: an ACL without SCRIPT LOAD (the README's grants
		// FCALL, EVALSHA and EVAL) still runs the script, by EVAL on its
		// first NOSCRIPT; failing the warm-up would keep the replica from
		// ever serving.
		for _, script := range s.apply.scripts {
			_ = script.Load(ctx, s.c).Err()
		}
	}
	s.loaded.Store(true)
	return nil
}

// DefaultWarmWait is how long one of Warm's PINGs may wait for its reply
// when Warm's context has no deadline.
const DefaultWarmWait = 5 * time.Second

// warmWait is how long Warm's PINGs may wait for their replies: what is
// left of ctx. The client's read timeout is a decision's, a few hundred
// milliseconds; on a busy machine one PING of the sixteen took longer,
// failed the whole warm-up, and the next try started over: a replica
// took 15 s to serve (issue 14 item 9). The connections so opened share
// the client's pool, and its timeouts, once Warm returns them.
func warmWait(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return DefaultWarmWait
}

// pingMany leaves n connections of c's pool open: each PING runs on a
// connection held apart from the pool until all n have answered, so none
// is reused for another (PINGs sent at once from goroutines would reuse
// whichever came back first, and open fewer on a busy machine). Without a
// *redis.Client to take connections from, one PING.
func pingMany(ctx context.Context, c redis.Cmdable, n int) error {
	rc, ok := c.(*redis.Client)
	if !ok || n <= 1 {
		return c.Ping(ctx).Err()
	}
	conns := make([]*redis.Conn, 0, n)
	defer func() {
		for _, cn := range conns {
			_ = cn.Close() // back to the pool, open and idle
		}
	}()
	for range n {
		cn := rc.Conn()
		conns = append(conns, cn)
		if err := cn.Ping(ctx).Err(); err != nil {
			return err
		}
	}
	return nil
}
