package admission

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// TestQueuePaced: n waiters refused with RetryAfter d, with no Notify,
// retry at most once a d between them after a refused retry (plus the
// retries that are admitted, each of which leaves the queue): a full
// queue costs the store about one call a d, not n. Without the pace every
// due waiter retries back to back and the count is about n a d.
func TestQueuePaced(t *testing.T) {
	t.Parallel()
	poll := queueTiers.PollEvery()
	tests := []struct {
		name string
		give *limit.Limit
		pace time.Duration // the refusals' RetryAfter, capped by poll
		want int           // waiters admitted
	}{
		{
			// One token every 20 ms, none banked: each waiter in turn is
			// admitted when its token comes, and the next one refused.
			name: "token bucket RetryAfter under poll",
			give: &limit.Limit{Amount: 50, Unit: limit.Second, Algorithm: limit.TokenBucket, Burst: 1},
			pace: 20 * time.Millisecond,
			want: 20,
		},
		{
			// Refused for an hour: every retry is refused, paced by poll,
			// until premium's 4 s bound.
			name: "an hour's window paced by poll",
			give: &limit.Limit{Amount: 1, Unit: limit.Hour, Algorithm: limit.FixedWindow},
			pace: poll,
			want: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n = 20
				st := &countStore{Store: memstore.New()}
				rs, err := limit.NewRuleSet(&limit.Domain{
					Name:        "q",
					Tiers:       &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 1, "free": 1}},
					Queue:       queueTiers,
					Descriptors: []*limit.Rule{{Key: "tenant", RateLimit: tt.give}},
				})
				if err != nil {
					t.Fatal(err)
				}
				q := NewQueue(nil)
				l := NewLimiter(st, nil, rs, WithQueue(q))
				ctx := context.Background()
				req := func(id string) *limit.Request {
					return &limit.Request{Domain: "q", Tier: "premium", ID: id, Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}}
				}
				if dec, err := l.Decide(ctx, req("first")); err != nil || dec.Code != limit.CodeOK {
					t.Fatalf("first: %+v, %v", dec, err)
				}
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						dec, err := l.Decide(ctx, req(fmt.Sprint(i)))
						if err != nil {
							t.Error(err)
							return
						}
						if dec.Code == limit.CodeOK {
							admitted.Add(1)
						}
					})
				}
				synctest.Wait() // every waiter refused on arrival and queued
				if got := q.Len("q", 0); got != n {
					t.Fatalf("%d waiting, want %d", got, n)
				}
				start := time.Now()
				st.counting.Store(true)
				wg.Wait()
				elapsed := time.Since(start)
				retries := int(st.calls.Load())
				refused := retries - int(admitted.Load())
				limitRefused := int(elapsed/tt.pace) + 1
				t.Logf("%d waiters: %d retries in %v, %d admitted, %d refused (pace allows %d)",
					n, retries, elapsed, admitted.Load(), refused, limitRefused)
				if bound := queueTiers.Tiers[0].MaxWait; elapsed > bound {
					t.Errorf("waits ended after %v, past premium's bound %v", elapsed, bound)
				}
				if got := int(admitted.Load()); got != tt.want {
					t.Errorf("%d admitted, want %d", got, tt.want)
				}
				if refused > limitRefused {
					t.Errorf("%d refused retries in %v, want at most one a %v after the first (%d)", refused, elapsed, tt.pace, limitRefused)
				}
			})
		})
	}
}

// TestQueuePacedNotify: a Notify ends the pace: the first due waiter
// retries at once, not when the refusal's RetryAfter (here poll: a
// concurrency cap has none) passes.
func TestQueuePacedNotify(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		poll := queueTiers.PollEvery()
		l, q := queueLimiter(t, 1, nil)
		ctx := context.Background()
		if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		admittedAt := make(chan time.Time, 2)
		for _, id := range []string{"a", "b"} {
			go func() {
				if dec, err := l.Decide(ctx, slotReq("premium", id)); err != nil || dec.Code != limit.CodeOK {
					t.Errorf("%s: %+v, %v", id, dec, err)
				}
				admittedAt <- time.Now()
			}()
			synctest.Wait()
		}
		// At poll both are due: a retries, is refused and paces the
		// domain for poll; b, due, waits for the pace.
		time.Sleep(poll + 10*time.Millisecond)
		if got := q.Len("q", 0); got != 2 {
			t.Fatalf("%d waiting, want 2", got)
		}
		released := time.Now()
		if err := l.Release(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		if got := <-admittedAt; !got.Equal(released) {
			t.Errorf("admitted %v after the release, want at once", got.Sub(released))
		}
		if err := l.Release(ctx, slotReq("premium", "a")); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx, slotReq("premium", "b")); err != nil {
			t.Fatal(err)
		}
		<-admittedAt
	})
}

// TestQueuePacedNotifyDuringRetry: a retry refused by a state that a
// release, seen while the retry's store call ran, has since changed does
// not pace the domain: the waiter retries at once and is admitted.
func TestQueuePacedNotifyDuringRetry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		poll := queueTiers.PollEvery()
		st := &gateStore{Store: memstore.New(), in: make(chan struct{}), out: make(chan struct{})}
		l, _ := queueLimiterOn(t, 1, nil, st)
		ctx := context.Background()
		if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		admitted := make(chan time.Duration, 1)
		go func() {
			if dec, err := l.Decide(ctx, slotReq("premium", "w")); err != nil || dec.Code != limit.CodeOK {
				t.Errorf("w: %+v, %v", dec, err)
			}
			admitted <- time.Since(start)
		}()
		synctest.Wait()
		st.armed.Store(true)
		<-st.in // w's retry at poll: refused, its answer held
		if err := l.Release(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		close(st.out)
		if got := <-admitted; got != poll {
			t.Errorf("admitted after %v, want %v (at once after the release)", got, poll)
		}
		if err := l.Release(ctx, slotReq("premium", "w")); err != nil {
			t.Fatal(err)
		}
	})
}

// countStore counts Apply calls once counting.
type countStore struct {
	limit.Store
	counting atomic.Bool
	calls    atomic.Int64
}

func (s *countStore) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	if s.counting.Load() {
		s.calls.Add(1)
	}
	return s.Store.Apply(ctx, now, charges, res)
}

// gateStore, once armed, holds the answer of the next Apply: it signals
// in and returns when out is closed.
type gateStore struct {
	limit.Store
	armed   atomic.Bool
	in, out chan struct{}
}

func (s *gateStore) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	ok, err := s.Store.Apply(ctx, now, charges, res)
	if s.armed.CompareAndSwap(true, false) {
		s.in <- struct{}{}
		<-s.out
	}
	return ok, err
}
