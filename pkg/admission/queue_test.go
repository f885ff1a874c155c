package admission

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// queueTiers is the queue of the tests: premium waits longest and
// first, free shortest and last, and each tier's length is small.
var queueTiers = &limit.Queue{
	Tiers: []limit.QueueTier{
		{Tier: "premium", MaxWait: 4 * time.Second, MaxLength: 100},
		{Tier: "standard", MaxWait: 2 * time.Second, MaxLength: 5},
		{Tier: "free", MaxWait: time.Second, MaxLength: 3},
		{Tier: "vip", Skip: true},
	},
	Poll: 200 * time.Millisecond,
}

// queueLimiter is a Limiter on a fresh memstore over a domain "q" whose
// plans all multiply by 1 (so every tier meets the same limits): slots,
// `slots` requests at once per model; and one per second per tenant.
func queueLimiter(t testing.TB, slots uint64, obs QueueObserver) (*Limiter, *Queue) {
	t.Helper()
	return queueLimiterOn(t, slots, obs, memstore.New())
}

// queueLimiterOn is queueLimiter over st.
func queueLimiterOn(t testing.TB, slots uint64, obs QueueObserver, st limit.Store) (*Limiter, *Queue) {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:  "q",
		Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 1, "standard": 1, "free": 1, "vip": 1}},
		Queue: queueTiers,
		Descriptors: []*limit.Rule{
			{Key: "model", MaxConcurrent: slots, Lease: time.Minute},
			{Key: "tenant", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Second, Algorithm: limit.FixedWindow}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	q := NewQueue(obs)
	return NewLimiter(st, nil, rs, WithQueue(q)), q
}

// slotReq asks for one slot of model m as tier, under id.
func slotReq(tier, id string) *limit.Request {
	return &limit.Request{Domain: "q", Tier: tier, ID: id, Descriptors: []limit.Descriptor{{Entries: entries("model", "m")}}}
}

// TestQueuePriorityThenFIFO: waiters are admitted in tier order, then in
// the order they came, as slots free one at a time.
func TestQueuePriorityThenFIFO(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l, q := queueLimiter(t, 1, nil)
		ctx := context.Background()
		if dec, err := l.Decide(ctx, slotReq("free", "holder")); err != nil || dec.Code != limit.CodeOK {
			t.Fatalf("holder: %+v, %v", dec, err)
		}
		var mu sync.Mutex
		var order []string
		arrivals := []string{"free-1", "standard-1", "premium-1", "free-2", "premium-2", "standard-2"}
		for _, id := range arrivals {
			tier := id[:len(id)-2]
			go func() {
				dec, err := l.Decide(ctx, slotReq(tier, id))
				if err != nil || dec.Code != limit.CodeOK {
					t.Errorf("%s: %+v, %v", id, dec, err)
					return
				}
				mu.Lock()
				order = append(order, id)
				mu.Unlock()
			}()
			synctest.Wait() // queued before the next one comes
		}
		if got := q.Len("q", 0) + q.Len("q", 1) + q.Len("q", 2); got != len(arrivals) {
			t.Fatalf("%d waiting, want %d", got, len(arrivals))
		}
		// Free the slot, then each admitted waiter's, without letting
		// time pass: no bound ends a wait, only the releases do.
		last := "holder"
		for i := range arrivals {
			if err := l.Release(ctx, slotReq("free", last)); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			mu.Lock()
			if len(order) != i+1 {
				mu.Unlock()
				t.Fatalf("after release %d: admitted %v", i, order)
			}
			last = order[i]
			mu.Unlock()
		}
		want := []string{"premium-1", "premium-2", "standard-1", "standard-2", "free-1", "free-2"}
		if !slices.Equal(order, want) {
			t.Errorf("admitted %v, want %v", order, want)
		}
	})
}

// TestQueueBound: a wait ends at its tier's bound, or at the caller's
// deadline less QueueMargin, whichever is sooner, and answers the
// refusal; a tier that skips, and a deadline too close, do not wait.
func TestQueueBound(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     string
		deadline time.Duration // 0: none
		want     time.Duration
	}{
		{name: "premium", give: "premium", want: 4 * time.Second},
		{name: "standard", give: "standard", want: 2 * time.Second},
		{name: "free", give: "free", want: time.Second},
		{name: "an unknown plan is the tiers' default", give: "gold", want: time.Second},
		{name: "skip", give: "vip", want: 0},
		{name: "the caller's deadline first", give: "premium", deadline: 500 * time.Millisecond, want: 500*time.Millisecond - QueueMargin},
		{name: "a deadline inside the margin", give: "premium", deadline: QueueMargin, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				l, _ := queueLimiter(t, 1, nil)
				ctx := context.Background()
				if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
					t.Fatal(err)
				}
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				start := time.Now()
				dec, err := l.Decide(ctx, slotReq(tt.give, "w"))
				if err != nil {
					t.Fatal(err)
				}
				if got := time.Since(start); got != tt.want {
					t.Errorf("waited %v, want %v", got, tt.want)
				}
				if dec.Code != limit.CodeOverLimit || dec.Reason != ReasonLimit || !dec.Statuses[0].Concurrency {
					t.Errorf("answer %+v, want the cap's refusal", dec)
				}
			})
		})
	}
}

// TestQueueWindowAgesOut: a rate limit's waiter is admitted when its
// window turns (the denial's RetryAfter), with no release to wake it.
func TestQueueWindowAgesOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l, _ := queueLimiter(t, 1, nil)
		ctx := context.Background()
		req := &limit.Request{Domain: "q", Tier: "premium", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}}
		// Start on a second's edge so the window's turn is 1s away.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		if dec, _ := l.Decide(ctx, req); dec.Code != limit.CodeOK {
			t.Fatalf("first: %+v", dec)
		}
		start := time.Now()
		dec, err := l.Decide(ctx, req)
		if err != nil || dec.Code != limit.CodeOK {
			t.Fatalf("second: %+v, %v", dec, err)
		}
		if got := time.Since(start); got != time.Second {
			t.Errorf("waited %v, want 1s (the window's turn)", got)
		}
	})
}

// TestQueueLength: past a tier's max_length the refusal is answered at
// once, and the queue never holds more.
func TestQueueLength(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		obs := &countObserver{}
		l, q := queueLimiter(t, 1, obs)
		ctx := context.Background()
		if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		const n = 7
		waited := make(chan time.Duration, n)
		for i := range n {
			go func() {
				start := time.Now()
				if _, err := l.Decide(ctx, slotReq("free", fmt.Sprint(i))); err != nil {
					t.Error(err)
				}
				waited <- time.Since(start)
			}()
		}
		synctest.Wait()
		snap := obs.snapshot()
		if got := q.Len("q", 2); got != queueTiers.Tiers[2].MaxLength {
			t.Errorf("%d waiting, want max_length %d", got, queueTiers.Tiers[2].MaxLength)
		}
		if snap.max != queueTiers.Tiers[2].MaxLength {
			t.Errorf("at most %d waited at once, want %d", snap.max, queueTiers.Tiers[2].MaxLength)
		}
		var atOnce int
		for range n {
			if <-waited == 0 {
				atOnce++
			}
		}
		if want := n - queueTiers.Tiers[2].MaxLength; atOnce != want || obs.snapshot().full != want {
			t.Errorf("%d answered at once, %d sheds counted; want %d", atOnce, obs.snapshot().full, want)
		}
	})
}

// TestQueueOneRetryAtATime: however many wait, a domain's waiters retry
// one at a time on a replica (docs/benchmarks.md, issue 16): a Notify
// makes all of them due at once, and their retries, each a store call
// here slow enough to overlap, still reach the store one by one.
func TestQueueOneRetryAtATime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &overlapStore{Store: memstore.New()}
		l, q := queueLimiterOn(t, 1, nil, st)
		ctx := context.Background()
		if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		const n = 10
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if _, err := l.Decide(ctx, slotReq("premium", fmt.Sprint(i))); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		if got := q.Len("q", 0); got != n {
			t.Fatalf("%d waiting, want %d", got, n)
		}
		st.slow.Store(true)
		q.Notify("q")
		wg.Wait()
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.calls < n {
			t.Errorf("%d retries, want at least one per waiter (%d)", st.calls, n)
		}
		if st.max != 1 {
			t.Errorf("%d retries reached the store at once, want 1", st.max)
		}
	})
}

// overlapStore counts, once slow, how many Apply calls run at once; each
// takes a millisecond, so calls that are not serialized overlap.
type overlapStore struct {
	limit.Store
	slow            atomic.Bool
	mu              sync.Mutex
	now, max, calls int
}

func (s *overlapStore) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	if s.slow.Load() {
		s.mu.Lock()
		s.now++
		s.calls++
		s.max = max(s.max, s.now)
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.now--
			s.mu.Unlock()
		}()
		time.Sleep(time.Millisecond)
	}
	return s.Store.Apply(ctx, now, charges, res)
}

// countObserver counts what a queue reports.
type countObserver struct {
	mu                      sync.Mutex
	now, max, full, timeout int
	waits                   map[string][]time.Duration
}

// snapshot is a copy of the counts.
func (o *countObserver) snapshot() *countObserver {
	o.mu.Lock()
	defer o.mu.Unlock()
	return &countObserver{now: o.now, max: o.max, full: o.full, timeout: o.timeout, waits: o.waits}
}

func (o *countObserver) Queued(_, _ string, delta int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.now += delta
	o.max = max(o.max, o.now)
}

func (o *countObserver) Waited(_, tier string, d time.Duration, out QueueOutcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.waits == nil {
		o.waits = map[string][]time.Duration{}
	}
	o.waits[tier] = append(o.waits[tier], d)
	if out == QueueTimeout {
		o.timeout++
	}
}

func (o *countObserver) Shed(_, _ string, full bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if full {
		o.full++
	}
}

// TestQueueBurst: at ten times what the slots serve, premium (a tenth of
// the offer, under what the slots serve) is served with its p99 wait
// under its bound, while free is shed at its length and bound, and no
// request waits past its bound.
func TestQueueBurst(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const (
			slots   = 4
			service = 100 * time.Millisecond // 40 requests a second
			offer   = 400                    // a second, 10x
			span    = 3 * time.Second
		)
		obs := &countObserver{}
		l, q := queueLimiter(t, slots, obs)
		ctx := context.Background()
		var wg sync.WaitGroup
		var mu sync.Mutex
		admitted := map[string]int{}
		lengthOK := true
		tick := time.NewTicker(time.Second / offer)
		defer tick.Stop()
		for i := range int(span.Seconds() * offer) {
			<-tick.C
			tier := "free"
			if i%10 == 0 {
				tier = "premium"
			}
			id := fmt.Sprint(i)
			wg.Go(func() {
				dec, err := l.Decide(ctx, slotReq(tier, id))
				if err != nil {
					t.Error(err)
					return
				}
				if dec.Code != limit.CodeOK {
					return
				}
				mu.Lock()
				admitted[tier]++
				mu.Unlock()
				time.Sleep(service)
				if err := l.Release(ctx, slotReq(tier, id)); err != nil {
					t.Error(err)
				}
			})
			if i%50 == 0 && q.Len("q", 2) > queueTiers.Tiers[2].MaxLength {
				lengthOK = false
			}
		}
		wg.Wait()
		obs = obs.snapshot()
		if !lengthOK || obs.max > queueTiers.Tiers[0].MaxLength+queueTiers.Tiers[2].MaxLength {
			t.Errorf("a queue passed its length (at most %d at once)", obs.max)
		}
		for i, qt := range queueTiers.Tiers[:3] {
			for _, d := range obs.waits[qt.Tier] {
				if d > qt.MaxWait {
					t.Errorf("tier %d (%s) waited %v, bound %v", i, qt.Tier, d, qt.MaxWait)
				}
			}
		}
		pw := slices.Sorted(slices.Values(obs.waits["premium"]))
		if len(pw) == 0 {
			t.Fatal("premium never waited: the burst did not fill the slots")
		}
		p99 := pw[len(pw)*99/100]
		wantPremium := int(span.Seconds() * offer / 10)
		t.Logf("premium: %d/%d admitted, %d waited, p99 wait %v; free: %d admitted, %d shed at its length, %d timeouts",
			admitted["premium"], wantPremium, len(pw), p99, admitted["free"], obs.full, obs.timeout)
		if p99 >= queueTiers.Tiers[0].MaxWait {
			t.Errorf("premium p99 wait %v, want under %v", p99, queueTiers.Tiers[0].MaxWait)
		}
		if admitted["premium"] != wantPremium {
			t.Errorf("premium: %d admitted, want all %d", admitted["premium"], wantPremium)
		}
		if obs.full == 0 {
			t.Error("free was never shed at its length")
		}
	})
}

// TestAverageWait: the average forgets waits older than two buckets.
func TestAverageWait(t *testing.T) {
	t.Parallel()
	base := time.Unix(1000, 0)
	tests := []struct {
		name string
		give []time.Duration // waits ending at base
		at   time.Duration   // asked this long after base
		want time.Duration
	}{
		{name: "none", want: 0},
		{name: "two", give: []time.Duration{time.Second, 3 * time.Second}, want: 2 * time.Second},
		{name: "a bucket later", give: []time.Duration{time.Second, 3 * time.Second}, at: 15 * time.Second, want: 2 * time.Second},
		{name: "forgotten", give: []time.Duration{time.Second}, at: 25 * time.Second, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := waitAverage{start: base}
			for _, d := range tt.give {
				a.add(base, d)
			}
			if got, _ := a.get(base.Add(tt.at)); got != tt.want {
				t.Errorf("average %v, want %v", got, tt.want)
			}
		})
	}
}

// BenchmarkQueueOverhead: what the queue stage adds to a decision that
// does not wait: an admitted one, and a rate limit's refusal of a tier
// that skips the queue.
func BenchmarkQueueOverhead(b *testing.B) {
	for _, bb := range []struct {
		name   string
		queue  bool
		budget bool // a retry budget, which reads the queue's wait
		key    string
		want   limit.Code
	}{
		{name: "admitted/without", key: "many", want: limit.CodeOK},
		{name: "admitted/with", queue: true, key: "many", want: limit.CodeOK},
		{name: "admitted/with-budget", queue: true, budget: true, key: "many", want: limit.CodeOK},
		{name: "refused/without", key: "one", want: limit.CodeOverLimit},
		{name: "refused/with", queue: true, key: "one", want: limit.CodeOverLimit},
	} {
		b.Run(bb.name, func(b *testing.B) {
			dom := &limit.Domain{
				Name:  "b",
				Tiers: &limit.Tiers{Key: "tier", Default: "vip", Plans: map[string]float64{"premium": 1, "free": 1, "vip": 1}},
				Descriptors: []*limit.Rule{
					{Key: "many", RateLimit: &limit.Limit{Amount: 1 << 40, Unit: limit.Second}},
					{Key: "one", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Hour}},
				},
			}
			var opts []Option
			if bb.queue {
				dom.Queue = queueTiers
				opts = append(opts, WithQueue(NewQueue(nil)))
			}
			if bb.budget {
				budget := limit.DefaultRetryBudget()
				dom.RetryBudget = &budget
			}
			rs, err := limit.NewRuleSet(dom)
			if err != nil {
				b.Fatal(err)
			}
			l := NewLimiter(memstore.New(), nil, rs, opts...)
			req := &limit.Request{Domain: "b", Tier: "vip", Descriptors: []limit.Descriptor{{Entries: entries(bb.key, "a")}}}
			ctx := context.Background()
			if _, err := l.Decide(ctx, req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if dec, err := l.Decide(ctx, req); err != nil || dec.Code != bb.want {
					b.Fatalf("Decide = %+v, %v", dec, err)
				}
			}
		})
	}
}

// TestAverageWaitPerDomain: a domain's average counts only its own
// waits; neither asking for nor deciding a domain the rules lack adds a
// key, and a forgotten domain's key goes.
func TestAverageWaitPerDomain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l, q := queueLimiter(t, 1, nil)
		ctx := context.Background()
		if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
			t.Fatal(err)
		}
		// free waits its whole bound, 1s, and is refused.
		if dec, err := l.Decide(ctx, slotReq("free", "waiter")); err != nil || dec.Code != limit.CodeOverLimit {
			t.Fatalf("waiter: %+v, %v", dec, err)
		}
		unknown := &limit.Request{Domain: "not-in-the-rules", ID: "x", Descriptors: []limit.Descriptor{{Entries: entries("model", "m")}}}
		if _, err := l.Decide(ctx, unknown); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name string
			give string
			want time.Duration
		}{
			{name: "the domain that waited", give: "q", want: time.Second},
			{name: "another domain", give: "other", want: 0},
			{name: "the unknown domain", give: "not-in-the-rules", want: 0},
		}
		for _, tt := range tests {
			if got := q.AverageWait(tt.give); got != tt.want {
				t.Errorf("%s: AverageWait(%q) = %v, want %v", tt.name, tt.give, got, tt.want)
			}
		}
		if n := avgKeys(q); n != 1 {
			t.Errorf("%d averages kept, want 1 (q's)", n)
		}
		time.Sleep(25 * time.Second) // synctest's clock: past both buckets
		if got := q.AverageWait("q"); got != 0 {
			t.Errorf("AverageWait(q) after 25s = %v, want 0", got)
		}
		if n := avgKeys(q); n != 0 {
			t.Errorf("%d averages kept after all were forgotten, want 0", n)
		}
	})
}

// avgKeys is the number of domains q keeps an average for.
func avgKeys(q *Queue) int {
	q.avgMu.Lock()
	defer q.avgMu.Unlock()
	return len(q.avgs)
}

// TestQueueWithoutQueue: a request asked under WithoutQueue is answered
// at once, where the same request without it waits its tier's bound.
func TestQueueWithoutQueue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give func(context.Context) context.Context
		want time.Duration
	}{
		{name: "waits", give: func(ctx context.Context) context.Context { return ctx }, want: time.Second},
		{name: "WithoutQueue", give: WithoutQueue, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				l, _ := queueLimiter(t, 1, nil)
				ctx := tt.give(context.Background())
				if _, err := l.Decide(ctx, slotReq("free", "holder")); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				dec, err := l.Decide(ctx, slotReq("free", "refused"))
				if err != nil || dec.Code != limit.CodeOverLimit {
					t.Fatalf("Decide = %+v, %v; want OVER_LIMIT", dec, err)
				}
				if got := time.Since(start); got != tt.want {
					t.Errorf("answered after %v, want %v", got, tt.want)
				}
			})
		})
	}
}

// TestKeptReportNeverWaits: a hits_addend of a descriptor's own on a
// request limit is kept past the limit and answered OVER_LIMIT at once:
// a wait would retry it, and charge it twice.
func TestKeptReportNeverWaits(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l, _ := queueLimiter(t, 1, nil)
		ctx := context.Background()
		tenant := func(hits uint64, set bool) *limit.Request {
			return &limit.Request{Domain: "q", Tier: "free", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a"), Hits: hits, HitsSet: set}}}
		}
		if dec, err := l.Decide(ctx, tenant(0, false)); err != nil || dec.Code != limit.CodeOK {
			t.Fatalf("first request: %+v, %v; want OK", dec, err)
		}
		start := time.Now()
		dec, err := l.Decide(ctx, tenant(1, true))
		if err != nil || dec.Code != limit.CodeOverLimit || !dec.Kept || dec.Reason != ReasonLimit {
			t.Fatalf("a report of 1 at the limit: %+v, %v; want OVER_LIMIT, kept", dec, err)
		}
		if got := time.Since(start); got != 0 {
			t.Errorf("answered after %v, want at once", got)
		}
		// 2 of 1 used: a check is over the limit until the window ends.
		if dec, err := l.Decide(ctx, tenant(0, true)); err != nil || dec.Code != limit.CodeOverLimit || dec.Kept {
			t.Errorf("a check after the report: %+v, %v; want OVER_LIMIT, nothing kept", dec, err)
		}
	})
}
