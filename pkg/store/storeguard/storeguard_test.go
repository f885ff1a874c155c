package storeguard

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
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

// openIt opens g's circuit: Failures errors spread over FailFor.
func openIt(t *testing.T, g *Guard, s *fakeStore, clk *storetest.FakeClock) {
	t.Helper()
	s.fail(errDown)
	for i := range DefaultFailures {
		if i > 0 {
			clk.Advance(DefaultFailFor / (DefaultFailures - 1))
		}
		_ = apply(g)
	}
	if g.State() != Open {
		t.Fatalf("state = %v, want open", g.State())
	}
}

func TestOpensAfterConsecutiveFailures(t *testing.T) {
	t.Parallel()
	// every is the clock's step between calls when a case does not say:
	// three calls at that pace span FailFor.
	const every = DefaultFailFor / 2
	tests := []struct {
		name      string
		give      []error // the inner store's answers, in order, every apart
		every     time.Duration
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
		// A stall: every call in flight times out in the same instant.
		{name: "many timeouts at one instant stay closed", every: -1, wantState: Closed,
			give: []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded}},
		{name: "timeouts spanning just under FailFor stay closed", every: (DefaultFailFor - time.Millisecond) / 3, wantState: Closed,
			give: []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded}},
		{name: "timeouts spanning FailFor open", every: DefaultFailFor / 4, wantState: Open,
			give: []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded}},
		{name: "a stall's timeouts then a success stay closed", every: -1, wantState: Closed,
			give: []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, s, clk := newGuard(t)
			step := tt.every
			switch {
			case step == 0:
				step = every
			case step < 0:
				step = 0
			}
			for i, e := range tt.give {
				if i > 0 {
					clk.Advance(step)
				}
				s.fail(e)
				_ = apply(g)
			}
			if got := g.State(); got != tt.wantState {
				t.Errorf("state = %v, want %v", got, tt.wantState)
			}
		})
	}
}

// TestOnChange: every change of state is reported once, with the error
// that opened the circuit, and Since tells when it began.
func TestOnChange(t *testing.T) {
	t.Parallel()
	type change struct {
		from, to State
		err      error
	}
	var got []change
	s := &fakeStore{}
	clk := storetest.NewFakeClock(t0)
	g := New(s, Options{Clock: clk, OnChange: func(from, to State, err error) { got = append(got, change{from, to, err}) }})
	openIt(t, g, s, clk)
	if st, since := g.Since(); st != Open || !since.Equal(t0.Add(DefaultFailFor)) {
		t.Errorf("Since = %v %v, want open since %v", st, since, t0.Add(DefaultFailFor))
	}
	clk.Advance(DefaultMinBackoff)
	_ = apply(g) // a failed probe: half-open, then open again
	clk.Advance(2 * DefaultMinBackoff)
	s.fail(nil)
	_ = apply(g) // a good probe: half-open, then closed
	want := []change{
		{Closed, Open, errDown},
		{Open, HalfOpen, nil}, {HalfOpen, Open, errDown},
		{Open, HalfOpen, nil}, {HalfOpen, Closed, nil},
	}
	if len(got) != len(want) {
		t.Fatalf("changes = %v, want %v", got, want)
	}
	for i := range want {
		if got[i].from != want[i].from || got[i].to != want[i].to || !errors.Is(got[i].err, want[i].err) {
			t.Errorf("change %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestOpenRefusesFastThenProbes(t *testing.T) {
	t.Parallel()
	g, s, clk := newGuard(t)
	openIt(t, g, s, clk)
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
	openIt(t, g, s, clk)
	for _, want := range []time.Duration{100, 200, 250, 250} {
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
	openIt(t, g, s, clk)
	clk.Advance(DefaultMinBackoff)
	s.fail(nil)
	if err := apply(g); err != nil {
		t.Errorf("probe after %v = %v, want the backoff back at its start", DefaultMinBackoff, err)
	}
}

func TestOneProbeAtATime(t *testing.T) {
	t.Parallel()
	g, s, clk := newGuard(t)
	openIt(t, g, s, clk)
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
	openIt(t, g, s, clk)
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

// TestRetryProbesAtOnce: Retry, told the store answers again, lets the
// next call probe before the backoff ends; a closed circuit, or one
// already half-open, is left as it is.
func TestRetryProbesAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      func(*Guard)
		wantState State
	}{
		{name: "no retry: refused in the backoff", give: func(*Guard) {}, wantState: Open},
		{name: "retry: the next call probes and closes", give: (*Guard).Retry, wantState: Closed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, s, clk := newGuard(t)
			openIt(t, g, s, clk)
			// A long backoff, as after a long outage.
			for range 4 {
				clk.Advance(time.Second)
				_ = apply(g)
			}
			clk.Advance(time.Millisecond)
			s.fail(nil)
			tt.give(g)
			calls := s.calls.Load()
			err := apply(g)
			if got := g.State(); got != tt.wantState {
				t.Errorf("state = %v (err %v), want %v", got, err, tt.wantState)
			}
			wantCalls := calls
			if tt.wantState == Closed {
				wantCalls++
			}
			if got := s.calls.Load(); got != wantCalls {
				t.Errorf("store calls = %d, want %d", got, wantCalls)
			}
		})
	}
	g, s, _ := newGuard(t)
	g.Retry() // closed: nothing to do
	if err := apply(g); err != nil || g.State() != Closed || s.calls.Load() != 1 {
		t.Errorf("closed after Retry: %v, %v, %d calls; want closed, 1 call", err, g.State(), s.calls.Load())
	}
}
