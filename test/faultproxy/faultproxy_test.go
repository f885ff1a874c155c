package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// quiet is how long a read must see nothing for a held connection:
	// short, because every test waits it out.
	quiet = 100 * time.Millisecond
	// prompt bounds how long a read may take when bytes should flow.
	prompt = 2 * time.Second
)

// echo starts a server that writes back what it reads, until the test ends.
func echo(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, prompt)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads it back within prompt, returning how
// long it took.
func roundTrip(t testing.TB, c net.Conn, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	readBack(t, c, msg)
	return time.Since(start)
}

func readBack(t testing.TB, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(prompt))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %q: %v", want, err)
	}
	if string(got) != want {
		t.Fatalf("read back %q, want %q", got, want)
	}
}

// readNothing checks that c stays open and silent for quiet.
func readNothing(t testing.TB, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(quiet))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read on a held connection = %d bytes, %v; want a timeout", n, err)
	}
}

func TestPass(t *testing.T) {
	t.Parallel()
	p := New(t, echo(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "ping")
	// More than the queue holds, so the two directions push back on
	// each other, and in chunks the reader splits.
	big := bytes.Repeat([]byte("0123456789abcdef"), (queueChunks+8)*chunkSize/16)
	go func() { _, _ = c.Write(big) }()
	_ = c.SetReadDeadline(time.Now().Add(prompt))
	got := make([]byte, len(big))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %d bytes back: %v", len(big), err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("big payload came back changed")
	}
	// A half close reaches the server, whose close comes back as EOF.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read after half close = %d, %v; want EOF", n, err)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		up, down time.Duration
	}{
		{name: "to the target", up: 60 * time.Millisecond},
		{name: "back to the client", down: 60 * time.Millisecond},
		{name: "both ways", up: 30 * time.Millisecond, down: 40 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := New(t, echo(t))
			c := dial(t, p.Addr())
			roundTrip(t, c, "warm")
			p.Latency(tt.up, tt.down)
			want := tt.up + tt.down
			if got := roundTrip(t, c, "slow"); got < want {
				t.Errorf("round trip with latency %v+%v took %v, want at least %v", tt.up, tt.down, got, want)
			}
			// A connection made under latency is delayed the same way.
			if got := roundTrip(t, dial(t, p.Addr()), "new"); got < want {
				t.Errorf("round trip on a new connection took %v, want at least %v", got, want)
			}
			// Chunks are delayed from when each was read, not one after
			// the other: five writes 10ms apart come back within one
			// delay of the last, far less than five delays.
			start := time.Now()
			for range 5 {
				if _, err := c.Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			readBack(t, c, "xxxxx")
			if got, most := time.Since(start), 5*want; got >= most {
				t.Errorf("five chunks 10ms apart took %v, want well under %v", got, most)
			}
		})
	}
}

func TestPassReleasesDelayedChunks(t *testing.T) {
	t.Parallel()
	p := New(t, echo(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm")
	// Far longer than prompt: the echo can only come back in time if Pass
	// lets the queued chunks go at once.
	p.Latency(time.Minute, time.Minute)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	readNothing(t, c)
	p.Pass()
	readBack(t, c, "held")
}

func TestBlackhole(t *testing.T) {
	t.Parallel()
	p := New(t, echo(t))
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")
	p.Blackhole()
	if _, err := old.Write([]byte("held")); err != nil {
		t.Fatalf("write into the blackhole: %v", err)
	}
	// A new connection is accepted, then goes nowhere.
	fresh := dial(t, p.Addr())
	if _, err := fresh.Write([]byte("fresh")); err != nil {
		t.Fatalf("write on a new connection into the blackhole: %v", err)
	}
	readNothing(t, old)
	readNothing(t, fresh)
	if got := p.Conns(); got != 2 {
		t.Errorf("Conns() = %d in a blackhole, want 2 (kept open)", got)
	}
	// Nothing was lost: the held bytes arrive once it passes again.
	p.Pass()
	readBack(t, old, "held")
	readBack(t, fresh, "fresh")
	roundTrip(t, old, "after")
}

func TestReset(t *testing.T) {
	t.Parallel()
	p := New(t, echo(t))
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")
	p.Reset()
	_ = old.SetReadDeadline(time.Now().Add(prompt))
	if _, err := old.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read on a reset connection: %v, want ECONNRESET", err)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), prompt); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			_ = c.Close()
		}
		t.Errorf("dial while resetting: %v, want ECONNREFUSED", err)
	}
	if got := p.Conns(); got != 0 {
		t.Errorf("Conns() = %d after a reset, want 0", got)
	}
	p.Pass()
	roundTrip(t, dial(t, p.Addr()), "after")
}

func TestTargetDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Closed only once the proxy has its own port, which must not be this one.
	p := New(t, ln.Addr().String())
	_ = ln.Close()
	// The reset may come before the client's connect returns, or after.
	c, err := net.DialTimeout("tcp", p.Addr(), prompt)
	if err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(prompt))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("connect and read through a proxy to a dead target: %v, want ECONNRESET", err)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	p := New(t, echo(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "before")
	p.Blackhole()
	held := dial(t, p.Addr())
	p.Close()
	for _, c := range []net.Conn{c, held} {
		_ = c.SetReadDeadline(time.Now().Add(prompt))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read after Close: %v, want the connection gone", err)
		}
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), prompt); err == nil {
		_ = c.Close()
		t.Error("dial after Close succeeded")
	}
	p.Close() // twice is fine
	p.Pass()  // and a mode change after it does nothing
	p.Blackhole()
}
