package admission

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// TestGatedStatus: a denial by a fair gate (the shared limit had room,
// kept for a member owed it) is marked Gated; a denial by the counter
// itself is not.
func TestGatedStatus(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rs, err := limit.NewRuleSet(&limit.Domain{
			Name: "d",
			Descriptors: []*limit.Rule{{Key: "model", Value: "m",
				RateLimit: &limit.Limit{Amount: 2, Unit: limit.Second, Algorithm: limit.FixedWindow},
				Fair: &limit.FairShare{Key: "tenant", Weights: map[string]float64{"a": 1, "b": 1}, DefaultWeight: 1,
					Rate: &limit.FairPolicy{Backlog: 5 * time.Second, Quantum: 1, Credit: 5, MaxKeys: 16}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		l := NewLimiter(memstore.New(), nil, rs)
		ask := func(tenant string) *Decision {
			t.Helper()
			dec, err := l.Decide(context.Background(), &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
				{Entries: entries("model", "m")}, {Entries: entries("tenant", tenant)},
			}})
			if err != nil {
				t.Fatal(err)
			}
			return dec
		}
		time.Sleep(time.Second - time.Duration(time.Now().UnixNano())%time.Second) // a window's start
		// a takes the window's 2; b and a are refused by the counter.
		for i, tt := range []struct {
			tenant    string
			wantOK    bool
			wantGated bool
		}{
			{"a", true, false}, {"a", true, false}, {"b", false, false}, {"a", false, false},
		} {
			dec := ask(tt.tenant)
			if got := dec.Code == limit.CodeOK; got != tt.wantOK || dec.Statuses[0].Gated != tt.wantGated {
				t.Fatalf("ask %d (%s): ok %v gated %v, want %v %v", i, tt.tenant, got, dec.Statuses[0].Gated, tt.wantOK, tt.wantGated)
			}
		}
		// Next window, room 2, both waiting: a (level with b) is admitted,
		// then a again is a request ahead of b, and the gate keeps b the
		// last unit.
		time.Sleep(time.Second)
		if dec := ask("a"); dec.Code != limit.CodeOK {
			t.Fatalf("a, level with b: %+v", dec.Statuses[0])
		}
		dec := ask("a")
		if dec.Code != limit.CodeOverLimit || !dec.Statuses[0].Gated || dec.Statuses[0].Remaining != 1 {
			t.Fatalf("a, ahead of b with 1 left: code %v gated %v remaining %d, want over the limit, gated, 1 left",
				dec.Code, dec.Statuses[0].Gated, dec.Statuses[0].Remaining)
		}
		if dec := ask("b"); dec.Code != limit.CodeOK {
			t.Fatalf("b, owed the last unit: %+v", dec.Statuses[0])
		}
	})
}

// TestQueueStepsAside: a waiter whose retry only a fair gate refused lets
// the other due waiters retry first, in their order, and is back in line
// once none of them is left or after a Notify; a waiter refused by the
// counter keeps its place.
func TestQueueStepsAside(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const dom, pace = "d", 10 * time.Millisecond
		q := NewQueue(nil)
		p1, p2 := q.join(dom, 0, 10), q.join(dom, 0, 10)
		s := q.join(dom, 1, 10)
		names := map[*waiter]string{p1: "p1", p2: "p2", s: "s"}
		turn := func(want *waiter) {
			t.Helper()
			synctest.Wait()
			for _, w := range []*waiter{p1, p2, s} {
				select {
				case <-w.turn:
					if w != want {
						t.Fatalf("the turn went to %s, want %s", names[w], names[want])
					}
					return
				default:
				}
			}
			t.Fatalf("nobody has the turn, want %s", names[want])
		}
		// refused ends w's retry, refused (aside: by a fair gate only),
		// makes the given waiters due, and lets the pace pass.
		refused := func(w *waiter, aside bool, due ...*waiter) {
			q.done(dom, w, pace, aside)
			for _, o := range due {
				q.ready(dom, o)
			}
			time.Sleep(pace)
		}
		q.ready(dom, p1)
		turn(p1)
		q.ready(dom, p2)
		q.ready(dom, s)
		refused(p1, true, p1) // p1 aside, due again
		turn(p2)
		refused(p2, false, p2) // p2 refused by the counter keeps its place
		turn(p2)
		refused(p2, true, p2)
		turn(s) // p1 and p2 aside
		refused(s, true, s)
		turn(p1) // only waiters aside are due: the first goes, all back in line
		q.done(dom, p1, 0, false)
		turn(p2)
		refused(p2, true, p2)
		turn(s)
		q.done(dom, s, pace, true)
		q.Notify(dom) // a release: every waiter due, strict order again
		turn(p1)
		q.done(dom, p1, 0, false)
		turn(p2)
		q.done(dom, p2, 0, false)
		turn(s)
		q.done(dom, s, 0, false)
		for _, w := range []*waiter{p1, p2, s} {
			q.leave(dom, w, 0)
		}
	})
}
