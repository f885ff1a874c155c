// Package redistest starts real redis-server processes for tests: each on
// its own free loopback port (or a unix socket), without persistence, and
// stopped by the test's cleanup. There is no shared fixed port, so tests
// and packages run in parallel.
package redistest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// readyTimeout bounds how long a new process may take to answer PING.
const readyTimeout = 10 * time.Second

// startAttempts bounds retries when a picked port is taken before
// redis-server binds it.
const startAttempts = 5

// Option configures Start.
type Option func(*config)

type config struct {
	unix    bool
	cluster bool
	// sentinel, when set, runs a Sentinel that monitors this master
	// under the name sentinelName.
	sentinel     *Server
	sentinelName string
	// downAfter, failoverTimeout and quorum, when set, replace
	// Sentinel's defaults (30s, 3min) and redistest's quorum of 1.
	downAfter, failoverTimeout time.Duration
	quorum                     int
	// replicaOf, when set, makes this server a replica of it.
	replicaOf *Server
	// replicas is how many replicas StartCluster gives each master.
	replicas    int
	tls         *Certs
	authClients string
	args        []string
}

// WithUnixSocket makes the server listen on a unix socket in a temporary
// directory instead of a TCP port.
func WithUnixSocket() Option { return func(c *config) { c.unix = true } }

// WithArgs passes extra redis-server arguments, e.g. "--maxmemory", "1mb".
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithReplicaOf makes the server a replica of master (--replicaof).
func WithReplicaOf(master *Server) Option {
	return func(c *config) { c.replicaOf = master }
}

// WithSentinelTimeouts is for StartSentinel: the master is subjectively
// down after downAfter without an answer, and a failover that has not
// ended after failoverTimeout is given up (and may start again after
// twice that). A quorum of quorum sentinels must agree it is down.
// Sentinel's defaults, 30s and 3min, are too slow for a test.
func WithSentinelTimeouts(downAfter, failoverTimeout time.Duration, quorum int) Option {
	return func(c *config) {
		c.downAfter, c.failoverTimeout, c.quorum = downAfter, failoverTimeout, quorum
	}
}

// WithReplicas is for StartCluster: each master gets n replicas.
func WithReplicas(n int) Option { return func(c *config) { c.replicas = n } }

// Server is one redis-server process owned by a test.
type Server struct {
	t   testing.TB
	cfg config
	dir string
	// addr is host:port for TCP or the socket path; busPort is the
	// cluster bus port. Both stay fixed across Restart.
	addr    string
	busPort int

	mu   sync.Mutex
	proc *process
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	out  *TailBuffer
	done chan struct{} // closed once the process has exited and been reaped
}

// Start starts redis-server and waits until it answers PING. The process is
// killed when the test ends. Start fails the test when redis-server is not
// installed: CI installs it, and a silently skipped store test hides bugs.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	s, err := start(t, cfg)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

func start(t testing.TB, cfg config) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH (install Redis 7, e.g. apt-get install redis-server): %w", err)
	}
	s := &Server{t: t, cfg: cfg, dir: t.TempDir()}
	t.Cleanup(s.Kill)
	if cfg.unix {
		dir, err := socketDir(t, s.dir)
		if err != nil {
			return nil, err
		}
		s.addr = filepath.Join(dir, "redis.sock")
		if err := s.spawn(); err != nil {
			return nil, err
		}
		return s, nil
	}
	var err error
	for range startAttempts {
		var port int
		if port, err = freePort(); err != nil {
			return nil, err
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if cfg.cluster {
			if s.busPort, err = freePort(); err != nil {
				return nil, err
			}
		}
		if err = s.spawn(); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("start redis-server after %d attempts: %w", startAttempts, err)
}

// socketDir returns a directory for the socket: dir when the path fits the
// 104-byte limit of sun_path on every platform, else a short one under the
// system temp directory, removed when the test ends.
func socketDir(t testing.TB, dir string) (string, error) {
	if len(dir)+len("/redis.sock") < 100 {
		return dir, nil
	}
	short, err := os.MkdirTemp("", "rt")
	if err != nil {
		return "", fmt.Errorf("socket directory: %w", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	return short, nil
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before redis-server binds it; start retries then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) args() ([]string, error) {
	var a []string
	if s.cfg.sentinel != nil {
		// Sentinel rewrites its configuration file, so it needs one.
		host, port, _ := net.SplitHostPort(s.cfg.sentinel.addr)
		conf := filepath.Join(s.dir, "sentinel.conf")
		name := s.cfg.sentinelName
		body := fmt.Sprintf("sentinel monitor %s %s %s %d\n", name, host, port, max(s.cfg.quorum, 1))
		if d := s.cfg.downAfter; d > 0 {
			body += fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", name, d.Milliseconds())
		}
		if d := s.cfg.failoverTimeout; d > 0 {
			body += fmt.Sprintf("sentinel failover-timeout %s %d\n", name, d.Milliseconds())
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", conf, err)
		}
		a = append(a, conf, "--sentinel")
	}
	a = append(a,
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "",
	)
	if s.cfg.unix {
		a = append(a, "--port", "0", "--unixsocket", s.addr, "--unixsocketperm", "700")
	} else {
		_, port, _ := net.SplitHostPort(s.addr)
		if s.cfg.tls != nil {
			a = append(a, "--bind", "127.0.0.1", "--port", "0", "--tls-port", port)
		} else {
			a = append(a, "--bind", "127.0.0.1", "--port", port)
		}
	}
	a = append(a, s.tlsArgs()...)
	if m := s.cfg.replicaOf; m != nil {
		host, port, _ := net.SplitHostPort(m.addr)
		a = append(a, "--replicaof", host, port)
	}
	if s.cfg.cluster {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-node-timeout", "2000",
		)
	}
	return append(a, s.cfg.args...), nil
}

// spawn runs redis-server and waits for PING; on failure the process is
// gone and the error carries the tail of its log.
func (s *Server) spawn() error {
	args, err := s.args()
	if err != nil {
		return err
	}
	cmd := exec.Command("redis-server", args...)
	out := &TailBuffer{Max: 8 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run redis-server: %w", err)
	}
	p := &process{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err := s.waitReady(p); err != nil {
		s.Kill()
		return fmt.Errorf("redis-server on %s: %w\n%s", s.addr, err, out.String())
	}
	return nil
}

func (s *Server) waitReady(p *process) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	o := s.options()
	o.DialTimeout, o.ReadTimeout, o.MaxRetries, o.PoolSize = 200*time.Millisecond, 500*time.Millisecond, -1, 1
	c := redis.NewClient(o)
	defer c.Close()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return errors.New("exited before answering PING")
		case <-ctx.Done():
			return fmt.Errorf("no answer to PING within %v: %w", readyTimeout, err)
		case <-tick.C:
		}
	}
}

// options are go-redis options that reach the server: over TLS, with the
// client certificate, for a server started WithTLS.
func (s *Server) options() *redis.Options {
	o := &redis.Options{Network: s.network(), Addr: s.addr}
	if s.cfg.tls != nil {
		tc, err := s.cfg.tls.clientTLS()
		if err != nil {
			// The files were written by NewCerts; a failure here is a
			// broken test environment, reported by the first command.
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.TLSConfig = tc
	}
	return o
}

func (s *Server) network() string {
	if s.cfg.unix {
		return "unix"
	}
	return "tcp"
}

// StartSentinel starts a Redis Sentinel that monitors master under name,
// with a quorum of 1 unless WithSentinelTimeouts says otherwise, on its
// own free port. Addr is the Sentinel's. opts may be WithSentinelTimeouts,
// WithTLS and WithArgs.
func StartSentinel(t testing.TB, master *Server, name string, opts ...Option) *Server {
	t.Helper()
	if master.cfg.unix {
		t.Fatalf("redistest: StartSentinel: the master must listen on TCP")
	}
	cfg := config{sentinel: master, sentinelName: name}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := start(t, cfg)
	if err != nil {
		t.Fatalf("redistest: sentinel: %v", err)
	}
	return s
}

// Addr is host:port, or the socket path for a unix socket server.
func (s *Server) Addr() string { return s.addr }

// URL is redis://host:port, rediss://host:port for a server started
// WithTLS, or unix:///path for a unix socket server.
func (s *Server) URL() string {
	switch {
	case s.cfg.unix:
		return "unix://" + s.addr
	case s.cfg.tls != nil:
		return "rediss://" + s.addr
	}
	return "redis://" + s.addr
}

// Client returns a go-redis client for the server, closed when the test
// ends; over TLS with the client certificate for a server started WithTLS.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(s.options())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. It is safe to call more than once.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Restart kills the server if it runs and starts it again on the same
// address and directory. Its data is gone unless it was started with
// persistence (WithArgs("--appendonly", "yes")): nothing is persisted by
// default. A cluster node keeps
// its identity and slots (nodes.conf survives) and rejoins, as a crashed
// node without persistence does. Call it from the test's goroutine; it
// fails the test when the server does not come back.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if s.cfg.unix {
		_ = os.Remove(s.addr)
	}
	if err := s.spawn(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// TailBuffer keeps the last Max bytes written to it, for a process's
// output in failure messages; safe for concurrent use.
type TailBuffer struct {
	Max int

	mu sync.Mutex
	b  []byte
}

func (b *TailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.Max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *TailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(bytes.TrimSpace(b.b))
}

// down reports a server that was killed and not restarted.
func (s *Server) down() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc == nil
}
