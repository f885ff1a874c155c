// Package redistest starts real redis-server processes for tests: each on
// its own free loopback port (or a unix socket), without persistence, and
// stopped by the test's cleanup. There is no shared fixed port, so tests
// and packages run in parallel.
package redistest

import (
	"bytes"
	"context"
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
	args         []string
}

// WithUnixSocket makes the server listen on a unix socket in a temporary
// directory instead of a TCP port.
func WithUnixSocket() Option { return func(c *config) { c.unix = true } }

// WithArgs passes extra redis-server arguments, e.g. "--maxmemory", "1mb".
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

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
		body := fmt.Sprintf("sentinel monitor %s %s %s 1\n", s.cfg.sentinelName, host, port)
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
		a = append(a, "--bind", "127.0.0.1", "--port", port)
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
	c := redis.NewClient(&redis.Options{
		Network:     s.network(),
		Addr:        s.addr,
		DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond,
		MaxRetries:  -1,
		PoolSize:    1,
	})
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

func (s *Server) network() string {
	if s.cfg.unix {
		return "unix"
	}
	return "tcp"
}

// StartSentinel starts a Redis Sentinel that monitors master under name,
// with a quorum of 1, on its own free port. Addr is the Sentinel's.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	if master.cfg.unix {
		t.Fatalf("redistest: StartSentinel: the master must listen on TCP")
	}
	s, err := start(t, config{sentinel: master, sentinelName: name})
	if err != nil {
		t.Fatalf("redistest: sentinel: %v", err)
	}
	return s
}

// Addr is host:port, or the socket path for a unix socket server.
func (s *Server) Addr() string { return s.addr }

// URL is redis://host:port, or unix:///path for a unix socket server.
func (s *Server) URL() string {
	if s.cfg.unix {
		return "unix://" + s.addr
	}
	return "redis://" + s.addr
}

// Client returns a go-redis client for the server, closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Network: s.network(), Addr: s.addr})
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
// address. Its data is gone: nothing is persisted. A cluster node keeps
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
