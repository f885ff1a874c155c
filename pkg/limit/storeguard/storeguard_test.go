package storeguard

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/limit/storetest"
)

var t0 = time.Unix(1_700_000_000, 0)

// fakeStore answers with err (nil: admitted) and counts its calls; when
// block is set, each call signals entered and waits for block to close.
type fakeStore struct {
	mu      sync.Mutex
	err     error
	calls   atomic.Int64
	block   chan struct{}
	entered chan struct{}
}

func (s *fakeStore) Apply(ctx context.Context, _ time.Time, _ []limit.Charge, _ []limit.Result) (bool, error) {
	s.calls.Add(1)
	s.mu.Lock()
	err, block, entered := s.err, s.block, s.entered
	s.mu.Unlock()
	if block != nil {
		entered <- struct{}{}
		<-block
	}
	return err == nil, err
}

func (s *fakeStore) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

var errDown = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

type netTimeout struct{}

func (netTimeout) Error() string   { return "i/o timeout" }
func (netTimeout) Timeout() bool   { return true }
func (netTimeout) Temporary() bool { return true }

func newGuard(t *testing.T) (*Guard, *fakeStore, *storetest.FakeClock) {
	t.Helper()
	s := &fakeStore{}
	clk := storetest.NewFakeClock(t0)
	return New(s, Options{Clock: clk}), s, clk
}

func apply(g *Guard) error {
	_, err := g.Apply(context.Background(), t0, nil, nil)
	return err
}

func TestOpensAfterConsecutiveFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      []error // the inner store's answers, in order
		wantState State
	}{
		{name: "two errors stay closed", give: []error{errDown, errDown}, wantState: Closed},
		{name: "three errors open", give: []error{errDown, errDown, errDown}, wantState: Open},
		{name: "a success in between resets the count", give: []error{errDown, errDown, nil, errDown, errDown}, wantState: Closed},
		// One slow call on a healthy but busy store must not degrade
		// every decision for a backoff: timeouts count as errors do.
		{name: "one deadline stays closed", give: []error{context.DeadlineExceeded}, wantState: Closed},
		{name: "three deadlines open", give: []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded}, wantState: Open},
		{name: "timeouts and errors add up", give: []error{netTimeout{}, errDown, context.DeadlineExceeded}, wantState: Open},
		{name: "a success between timeouts resets", give: []error{netTimeout{}, netTimeout{}, nil, netTimeout{}, netTimeout{}}, wantState: Closed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, s, _ := newGuard(t)
			for _, e := range tt.give {
				s.fail(e)
				_ = apply(g)
			}
			if got := g.State(); got != tt.wantState {
				t.Errorf("state = %v, want %v", got, tt.wantState)
			}
		})
	}
}

func TestOpenRefusesFastThenProbes(t *testing.T) {
	t.Parallel()
	g, s, clk := newGuard(t)
	s.fail(errDown)
	for range 3 {
		_ = apply(g)
	}
	if g.State() != Open {
		t.Fatalf("state = %v, want open", g.State())
	}
	before := s.calls.Load()
	start := time.Now()
	for range 1000 {
		if err := apply(g); !errors.Is(err, ErrOpen) {
			t.Fatalf("Apply while open = %v, want ErrOpen", err)
		}
	}
	// Generous: 1000 refusals are microseconds each; a Redis call is not.
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("1000 refusals took %v", d)
	}
	if s.calls.Load() != before {
		t.Errorf("the store was called %d times while open", s.calls.Load()-before)
	}
	if g.Refused() != 1000 {
		t.Errorf("Refused = %d, want 1000", g.Refused())
	}

	clk.Advance(DefaultMinBackoff - time.Millisecond)
	if err := apply(g); !errors.Is(err, ErrOpen) {
		t.Fatalf("Apply before the backoff = %v, want ErrOpen", err)
	}
	clk.Advance(time.Millisecond)
	s.fail(nil)
	if err := apply(g); err != nil {
		t.Fatalf("probe = %v, want it through", err)
	}
	if g.State() != Closed {
		t.Errorf("state after a good probe = %v, want closed", g.State())
	}
	if err := apply(g); err != nil {
		t.Errorf("Apply once closed = %v", err)
	}
}

func TestBackoffDoublesToMax(t *testing.T) {
	t.Parallel()
	g, s, clk := newGuard(t)
	s.fail(errDown)
	for range 3 {
		_ = apply(g)
	}
	for _, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		clk.Advance(want - time.Millisecond)
		if err := apply(g); !errors.Is(err, ErrOpen) {
			t.Fatalf("%v into a %v backoff: %v, want ErrOpen", want-time.Millisecond, want, err)
		}
		clk.Advance(time.Millisecond)
		calls := s.calls.Load()
		if err := apply(g); errors.Is(err, ErrOpen) || s.calls.Load() != calls+1 {
			t.Fatalf("after %v: %v, want the probe to reach the store", want, err)
		}
		if g.State() != Open {
			t.Fatalf("state after a failed probe = %v, want open", g.State())
		}
	}
	// A success resets the backoff to its start.
	clk.Advance(time.Second)
	s.fail(nil)
	if err := apply(g); err != nil {
		t.Fatal(err)
	}
	s.fail(errDown)
	for range 3 {
		_ = apply(g)
	}
	clk.Advance(DefaultMinBackoff)
	s.fail(nil)
	if err := apply(g); err != nil {
		t.Errorf("probe after %v = %v, want the backoff back at its start", DefaultMinBackoff, err)
	}
}

func TestOneProbeAtATime(t *testing.T) {
	t.Parallel()
	g, s, clk := newGuard(t)
	s.fail(errDown)
	for range 3 {
		_ = apply(g)
	}
	clk.Advance(DefaultMinBackoff)
	s.fail(nil)
	s.mu.Lock()
	s.block, s.entered = make(chan struct{}), make(chan struct{}, 1)
	block := s.block
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- apply(g) }()
	<-s.entered // the probe is in the store
	if g.State() != HalfOpen {
		t.Errorf("state with a probe in flight = %v, want half-open", g.State())
	}
	var wg sync.WaitGroup
	var through atomic.Int64
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !errors.Is(apply(g), ErrOpen) {
				through.Add(1)
			}
		}()
	}
	wg.Wait()
	if through.Load() != 0 {
		t.Errorf("%d calls went through beside the probe, want none", through.Load())
	}
	close(block)
	if err := <-done; err != nil {
		t.Fatalf("probe = %v", err)
	}
	if g.State() != Closed {
		t.Errorf("state = %v, want closed", g.State())
	}
}

func TestCancellationIsNotAFailure(t *testing.T) {
	t.Parallel()
	g, s, clk := newGuard(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.fail(context.Canceled)
	for range 10 {
		_, _ = g.Apply(ctx, t0, nil, nil)
	}
	if g.State() != Closed {
		t.Fatalf("state after canceled calls = %v, want closed", g.State())
	}

	// A canceled probe leaves the circuit half-open for the next call.
	s.fail(errDown)
	for range 3 {
		_ = apply(g)
	}
	clk.Advance(DefaultMinBackoff)
	s.fail(context.Canceled)
	_, _ = g.Apply(ctx, t0, nil, nil)
	if g.State() != HalfOpen {
		t.Fatalf("state after a canceled probe = %v, want half-open", g.State())
	}
	s.fail(nil)
	if err := apply(g); err != nil || g.State() != Closed {
		t.Errorf("next probe = %v, state %v; want through and closed", err, g.State())
	}
}
