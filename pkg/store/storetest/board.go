package storetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// RunBoard runs the limit.Board conformance suite against boards made by
// newBoard. Each subtest uses scopes unique to it, and times a day apart
// from the others', so newBoard may return the same board every time.
func RunBoard(t *testing.T, newBoard func(testing.TB) limit.Board) {
	t.Run("PublishAndRead", func(t *testing.T) { t.Parallel(); testBoardPublish(t, newBoard(t), 0) })
	t.Run("Expiry", func(t *testing.T) { t.Parallel(); testBoardExpiry(t, newBoard(t), 1) })
	t.Run("DeadReplica", func(t *testing.T) { t.Parallel(); testBoardDeadReplica(t, newBoard(t), 2) })
	t.Run("Pushed", func(t *testing.T) { t.Parallel(); testBoardPushed(t, newBoard(t), 3) })
	t.Run("ScopesIndependent", func(t *testing.T) { t.Parallel(); testBoardScopes(t, newBoard(t), 4) })
	t.Run("BadWrites", func(t *testing.T) { t.Parallel(); testBoardBad(t, newBoard(t), 5) })
	t.Run("Concurrent", func(t *testing.T) { t.Parallel(); testBoardConcurrent(t, newBoard(t), 6) })
}

// boardEnv is one subtest's board, time origin and scope prefix.
type boardEnv struct {
	tb     testing.TB
	b      limit.Board
	t0     time.Time
	prefix string
}

func newBoardEnv(tb testing.TB, b limit.Board, day int) *boardEnv {
	return &boardEnv{tb: tb, b: b, t0: base.Add(time.Duration(day) * 24 * time.Hour), prefix: tb.Name() + "/"}
}

func (e *boardEnv) scope(s string) string { return e.prefix + s }

func (e *boardEnv) at(ms int64) time.Time { return e.t0.Add(time.Duration(ms) * time.Millisecond) }

func (e *boardEnv) publish(ms int64, scope, replica string, score float64, ttl time.Duration) {
	e.tb.Helper()
	if err := e.b.Publish(context.Background(), e.at(ms), e.scope(scope), replica, score, ttl); err != nil {
		e.tb.Fatalf("Publish(%d, %q, %q, %v, %v): %v", ms, scope, replica, score, ttl, err)
	}
}

func (e *boardEnv) push(ms int64, scope string, score float64, ttl time.Duration) {
	e.tb.Helper()
	if err := e.b.Push(context.Background(), e.at(ms), e.scope(scope), score, ttl); err != nil {
		e.tb.Fatalf("Push(%d, %q, %v, %v): %v", ms, scope, score, ttl, err)
	}
}

func (e *boardEnv) want(ms int64, scope string, want limit.Scores) {
	e.tb.Helper()
	got, err := e.b.Scores(context.Background(), e.at(ms), e.scope(scope))
	if err != nil {
		e.tb.Fatalf("Scores(%d, %q): %v", ms, scope, err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		e.tb.Errorf("Scores(%d, %q) (-want +got):\n%s", ms, scope, diff)
	}
}

func replicas(kv ...any) limit.Scores {
	var s limit.Scores
	for i := 0; i+1 < len(kv); i += 2 {
		s.Replicas = append(s.Replicas, limit.ReplicaScore{Replica: kv[i].(string), Score: kv[i+1].(float64)})
	}
	return s
}

func testBoardPublish(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	e.want(0, "g", limit.Scores{})
	e.publish(0, "g", "b", 0.25, time.Minute)
	e.publish(0, "g", "a", 0.5, time.Minute)
	e.publish(0, "g", "c", 0.1234567890123, time.Minute)
	e.want(1, "g", replicas("a", 0.5, "b", 0.25, "c", 0.1234567890123))
	// Publishing again replaces the entry, score and expiry.
	e.publish(10, "g", "a", 1, time.Minute)
	e.publish(10, "g", "b", 0, time.Minute)
	e.want(11, "g", replicas("a", 1.0, "b", 0.0, "c", 0.1234567890123))
	e.publish(20, "g", "a", 0.75, 10*time.Millisecond)
	e.want(29, "g", replicas("a", 0.75, "b", 0.0, "c", 0.1234567890123))
	e.want(30, "g", replicas("b", 0.0, "c", 0.1234567890123))
}

func testBoardExpiry(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	e.publish(0, "g", "a", 0.5, 100*time.Millisecond)
	// A sub-millisecond remainder rounds the expiry up.
	e.publish(0, "g", "b", 0.5, 1500*time.Microsecond)
	e.want(0, "g", replicas("a", 0.5, "b", 0.5))
	e.want(1, "g", replicas("a", 0.5, "b", 0.5))
	e.want(2, "g", replicas("a", 0.5))
	e.want(99, "g", replicas("a", 0.5))
	e.want(100, "g", limit.Scores{})
	// A reader behind the writer still sees the entry.
	e.publish(1000, "g", "a", 0.5, time.Millisecond)
	e.want(900, "g", replicas("a", 0.5))
	e.want(1001, "g", limit.Scores{})
}

// testBoardDeadReplica: a replica that stops publishing stops counting
// once its TTL runs out, while the others, republishing, stay.
func testBoardDeadReplica(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	const ttl = 3 * time.Second
	for ms := int64(0); ms <= 10_000; ms += 1000 {
		e.publish(ms, "g", "alive", 0.2, ttl)
		if ms <= 4000 {
			e.publish(ms, "g", "dead", 0.9, ttl)
		}
		if ms < 7000 {
			e.want(ms, "g", replicas("alive", 0.2, "dead", 0.9))
		} else {
			e.want(ms, "g", replicas("alive", 0.2))
		}
	}
}

func testBoardPushed(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	e.push(0, "g", 0.85, time.Second)
	e.want(0, "g", limit.Scores{Pushed: 0.85, HasPushed: true})
	e.publish(0, "g", "a", 0.1, time.Minute)
	e.want(999, "g", limit.Scores{Replicas: []limit.ReplicaScore{{Replica: "a", Score: 0.1}}, Pushed: 0.85, HasPushed: true})
	e.want(1000, "g", replicas("a", 0.1))
	// Pushing again replaces the pushed score and its expiry.
	e.push(2000, "g", 0.95, time.Minute)
	e.push(2001, "g", 0.5, 10*time.Millisecond)
	e.want(2010, "g", limit.Scores{Replicas: []limit.ReplicaScore{{Replica: "a", Score: 0.1}}, Pushed: 0.5, HasPushed: true})
	e.want(2011, "g", replicas("a", 0.1))
	e.push(3000, "g", 0, time.Second)
	e.want(3000, "g", limit.Scores{Replicas: []limit.ReplicaScore{{Replica: "a", Score: 0.1}}, Pushed: 0, HasPushed: true})
}

func testBoardScopes(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	// Scope names that look like another scope's key suffix stay apart.
	e.publish(0, "m", "a", 0.5, time.Minute)
	e.push(0, "m", 0.6, time.Minute)
	e.publish(0, "pushed:m", "a", 0.7, time.Minute)
	e.publish(0, "m:x", "a", 0.8, time.Minute)
	e.push(0, "llama3:8b", 0.9, time.Minute)
	e.want(1, "m", limit.Scores{Replicas: []limit.ReplicaScore{{Replica: "a", Score: 0.5}}, Pushed: 0.6, HasPushed: true})
	e.want(1, "pushed:m", replicas("a", 0.7))
	e.want(1, "m:x", replicas("a", 0.8))
	e.want(1, "llama3:8b", limit.Scores{Pushed: 0.9, HasPushed: true})
	e.want(1, "other", limit.Scores{})
}

func testBoardBad(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	ctx := context.Background()
	now := e.at(0)
	tests := []struct {
		name    string
		scope   string
		replica string
		score   float64
		ttl     time.Duration
	}{
		{name: "EmptyScope", scope: "", replica: "a", score: 0.5, ttl: time.Second},
		{name: "NaN", scope: e.scope("g"), replica: "a", score: math.NaN(), ttl: time.Second},
		{name: "Negative", scope: e.scope("g"), replica: "a", score: -0.1, ttl: time.Second},
		{name: "AboveOne", scope: e.scope("g"), replica: "a", score: 1.01, ttl: time.Second},
		{name: "Inf", scope: e.scope("g"), replica: "a", score: math.Inf(1), ttl: time.Second},
		{name: "ZeroTTL", scope: e.scope("g"), replica: "a", score: 0.5, ttl: 0},
		{name: "SubMillisecondTTL", scope: e.scope("g"), replica: "a", score: 0.5, ttl: time.Microsecond},
	}
	for _, tt := range tests {
		if err := b.Publish(ctx, now, tt.scope, tt.replica, tt.score, tt.ttl); err == nil {
			t.Errorf("%s: Publish = nil, want an error", tt.name)
		}
		if err := b.Push(ctx, now, tt.scope, tt.score, tt.ttl); err == nil {
			t.Errorf("%s: Push = nil, want an error", tt.name)
		}
	}
	if err := b.Publish(ctx, now, e.scope("g"), "", 0.5, time.Second); err == nil {
		t.Error("Publish with an empty replica = nil, want an error")
	}
	e.want(0, "g", limit.Scores{})
}

func testBoardConcurrent(t *testing.T, b limit.Board, day int) {
	e := newBoardEnv(t, b, day)
	const n, rounds = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, n*rounds*2)
	for i := range n {
		wg.Go(func() {
			for r := range rounds {
				now := e.at(int64(r))
				if err := b.Publish(context.Background(), now, e.scope("g"), fmt.Sprint("r", i), float64(i)/n, time.Minute); err != nil {
					errs <- err
				}
				if _, err := b.Scores(context.Background(), now, e.scope("g")); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var want limit.Scores
	for i := range n {
		want.Replicas = append(want.Replicas, limit.ReplicaScore{Replica: fmt.Sprint("r", i), Score: float64(i) / n})
	}
	e.want(rounds, "g", want)
}
