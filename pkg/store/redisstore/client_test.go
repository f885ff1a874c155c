package redisstore

import (
	"context"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/breaker/breakertest"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	def := func(s clientSpec) *clientSpec {
		s.dialTimeout, s.readTimeout, s.writeTimeout = DefaultDialTimeout, DefaultReadTimeout, DefaultWriteTimeout
		s.minIdleConns = DefaultMinIdleConns
		return &s
	}
	tests := []struct {
		name string
		give string
		want *clientSpec
	}{
		{name: "host only", give: "redis://localhost",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"localhost:6379"}})},
		{name: "user, password and db", give: "redis://app:s3cr%40t@10.0.0.1:6380/3",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"10.0.0.1:6380"}, user: "app", pass: "s3cr@t", db: 3})},
		{name: "password only", give: "redis://:pw@h:1",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"h:1"}, pass: "pw"})},
		{name: "unescaped slash in the password", give: "redis://:p/w@h:1",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"h:1"}, pass: "p/w"})},
		{name: "ipv6", give: "redis://[::1]:7000/",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"[::1]:7000"}})},
		{name: "ipv6 without port", give: "redis://[::1]",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"[::1]:6379"}})},
		{name: "tls", give: "rediss://h",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"h:6379"}, tls: true})},
		{name: "scheme is case-insensitive", give: "REDIS://h:1",
			want: def(clientSpec{topology: single, network: "tcp", addrs: []string{"h:1"}})},
		{name: "timeouts and pool", give: "redis://h:1?dial_timeout=2s&read_timeout=100ms&write_timeout=50ms&pool_size=7&min_idle_conns=3",
			want: &clientSpec{topology: single, network: "tcp", addrs: []string{"h:1"},
				dialTimeout: 2 * time.Second, readTimeout: 100 * time.Millisecond, writeTimeout: 50 * time.Millisecond, poolSize: 7, minIdleConns: 3}},
		{name: "no idle connections", give: "redis://h:1?min_idle_conns=0",
			want: &clientSpec{topology: single, network: "tcp", addrs: []string{"h:1"},
				dialTimeout: DefaultDialTimeout, readTimeout: DefaultReadTimeout, writeTimeout: DefaultWriteTimeout}},
		{name: "unix socket", give: "unix:///run/redis/redis.sock?db=2",
			want: def(clientSpec{topology: single, network: "unix", addrs: []string{"/run/redis/redis.sock"}, db: 2})},
		{name: "unix socket with a password", give: "unix://:pw@/tmp/r.sock",
			want: def(clientSpec{topology: single, network: "unix", addrs: []string{"/tmp/r.sock"}, pass: "pw"})},
		{name: "sentinel", give: "redis+sentinel://u:p@s1,s2:5000/mymaster?db=1",
			want: def(clientSpec{topology: sentinel, addrs: []string{"s1:26379", "s2:5000"}, master: "mymaster", user: "u", pass: "p", db: 1})},
		{name: "sentinel over tls", give: "rediss+sentinel://s1/m",
			want: def(clientSpec{topology: sentinel, addrs: []string{"s1:26379"}, master: "m", tls: true})},
		{name: "cluster", give: "redis+cluster://:p@n1:7000,n2:7001,n3",
			want: def(clientSpec{topology: cluster, addrs: []string{"n1:7000", "n2:7001", "n3:6379"}, pass: "p"})},
		{name: "cluster over tls", give: "rediss+cluster://n1:7000/",
			want: def(clientSpec{topology: cluster, addrs: []string{"n1:7000"}, tls: true})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseURL(tt.give)
			if err != nil {
				t.Fatalf("parseURL(%q): %v", tt.give, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseURL(%q)\n got  %+v\n want %+v", tt.give, got, tt.want)
			}
		})
	}
}

func TestParseURLErrors(t *testing.T) {
	t.Parallel()
	const secret = "Sup3rS3cret"
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "no scheme", give: "localhost:6379", want: "no scheme"},
		{name: "unknown scheme", give: "http://u:" + secret + "@h", want: `unknown scheme "http"`},
		{name: "bad escape in the password", give: "redis://u:" + secret + "%zz@h", want: "password has an invalid %-escape"},
		{name: "bad escape in the user", give: "redis://%zz:" + secret + "@h", want: "user name has an invalid %-escape"},
		{name: "bad port", give: "redis://u:" + secret + "@h:99999", want: "invalid port"},
		{name: "port not a number", give: "redis://u:" + secret + "@h:abc", want: "invalid port"},
		{name: "no host", give: "redis://u:" + secret + "@", want: "no host"},
		{name: "two hosts on one node", give: "redis://u:" + secret + "@a,b", want: "2 hosts, want one"},
		{name: "bad db", give: "redis://u:" + secret + "@h/x", want: `database "x"`},
		{name: "db in the query of a tcp URL", give: "redis://u:" + secret + "@h?db=1", want: `unknown query parameter "db"`},
		{name: "unknown parameter", give: "redis://u:" + secret + "@h?max_retries=3", want: `unknown query parameter "max_retries"`},
		{name: "parameter twice", give: "redis://u:" + secret + "@h?pool_size=1&pool_size=2", want: "given 2 times"},
		{name: "bad timeout", give: "redis://u:" + secret + "@h?read_timeout=5", want: `read_timeout "5" is not a positive duration`},
		{name: "negative timeout", give: "redis://u:" + secret + "@h?dial_timeout=-1s", want: "not a positive duration"},
		{name: "bad pool", give: "redis://u:" + secret + "@h?pool_size=0", want: "pool_size"},
		{name: "bad idle connections", give: "redis://u:" + secret + "@h?min_idle_conns=-1", want: "min_idle_conns"},
		{name: "fragment", give: "redis://u:" + secret + "@h#frag", want: "fragment"},
		{name: "unix with a host", give: "unix://u:" + secret + "@host/tmp/x.sock", want: "no host"},
		{name: "unix without a path", give: "unix://u:" + secret + "@", want: "socket path"},
		{name: "sentinel without master", give: "redis+sentinel://u:" + secret + "@s1", want: "master name"},
		{name: "cluster with a db", give: "redis+cluster://u:" + secret + "@n1/2", want: "no path"},
		{name: "empty host in a list", give: "redis+cluster://u:" + secret + "@n1,,n2", want: "no host name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewClient(tt.give)
			if err == nil {
				t.Fatalf("NewClient(%q): no error", tt.give)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewClient(%q) error = %q, want it to contain %q", tt.give, err, tt.want)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "S3cret") {
				t.Errorf("NewClient(%q) error %q contains the password", tt.give, err)
			}
		})
	}
}

func TestNewClientTypes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		give string
		want any
	}{
		{"redis://h", (*redis.Client)(nil)},
		{"unix:///tmp/r.sock", (*redis.Client)(nil)},
		{"redis+sentinel://s/m", (*redis.Client)(nil)},
		{"redis+cluster://n1,n2", (*redis.ClusterClient)(nil)},
	} {
		c, err := NewClient(tt.give)
		if err != nil {
			t.Fatal(err)
		}
		if reflect.TypeOf(c) != reflect.TypeOf(tt.want) {
			t.Errorf("NewClient(%q) is a %T, want %T", tt.give, c, tt.want)
		}
		if cc, ok := c.(*redis.ClusterClient); ok && cc.Options().ClusterStateReloadInterval != ClusterStateReloadInterval {
			// go-redis's 60s would leave a dead master's slots failing for a minute.
			t.Errorf("NewClient(%q): ClusterStateReloadInterval %v", tt.give, cc.Options().ClusterStateReloadInterval)
		}
		if o, ok := c.(*redis.Client); ok && !strings.HasPrefix(tt.give, "redis+sentinel") {
			if o.Options().MaxRetries != 0 || o.Options().ReadTimeout != DefaultReadTimeout {
				// go-redis stores MaxRetries -1 (none) as 0 once normalised.
				t.Errorf("NewClient(%q): MaxRetries %d, ReadTimeout %v", tt.give, o.Options().MaxRetries, o.Options().ReadTimeout)
			}
		}
		_ = c.Close()
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	sen := redistest.StartSentinel(t, master, "tollgate")
	c, err := NewClient("redis+sentinel://" + sen.Addr() + "/tollgate")
	if err != nil {
		t.Fatal(err)
	}
	h := &roundTrips{}
	c.AddHook(h)
	s := newStore(c)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	ch := limit.Charge{Key: key(limit.SlidingWindow, time.Hour, "a"), Algorithm: limit.SlidingWindow, Amount: 3, Window: time.Hour, Cost: 1}
	apply(t, s, t0, ch) // loads the function
	h.n.Store(0)
	before := commandCalls(t, master.Client(t), "fcall")
	for i, want := range []bool{true, false} {
		if ok, res := apply(t, s, t0, ch, ch); ok != want {
			t.Fatalf("decision %d: admitted %v, want %v (%+v)", i, ok, want, res)
		}
	}
	if got := h.n.Load(); got != 2 {
		t.Errorf("%d round trips for 2 decisions", got)
	}
	if got := commandCalls(t, master.Client(t), "fcall") - before; got != 2 {
		t.Errorf("the master counted %d FCALL for 2 decisions", got)
	}
}

// FuzzParseURL: whatever surrounds a password, parseURL does not panic and
// its error does not contain the password.
func FuzzParseURL(f *testing.F) {
	for _, seed := range [][2]string{
		{"redis://", "h:6379/0"},
		{"redis+cluster://", "a:1,b:2"},
		{"redis+sentinel://", "s1,s2/m?db=1"},
		{"unix://", "/tmp/x.sock"},
		{"rediss://", "h?read_timeout=1s"},
		{"", "redis://h"},
		{"x", "@h%zz/%zz?%zz"},
		{"redis://a@b:", "c@h:99999"},
		{"redis://", "h#/?@"},
	} {
		f.Add(seed[0], seed[1])
	}
	const secret = "pw-5ecret"
	f.Fuzz(func(t *testing.T, prefix, suffix string) {
		raw := prefix + "user:" + secret + "@" + suffix
		spec, err := parseURL(raw)
		if err != nil {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("parseURL(%q) error %q contains the password", raw, err)
			}
			return
		}
		if len(spec.addrs) == 0 {
			t.Fatalf("parseURL(%q) = %+v: no address", raw, spec)
		}
	})
}

// aclUser and aclPass are the ACL user the TLS tests connect as; the
// password holds characters a URL must escape.
const (
	aclUser = "tollgate"
	aclPass = "Tg-s3cret/#@pw"
)

// aclRules is the narrowest grant the store works with, as README tells
// operators: the tg: keys, no channels, and only the commands that the
// Lua function and scripts, the pressure board, the control loop's shared
// state (flights, meters, cells) and the clients send.
// Scripts' own calls are checked against it too. Each command was found
// needed by taking it out; HELLO and AUTH need no grant. SELECT is for a
// URL with a database other than 0; COMMAND and CLUSTER SLOTS are for a
// cluster (without COMMAND, go-redis's cluster client asks for it again
// before every command). Redis 7.2 adds CLIENT SETINFO, which go-redis
// sends at connect and whose refusal it ignores.
var aclRules = []string{
	"resetkeys", "~tg:*", "resetchannels", "-@all",
	"+ping", "+select", "+cluster|slots", "+command",
	"+fcall", "+function|load", "+evalsha", "+eval",
	"+get", "+set", "+del", "+incrby", "+pexpire",
	"+hgetall", "+hset", "+hdel", "+hget", "+hincrby",
	"+zadd", "+zrem", "+zrangebyscore", "+zremrangebyscore", "+zcount", "+zrange",
}

// withACLUser adds aclUser with aclRules to a server.
func withACLUser() redistest.Option {
	return redistest.WithArgs(append([]string{"--user", aclUser, "on", ">" + aclPass}, aclRules...)...)
}

// aclURL is a URL for the ACL user, its password escaped.
func aclURL(scheme, hosts string) string {
	return scheme + "://" + aclUser + ":" + url.PathEscape(aclPass) + "@" + hosts
}

// checkACLLog fails the test when a server denied the ACL user anything:
// a denied FUNCTION LOAD, say, would turn the store to scripts quietly.
func checkACLLog(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		log, err := s.Client(t).Do(context.Background(), "acl", "log").Slice()
		if err != nil {
			t.Fatalf("ACL LOG on %s: %v", s.Addr(), err)
		}
		for _, e := range log {
			t.Errorf("%s denied the ACL user: %v", s.Addr(), e)
		}
	}
}

// TestTLSWithACLUser runs the Store, Board, Breakers, Flights, Meters and
// Cells conformance suites over TLS with a private CA and a client
// certificate, as an ACL user limited to aclRules, on one node, through
// Sentinel and on a cluster.
func TestTLSWithACLUser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 6 TLS redis-servers and runs the conformance suites; skipped with -short")
	}
	t.Parallel()
	certs := redistest.NewCerts(t)
	tlsOpt := WithTLS(TLS{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile})
	serverOpts := []redistest.Option{redistest.WithTLS(certs, redistest.ClientCertRequired), withACLUser()}

	// run runs the suites on rawURL, then checks that servers denied the
	// ACL user nothing.
	run := func(t *testing.T, rawURL string, servers ...*redistest.Server) {
		dial := func() (redis.UniversalClient, error) { return NewClient(rawURL, tlsOpt) }
		c, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		s := newStore(c)
		t.Cleanup(func() { _ = s.Close() })
		if err := s.Ping(context.Background()); err != nil {
			t.Fatalf("Ping: %v", err)
		}
		// The suites' tests are parallel: t.Run returns once they ended.
		t.Run("suites", func(t *testing.T) {
			storetest.Run(t, func(testing.TB) limit.Store { return s })
			storetest.RunBoard(t, func(testing.TB) limit.Board { return NewBoard(c) })
			breakertest.Run(t, func(tb testing.TB, n int) []breaker.Store { return replicas(tb, n, dial) })
		})
		// After the others, not beside them: more parallel calls on a busy
		// machine push the breaker suite's calls past the read timeout.
		t.Run("shared", func(t *testing.T) { runShared(t, c) })
		if s.apply.useScripts.Load() {
			t.Error("the store turned to scripts: the ACL user could not load the function")
		}
		checkACLLog(t, servers...)
	}
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, serverOpts...)
		run(t, aclURL("rediss", srv.Addr()), srv)
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		master := redistest.Start(t, serverOpts...)
		sen := redistest.StartSentinel(t, master, "tollgate", redistest.WithTLS(certs, redistest.ClientCertRequired))
		run(t, aclURL("rediss+sentinel", sen.Addr()+"/tollgate"), master)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t, 3, serverOpts...)
		run(t, aclURL("rediss+cluster", strings.Join(c.Addrs(), ",")), c.Servers()...)
	})
}

// TestTLSErrors: a wrong password, a server the CA did not sign, a
// missing client certificate or a wrong server name each fail Ping with an
// error that says so and never holds the password.
func TestTLSErrors(t *testing.T) {
	t.Parallel()
	certs := redistest.NewCerts(t)
	other := redistest.NewCerts(t) // another CA
	srv := redistest.Start(t, redistest.WithTLS(certs, redistest.ClientCertRequired), withACLUser())
	good := TLS{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}
	withName := func(t TLS, name string) TLS { t.ServerName = name; return t }
	tests := []struct {
		name string
		give string
		tls  TLS
		want string
	}{
		{name: "wrong password", give: "rediss://" + aclUser + ":not-" + url.PathEscape(aclPass) + "@" + srv.Addr(),
			tls: good, want: "WRONGPASS"},
		{name: "unknown user", give: "rediss://nobody:" + url.PathEscape(aclPass) + "@" + srv.Addr(), tls: good, want: "WRONGPASS"},
		{name: "server signed by an unknown CA", give: aclURL("rediss", srv.Addr()),
			tls: TLS{CAFile: other.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}, want: "certificate signed by unknown authority"},
		{name: "system roots only", give: aclURL("rediss", srv.Addr()), want: "certificate signed by unknown authority"},
		{name: "no client certificate", give: aclURL("rediss", srv.Addr()), tls: TLS{CAFile: certs.CAFile}, want: "certificate required"},
		{name: "client certificate from another CA", give: aclURL("rediss", srv.Addr()),
			tls: TLS{CAFile: certs.CAFile, CertFile: other.ClientCertFile, KeyFile: other.ClientKeyFile}, want: "tls: unknown certificate authority"},
		{name: "wrong server name", give: aclURL("rediss", srv.Addr()), tls: withName(good, "redis.example"), want: "not redis.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewClient(tt.give, WithTLS(tt.tls))
			if err != nil {
				t.Fatal(err)
			}
			s := newStore(c)
			t.Cleanup(func() { _ = s.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = s.Ping(ctx)
			if err == nil {
				t.Fatal("Ping succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Ping error = %q, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Ping error %q contains the password", err)
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		t.Parallel()
		s, err := NewClient(aclURL("rediss", srv.Addr()), WithTLS(withName(good, "localhost")))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if err := s.Ping(context.Background()).Err(); err != nil {
			t.Fatalf("Ping with the right CA, certificate, name and password: %v", err)
		}
	})
}

// TestTLSOptionErrors: TLS settings that cannot work fail NewClient,
// before anything is dialled.
func TestTLSOptionErrors(t *testing.T) {
	t.Parallel()
	certs := redistest.NewCerts(t)
	const secret = "Sup3rS3cret"
	tests := []struct {
		name string
		give string
		tls  TLS
		want string
	}{
		{name: "CA on a plain URL", give: "redis://u:" + secret + "@h", tls: TLS{CAFile: certs.CAFile}, want: "need a rediss://"},
		{name: "server name on a plain cluster URL", give: "redis+cluster://u:" + secret + "@h", tls: TLS{ServerName: "h"}, want: "need a rediss://"},
		{name: "missing CA file", give: "rediss://u:" + secret + "@h", tls: TLS{CAFile: "/nonexistent/ca.pem"}, want: "TLS CA file: open /nonexistent/ca.pem"},
		{name: "CA file without a certificate", give: "rediss://u:" + secret + "@h", tls: TLS{CAFile: certs.ClientKeyFile}, want: "no PEM certificate"},
		{name: "certificate without key", give: "rediss://u:" + secret + "@h", tls: TLS{CertFile: certs.ClientCertFile}, want: "both its certificate and its key"},
		{name: "key of another certificate", give: "rediss://u:" + secret + "@h",
			tls: TLS{CertFile: certs.ClientCertFile, KeyFile: certs.ServerKeyFile}, want: "private key does not match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewClient(tt.give, WithTLS(tt.tls))
			if err == nil {
				t.Fatal("NewClient: no error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewClient error = %q, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("NewClient error %q contains the password", err)
			}
		})
	}
}
