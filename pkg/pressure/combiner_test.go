package pressure

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixed float64

func (f fixed) Score(time.Time) float64 { return float64(f) }

// replica is one simulated replica on a shared board.
func replica(t testing.TB, b limit.Board, clock limit.Clock, name string, mode Combine, local Signal) *Combiner {
	t.Helper()
	e, err := NewEvaluator(designPolicy(), clock)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCombiner(CombinerConfig{
		Board: b, Replica: name, Combine: mode, TTL: 3 * time.Second, Clock: clock,
		Scopes: []Scope{{Name: "global", Local: local, Evaluator: e}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCombine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mode   Combine
		scores []float64
		pushed float64 // < 0: none
		want   float64
	}{
		{name: "Max", mode: CombineMax, scores: []float64{0.2, 0.9, 0.4}, pushed: -1, want: 0.9},
		{name: "Mean", mode: CombineMean, scores: []float64{0.2, 0.9, 0.4}, pushed: -1, want: 0.5},
		{name: "PushedHigher", mode: CombineMean, scores: []float64{0.2, 0.4}, pushed: 0.85, want: 0.85},
		{name: "PushedLower", mode: CombineMax, scores: []float64{0.2, 0.4}, pushed: 0.1, want: 0.4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := memstore.NewBoard()
			clock := storetest.NewFakeClock(t0)
			var cs []*Combiner
			for i, s := range tt.scores {
				cs = append(cs, replica(t, b, clock, string(rune('a'+i)), tt.mode, fixed(s)))
			}
			if tt.pushed >= 0 {
				if err := b.Push(context.Background(), t0, "global", tt.pushed, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range cs {
				c.Tick(context.Background())
			}
			got := cs[len(cs)-1].Snapshot()[0]
			if diff := got.Combined - tt.want; diff > 1e-9 || diff < -1e-9 || got.Stale {
				t.Errorf("Combined = %v (stale %v), want %v", got.Combined, got.Stale, tt.want)
			}
		})
	}
}

// TestDeadReplica: a replica that stops publishing stops counting after
// its TTL, and the survivors' evaluators follow (after their hold).
func TestDeadReplica(t *testing.T) {
	t.Parallel()
	b := memstore.NewBoard()
	clock := storetest.NewFakeClock(t0)
	alive := replica(t, b, clock, "alive", CombineMax, fixed(0.1))
	dead := replica(t, b, clock, "dead", CombineMax, fixed(0.95))
	dead.Tick(context.Background())
	alive.Tick(context.Background())
	if s := alive.Snapshot()[0]; s.Combined != 0.95 || s.Outcome.Level != 2 || len(s.Replicas) != 2 {
		t.Fatalf("with both: %+v", s)
	}
	clock.Advance(2999 * time.Millisecond)
	alive.Tick(context.Background())
	if s := alive.Snapshot()[0]; s.Combined != 0.95 {
		t.Fatalf("before the TTL: combined %v, want 0.95", s.Combined)
	}
	clock.Advance(time.Millisecond)
	alive.Tick(context.Background())
	s := alive.Snapshot()[0]
	if s.Combined != 0.1 || len(s.Replicas) != 1 || s.Outcome.Level != 2 {
		t.Fatalf("after the TTL: %+v, want combined 0.1, still held at level 2", s)
	}
	clock.Advance(7 * time.Second)
	alive.Tick(context.Background())
	if s := alive.Snapshot()[0]; s.Outcome.Level != -1 {
		t.Fatalf("after the hold: level %d, want -1", s.Outcome.Level)
	}
}

type failingBoard struct{ limit.Board }

func (failingBoard) Publish(context.Context, time.Time, string, string, float64, time.Duration) error {
	return errors.New("down")
}

func (failingBoard) Scores(context.Context, time.Time, string) (limit.Scores, error) {
	return limit.Scores{}, errors.New("down")
}

// TestStoreDown: the combined score falls back to the local one.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	clock := storetest.NewFakeClock(t0)
	e, _ := NewEvaluator(designPolicy(), clock)
	var errs atomic.Int64
	c, err := NewCombiner(CombinerConfig{
		Board: failingBoard{}, Replica: "r", TTL: time.Second, Clock: clock,
		Scopes:  []Scope{{Name: "global", Local: fixed(0.75), Evaluator: e}},
		OnError: func(string, error) { errs.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Tick(context.Background())
	s := c.Snapshot()[0]
	if !s.Stale || s.Combined != 0.75 || s.Outcome.Level != 0 || errs.Load() != 2 {
		t.Errorf("store down: %+v, %d errors; want stale, 0.75, level 0, 2 errors", s, errs.Load())
	}
}

func TestNewCombinerErrors(t *testing.T) {
	t.Parallel()
	e, _ := NewEvaluator(&Policy{}, limit.SystemClock{})
	_, err := NewCombiner(CombinerConfig{
		Scopes: []Scope{{Name: "g", Evaluator: e}, {Name: "g"}}, Combine: 7,
	})
	for _, want := range []string{"no board", "no replica name", "ttl 0s", "unknown combine 7", `scopes[1]: "g" listed twice`, "scopes[1]: no evaluator"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewCombiner error %v, want it to say %q", err, want)
		}
	}
	if _, err := ParseCombine("median"); err == nil {
		t.Error(`ParseCombine("median") = nil error`)
	}
}

// TestRun ticks on the interval and ends with its context, in a synctest
// bubble (fake time; goleak checks the goroutine ended).
func TestRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := memstore.NewBoard()
		inflight := NewInFlight(10)
		c := replica(t, b, limit.SystemClock{}, "r", CombineMax, Signals{inflight, fixed(0.1)})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { c.Run(ctx, time.Second); close(done) }()
		synctest.Wait()
		if s := c.Snapshot()[0]; s.Combined != 0.1 {
			t.Errorf("first tick: combined %v, want 0.1", s.Combined)
		}
		for range 8 {
			inflight.Inc()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if s := c.Snapshot()[0]; s.Combined != 0.8 || s.Outcome.Level != 1 {
			t.Errorf("after a tick: combined %v level %d, want 0.8 1", s.Combined, s.Outcome.Level)
		}
		cancel()
		<-done
	})
}

func TestInFlight(t *testing.T) {
	t.Parallel()
	f := NewInFlight(4)
	for _, tt := range []struct {
		inc  int
		want float64
	}{{-1, 0}, {1, 0}, {2, 0.5}, {4, 1}, {2, 1}} {
		for range tt.inc {
			f.Inc()
		}
		for range -tt.inc {
			f.Dec()
		}
		if got := f.Score(t0); got != tt.want {
			t.Errorf("after %+d (n=%d): Score = %v, want %v", tt.inc, f.Load(), got, tt.want)
		}
	}
	if got := (Signals{fixed(0.3), fixed(2), fixed(-1)}).Score(t0); got != 1 {
		t.Errorf("Signals clamp = %v, want 1", got)
	}
	if got := (Signals{}).Score(t0); got != 0 {
		t.Errorf("no signals = %v, want 0", got)
	}
}
