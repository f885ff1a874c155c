// Package faultproxy is a TCP proxy for tests, on loopback, to put between
// a client and a server (Tollgate and Redis) and switch at run time
// between passing bytes, delaying them, holding them (a blackhole) and
// resetting connections, the network faults a process-level test cannot
// make by killing the server.
package faultproxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

const (
	// dialTimeout bounds the connection to the target. On loopback a live
	// target answers at once and a dead one refuses at once.
	dialTimeout = time.Second
	// chunkSize is the most one read takes from a connection.
	chunkSize = 32 << 10
	// queueChunks is how many chunks a direction holds before it stops
	// reading, so that a held (blackholed or delayed) sender is pushed back
	// by TCP as it would be by a real network, not buffered without bound.
	queueChunks = 64
	// closeTimeout bounds how long Close waits for the proxy's goroutines.
	closeTimeout = 5 * time.Second
)

type mode int

const (
	modePass mode = iota
	modeBlackhole
	modeReset
)

// state is what the proxy does to bytes now. up and down are the delays
// added, in pass mode, to each chunk going to the target and coming back.
type state struct {
	mode     mode
	up, down time.Duration
}

// Proxy forwards connections accepted on Addr to a target. Its methods are
// safe for concurrent use. It starts in pass mode.
type Proxy struct {
	t      testing.TB
	target string
	addr   string
	done   chan struct{} // closed by Close

	mu sync.Mutex
	st state
	// changed is closed and replaced on every change of st, to wake the
	// goroutines waiting on the old one.
	changed chan struct{}
	ln      net.Listener // nil while resetting and once closed
	links   map[*link]struct{}
	closed  bool

	wg sync.WaitGroup
}

// link is one client connection and, once dialed, its connection to the
// target.
type link struct {
	client, upstream net.Conn
	dead             chan struct{} // closed by abort
	aborted          bool          // guarded by Proxy.mu
}

// New starts a proxy to target (host:port) on a free 127.0.0.1 port, in
// pass mode. It is closed, with every connection, when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{
		t:       t,
		target:  target,
		addr:    ln.Addr().String(),
		done:    make(chan struct{}),
		changed: make(chan struct{}),
		links:   map[*link]struct{}{},
	}
	p.mu.Lock()
	p.serve(ln)
	p.mu.Unlock()
	t.Cleanup(p.Close)
	return p
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.addr }

// Pass forwards bytes as they come, without added latency. Bytes held by
// a blackhole or a delay are sent on at once.
func (p *Proxy) Pass() { p.set(state{mode: modePass}) }

// Latency delays every chunk read from one side by up (to the target) or
// down (back to the client) before it is written to the other: each chunk
// by that much after it was read, not one after the other, like a link
// with that one-way delay.
func (p *Proxy) Latency(up, down time.Duration) {
	p.set(state{mode: modePass, up: up, down: down})
}

// Blackhole keeps every connection open and forwards nothing either way,
// as a network that drops every packet would: no FIN, no RST, and new
// connections are accepted (the kernel completes the handshake) but go
// nowhere. What is held is delivered when the mode changes back.
func (p *Proxy) Blackhole() { p.set(state{mode: modeBlackhole}) }

// Reset closes every connection with an RST, both to the client and to
// the target, and refuses new ones (the port stops listening) until the
// mode changes. Leaving it listens on the same port again, which fails the
// test in the unlikely case another socket took the port meanwhile.
func (p *Proxy) Reset() { p.set(state{mode: modeReset}) }

// Conns is the number of client connections open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

func (p *Proxy) set(st state) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	was := p.st.mode
	p.st = st
	close(p.changed)
	p.changed = make(chan struct{})
	switch {
	case st.mode == modeReset && was != modeReset:
		if p.ln != nil {
			_ = p.ln.Close()
			p.ln = nil
		}
		for l := range p.links {
			p.abortLocked(l)
		}
	case st.mode != modeReset && was == modeReset:
		ln, err := listenAgain(p.addr)
		if err != nil {
			p.t.Errorf("faultproxy: listen on %s again after a reset: %v", p.addr, err)
			return
		}
		p.serve(ln)
	}
}

// listenAgain binds addr again, retrying for a moment: the listener just
// closed may not have released it yet.
func listenAgain(addr string) (net.Listener, error) {
	var err error
	for range 20 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil, err
}

// serve accepts on ln until it is closed. Called with p.mu held.
func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.closed || p.ln != ln {
				p.mu.Unlock()
				abortConn(c)
				continue
			}
			l := &link{client: c, dead: make(chan struct{})}
			p.links[l] = struct{}{}
			p.wg.Go(func() { p.run(l) })
			p.mu.Unlock()
		}
	})
}

// run dials the target for l and pumps both directions until both end
// or l is aborted.
func (p *Proxy) run(l *link) {
	defer p.drop(l)
	// A blackhole holds a new connection before it reaches the target, as
	// a network dropping its packets would.
	if !p.wait(l, func(st state) (time.Duration, bool) { return 0, st.mode == modePass }) {
		return
	}
	up, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		// The target is down: the client sees its connection reset.
		p.abort(l)
		return
	}
	p.mu.Lock()
	if l.aborted {
		p.mu.Unlock()
		abortConn(up)
		return
	}
	l.upstream = up
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(l, l.client, up, func(st state) time.Duration { return st.up }) })
	wg.Go(func() { p.pipe(l, up, l.client, func(st state) time.Duration { return st.down }) })
	wg.Wait()
}

// chunk is what one read returned; eof marks the end of the direction.
type chunk struct {
	data []byte
	at   time.Time
	eof  bool
}

// pipe copies src to dst, each chunk when the state lets it through. A
// reader goroutine takes chunks as they come, so that a chunk's delay runs
// from when it was read.
func (p *Proxy) pipe(l *link, src, dst net.Conn, delay func(state) time.Duration) {
	q := make(chan chunk, queueChunks)
	// Every way out of the loop below aborts l or follows the reader's
	// own end, so the reader is gone soon after.
	var reader sync.WaitGroup
	defer reader.Wait()
	reader.Go(func() {
		buf := make([]byte, chunkSize)
		for {
			n, err := src.Read(buf)
			c := chunk{at: time.Now()}
			if n > 0 {
				c.data = append([]byte(nil), buf[:n]...)
			}
			c.eof = err != nil
			select {
			case q <- c:
			case <-l.dead:
				return
			}
			if err != nil {
				return
			}
		}
	})
	for {
		var c chunk
		select {
		case c = <-q:
		case <-l.dead:
			return
		}
		due := func(st state) (time.Duration, bool) {
			return time.Until(c.at.Add(delay(st))), st.mode == modePass
		}
		if !p.wait(l, due) {
			return
		}
		if len(c.data) > 0 {
			if _, err := dst.Write(c.data); err != nil {
				p.abort(l)
				return
			}
		}
		if c.eof {
			// Pass the end on (a half close) and let the other direction
			// finish on its own.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// wait blocks until ready says the state lets l's bytes through and the
// delay it returns has passed, re-asking on every change of state. It
// returns false when l is aborted or the proxy closed.
func (p *Proxy) wait(l *link, ready func(state) (time.Duration, bool)) bool {
	for {
		p.mu.Lock()
		st, changed, closed := p.st, p.changed, p.closed
		p.mu.Unlock()
		if closed || st.mode == modeReset {
			return false
		}
		d, ok := ready(st)
		if ok && d <= 0 {
			return true
		}
		var timer *time.Timer
		var fired <-chan time.Time
		if ok {
			timer = time.NewTimer(d)
			fired = timer.C
		}
		var stop bool
		select {
		case <-fired:
			return true
		case <-changed:
		case <-l.dead:
			stop = true
		case <-p.done:
			stop = true
		}
		if timer != nil {
			timer.Stop()
		}
		if stop {
			return false
		}
	}
}

// abort closes l's connections with an RST and forgets it.
func (p *Proxy) abort(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abortLocked(l)
}

func (p *Proxy) abortLocked(l *link) {
	if l.aborted {
		return
	}
	l.aborted = true
	delete(p.links, l)
	close(l.dead)
	abortConn(l.client)
	if l.upstream != nil {
		abortConn(l.upstream)
	}
}

// drop forgets l and closes what is left of it.
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
	if !l.aborted {
		l.aborted = true
		close(l.dead)
		_ = l.client.Close()
		if l.upstream != nil {
			_ = l.upstream.Close()
		}
	}
}

// abortConn closes c so that the peer reads a reset, not an end of file.
func abortConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// Close stops listening, resets every connection and waits, bounded, for
// the proxy's goroutines. New registers it as a cleanup; calling it again
// does nothing.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for l := range p.links {
		p.abortLocked(l)
	}
	p.mu.Unlock()
	stopped := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(closeTimeout):
		p.t.Errorf("faultproxy: %s: goroutines still running %v after Close", p.addr, closeTimeout)
	}
}
