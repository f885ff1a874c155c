package redisstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redial defaults.
const (
	// RedialInterval is how often a Redis address known to be down is
	// probed, while the client is asked for connections to it.
	RedialInterval = 100 * time.Millisecond
	// ProbeTimeout bounds one probe: its dial and its PING.
	ProbeTimeout = 250 * time.Millisecond
)

// ErrLinkDown is wrapped by the errors of commands refused, without a
// dial, because their Redis address is known to be down.
var ErrLinkDown = errors.New("redis is down")

// redialer is the dialer of every connection NewClient's client makes, to
// data nodes and sentinels alike. It keeps go-redis's pool from ever
// seeing a failed dial, and takes over what go-redis does with one.
//
// go-redis counts each failed dial in its pool, never forgets one while
// dials succeed, and once the count reaches the pool's size fails every
// Get at once with the last dial error, until a background redial that
// retries a fixed second apart succeeds. A Redis restart under load
// saturates that count within milliseconds (each decision, beat and
// board read dials), so nothing worked for up to a second after Redis
// was back (issue 13 measured 0.24-1.24 s); and over a process's life,
// dials that merely outlived a decision's deadline add up to the same.
//
// So a dial that fails returns a connection that fails instead: its
// command fails with the dial's error, the pool drops the connection,
// and nothing is counted. The address is then known down: its dials are
// refused at once, without touching the network, and at most every
// RedialInterval one of them starts a probe (a dial and a PING on its
// own connection, within ProbeTimeout). The first probe that Redis
// answers marks the address up, and the next command dials afresh.
type redialer struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	interval time.Duration
	timeout  time.Duration
	// onUp, when set, is told each time an address comes back up; it
	// must not block.
	onUp func()

	mu   sync.Mutex
	down map[string]*downLink // by address
}

// downLink is an address known to be down.
type downLink struct {
	err       error     // why: the last dial or probe error
	nextProbe time.Time // no probe starts before
	probing   bool
}

func newRedialer(dialTimeout time.Duration, tc *tls.Config, onUp func()) *redialer {
	return &redialer{
		dial:     redis.NewDialer(&redis.Options{DialTimeout: dialTimeout, TLSConfig: tc}),
		interval: RedialInterval,
		timeout:  min(ProbeTimeout, dialTimeout),
		onUp:     onUp,
		down:     map[string]*downLink{},
	}
}

// Dial is the go-redis Dialer. It never returns an error: see redialer.
func (r *redialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if err := r.refuse(network, addr); err != nil {
		return &failedConn{err: err, addr: linkAddr{network, addr}}, nil
	}
	c, err := r.dial(ctx, network, addr)
	if err == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		// The dial ran out of time: Redis's or the caller's, whose
		// deadline may be a decision's few milliseconds. A probe with
		// its own time tells which.
		r.check(network, addr, err)
	} else {
		r.markDown(network, addr, err)
	}
	return &failedConn{err: err, addr: linkAddr{network, addr}}, nil
}

// refuse returns the error for a dial to an address known down, and
// starts a probe when one is due; nil when the address is not down.
func (r *redialer) refuse(network, addr string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.down[addr]
	if l == nil {
		return nil
	}
	if !l.probing && !time.Now().Before(l.nextProbe) {
		l.probing = true
		go r.probe(network, addr)
	}
	return fmt.Errorf("%w at %s (probed every %v): %w", ErrLinkDown, addr, r.interval, l.err)
}

// markDown records addr as down and probes it at once: a restart can be
// quicker than the interval.
func (r *redialer) markDown(network, addr string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.down[addr]; l != nil {
		l.err = err
		return
	}
	r.down[addr] = &downLink{err: err, probing: true}
	go r.probe(network, addr)
}

// check probes addr, which is not known down, once; a failed probe marks
// it down.
func (r *redialer) check(network, addr string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down[addr] != nil {
		return
	}
	r.down[addr] = &downLink{err: err, probing: true, nextProbe: time.Now()}
	go r.probe(network, addr)
}

// probe pings addr on a connection of its own and records the outcome.
func (r *redialer) probe(network, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	err := r.ping(ctx, network, addr)
	cancel()
	r.mu.Lock()
	l := r.down[addr]
	if err == nil {
		delete(r.down, addr)
	} else {
		l.err, l.probing, l.nextProbe = err, false, time.Now().Add(r.interval)
	}
	r.mu.Unlock()
	if err == nil && r.onUp != nil {
		r.onUp()
	}
}

// ping dials addr and sends PING. Any reply but LOADING counts as up: a
// server that wants AUTH first answers NOAUTH, which still shows it
// serves; the pool's connections authenticate as they are made.
func (r *redialer) ping(ctx context.Context, network, addr string) error {
	c, err := r.dial(ctx, network, addr)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return fmt.Errorf("probe PING: %w", err)
	}
	// ReadSlice stops at the buffer's size: a server cannot make the
	// probe read without bound.
	line, err := bufio.NewReaderSize(c, 64).ReadSlice('\n')
	if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
		return fmt.Errorf("probe PING reply: %w", err)
	}
	if bytes.HasPrefix(line, []byte("-LOADING")) {
		return errors.New("probe PING: redis is loading its dataset")
	}
	return nil
}

// failedConn is the connection a failed or refused dial returns, in place
// of the error go-redis would count: every read and write fails with the
// dial's error, so the handshake or command on it does, and go-redis
// removes it. SyscallConn fails too, so that one the pool keeps idle (its
// minimum idle connections are dialled in the background) is found
// unhealthy and dropped by the pool's check before use.
type failedConn struct {
	err  error
	addr linkAddr
}

var (
	_ net.Conn     = (*failedConn)(nil)
	_ syscall.Conn = (*failedConn)(nil)
	_ net.Addr     = linkAddr{}
)

func (c *failedConn) Read([]byte) (int, error)              { return 0, c.err }
func (c *failedConn) Write([]byte) (int, error)             { return 0, c.err }
func (c *failedConn) Close() error                          { return nil }
func (c *failedConn) LocalAddr() net.Addr                   { return linkAddr{c.addr.network, ""} }
func (c *failedConn) RemoteAddr() net.Addr                  { return c.addr }
func (c *failedConn) SetDeadline(time.Time) error           { return nil }
func (c *failedConn) SetReadDeadline(time.Time) error       { return nil }
func (c *failedConn) SetWriteDeadline(time.Time) error      { return nil }
func (c *failedConn) SyscallConn() (syscall.RawConn, error) { return nil, c.err }

// linkAddr is a dialled address; go-redis's Sentinel client compares a
// connection's RemoteAddr with the master's address.
type linkAddr struct{ network, addr string }

func (a linkAddr) Network() string { return a.network }
func (a linkAddr) String() string  { return a.addr }
