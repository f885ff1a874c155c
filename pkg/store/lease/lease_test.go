package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/lease"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// counting counts the calls that reach the shared store.
type counting struct {
	limit.Store
	calls atomic.Int64
}

func (c *counting) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	c.calls.Add(1)
	return c.Store.Apply(ctx, now, charges, res)
}

// admission is one admitted charge on one key, at true time ms.
type admission struct {
	at   int64
	cost int64
}

// checkWindows fails when some interval the limit promises about held
// more than its Amount: every interval of length Window for a sliding
// window, every epoch-aligned window for a fixed one.
func checkWindows(t *testing.T, c limit.Charge, log []admission) {
	t.Helper()
	W := c.Window.Milliseconds()
	slices.SortFunc(log, func(a, b admission) int { return int(a.at - b.at) })
	if c.Algorithm == limit.FixedWindow {
		// Fixed windows are aligned to the Unix epoch, not to t0.
		sums := map[int64]int64{}
		for _, a := range log {
			sums[(t0.UnixMilli()+a.at)/W] += a.cost
		}
		for w, n := range sums {
			if uint64(n) > c.Amount {
				t.Fatalf("%s: window starting at %d ms admitted %d > %d", c.Key, w*W-t0.UnixMilli(), n, c.Amount)
			}
		}
		return
	}
	var sum int64
	j := 0
	for i := range log {
		// sum holds the costs admitted in [log[i].at, log[i].at+W).
		for j < len(log) && log[j].at < log[i].at+W {
			sum += log[j].cost
			j++
		}
		if uint64(sum) > c.Amount {
			t.Fatalf("%s: the %d ms from %d ms admitted %d > %d", c.Key, W, log[i].at, sum, c.Amount)
		}
		sum -= log[i].cost
	}
}

// TestNeverOverAdmits runs random schedules of decisions from several
// replicas, each leasing from one shared store, with returns on time,
// late or never, and checks every interval the limits promise about.
func TestNeverOverAdmits(t *testing.T) {
	t.Parallel()
	for seed := range uint64(24) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			alg := limit.SlidingWindow
			if seed%3 == 2 {
				alg = limit.FixedWindow
			}
			limits := []limit.Charge{
				{Key: "a", Algorithm: alg, Amount: uint64(100 + rng.IntN(400)), Window: time.Duration(200+rng.IntN(2000)) * time.Millisecond, Buckets: uint16(1 + rng.IntN(20))},
				{Key: "b", Algorithm: limit.SlidingWindow, Amount: uint64(200 + rng.IntN(800)), Window: time.Duration(500+rng.IntN(3000)) * time.Millisecond},
			}
			shared := memstore.New()
			replicas := make([]*lease.Store, 1+rng.IntN(4))
			for i := range replicas {
				replicas[i] = lease.New(shared, lease.Options{
					MinAmount: 1,
					Fraction:  []float64{0.05, 0.2, 0.5, 1}[rng.IntN(4)],
					MaxLife:   time.Duration(20+rng.IntN(800)) * time.Millisecond,
				})
			}
			logs := make([][]admission, len(limits))
			now := int64(0)
			ctx := context.Background()
			var admitted int
			for range 6000 {
				now += int64(rng.IntN(4))
				r := replicas[rng.IntN(len(replicas))]
				switch rng.IntN(40) {
				case 0:
					r.ReturnAll(ctx, t0.Add(ms(now)))
					continue
				case 1, 2, 3, 4, 5, 6:
					r.ReturnEnded(ctx, t0.Add(ms(now+int64(rng.IntN(3))*int64(rng.IntN(200)))))
					continue
				}
				var charges []limit.Charge
				var which []int
				for i, l := range limits {
					if rng.IntN(3) > 0 || (i == len(limits)-1 && len(charges) == 0) {
						c := l
						c.Cost = int64(rng.IntN(3)) // 0 is a check
						charges = append(charges, c)
						which = append(which, i)
					}
				}
				res := make([]limit.Result, len(charges))
				ok, err := r.Apply(ctx, t0.Add(ms(now)), charges, res)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					continue
				}
				admitted++
				for k, c := range charges {
					if !res[k].Fits {
						t.Fatalf("admitted with a charge that does not fit: %+v", res)
					}
					if c.Cost > 0 {
						logs[which[k]] = append(logs[which[k]], admission{now, c.Cost})
					}
				}
			}
			for i, l := range limits {
				checkWindows(t, l, logs[i])
			}
			if admitted < 500 {
				t.Fatalf("only %d decisions admitted: the schedule tests little", admitted)
			}
			var local uint64
			for _, r := range replicas {
				local += r.Stats().Local
			}
			if local == 0 {
				t.Fatal("no decision was admitted from a lease: the schedule tests no lease")
			}
		})
	}
}

// TestFewStoreCalls: a steady 1,000 decisions/s on a 100,000/min limit,
// as one of three replicas would see it, asks the store for a small
// fraction of the decisions, and admits them all.
func TestFewStoreCalls(t *testing.T) {
	t.Parallel()
	inner := &counting{Store: memstore.New()}
	s := lease.New(inner, lease.Options{})
	c := limit.Charge{Key: "tenant", Algorithm: limit.SlidingWindow, Amount: 100_000, Window: time.Minute, Cost: 1}
	ctx := context.Background()
	const n = 20_000
	for i := range n {
		now := t0.Add(ms(int64(i)))
		if i%5 == 0 {
			s.ReturnEnded(ctx, now)
		}
		res := make([]limit.Result, 1)
		ok, err := s.Apply(ctx, now, []limit.Charge{c}, res)
		if err != nil || !ok {
			t.Fatalf("decision %d: admitted %v, err %v", i, ok, err)
		}
	}
	st := s.Stats()
	perDecision := float64(inner.calls.Load()) / n
	t.Logf("store calls %d for %d decisions (%.4f each); %+v", inner.calls.Load(), n, perDecision, st)
	if perDecision > 0.05 {
		t.Errorf("%.4f store calls per decision, want <= 0.05", perDecision)
	}
	if st.Local < n*9/10 {
		t.Errorf("%d decisions admitted locally, want >= 90%%", st.Local)
	}
}

// TestSharesTheLimit: three replicas asking far more than the limit admit
// close to it, and never more.
func TestSharesTheLimit(t *testing.T) {
	t.Parallel()
	shared := &counting{Store: memstore.New()}
	c := limit.Charge{Key: "tenant", Algorithm: limit.SlidingWindow, Amount: 3000, Window: time.Second, Cost: 1}
	var replicas [3]*lease.Store
	for i := range replicas {
		replicas[i] = lease.New(shared, lease.Options{MinAmount: 1})
	}
	ctx := context.Background()
	var log []admission
	const span = 10_000 // ms
	for now := int64(0); now < span; now++ {
		for _, r := range replicas {
			r.ReturnEnded(ctx, t0.Add(ms(now)))
			for range 2 { // 6,000/s asked of a 3,000/s limit
				res := make([]limit.Result, 1)
				if ok, _ := r.Apply(ctx, t0.Add(ms(now)), []limit.Charge{c}, res); ok {
					log = append(log, admission{now, 1})
				}
			}
		}
	}
	checkWindows(t, c, log)
	// A steady sliding window of N buckets admits N/(N+1) of its limit;
	// leases may strand a little more of it.
	want := int(float64(c.Amount) * span / 1000 * 20 / 21 * 0.9)
	t.Logf("admitted %d over %d ms (limit %d/s); store calls %d", len(log), span, c.Amount, shared.calls.Load())
	if len(log) < want {
		t.Errorf("admitted %d, want >= %d", len(log), want)
	}
}

// TestReturnAllGivesRoomBack: what a replica leased and did not use is
// room again for the others once it shuts down.
func TestReturnAllGivesRoomBack(t *testing.T) {
	t.Parallel()
	shared := memstore.New()
	s := lease.New(shared, lease.Options{MinAmount: 1, Fraction: 1})
	c := limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 1000, Window: time.Minute, Cost: 1}
	ctx := context.Background()
	now := t0
	res := make([]limit.Result, 1)
	for range 3 {
		if ok, err := s.Apply(ctx, now, []limit.Charge{c}, res); !ok || err != nil {
			t.Fatalf("admitted %v, err %v", ok, err)
		}
	}
	if res[0].Remaining != 997 {
		t.Errorf("Remaining = %d, want 997 (the lease is still room)", res[0].Remaining)
	}
	if got := remaining(t, shared, now, c); got >= 997 {
		t.Fatalf("the shared store has %d left: no lease was taken", got)
	}
	s.ReturnAll(ctx, now.Add(time.Millisecond))
	if got := remaining(t, shared, now.Add(time.Millisecond), c); got != 997 {
		t.Errorf("after ReturnAll the shared store has %d left, want 997", got)
	}
	if st := s.Stats(); st.Returned == 0 || st.Dropped != 0 {
		t.Errorf("stats %+v, want units returned and none dropped", st)
	}
	// An ended lease admits nothing more: the next decision asks the store.
	inner := &counting{Store: shared}
	s2 := lease.New(inner, lease.Options{MinAmount: 1})
	_, _ = s2.Apply(ctx, now, []limit.Charge{c}, res)
	s2.ReturnAll(ctx, now)
	before := inner.calls.Load()
	_, _ = s2.Apply(ctx, now, []limit.Charge{c}, res)
	if inner.calls.Load() == before {
		t.Error("a decision after ReturnAll was admitted from an ended lease")
	}
}

func remaining(t *testing.T, s limit.Store, now time.Time, c limit.Charge) uint64 {
	t.Helper()
	c.Cost = 0
	res := make([]limit.Result, 1)
	if _, err := s.Apply(context.Background(), now, []limit.Charge{c}, res); err != nil {
		t.Fatal(err)
	}
	return res[0].Remaining
}

// TestPassesThrough: what must not be leased reaches the store every
// time.
func TestPassesThrough(t *testing.T) {
	t.Parallel()
	big := limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 1_000_000, Window: time.Minute, Cost: 1}
	small := big
	small.Amount = 999
	tb := big
	tb.Algorithm = limit.TokenBucket
	shadow := big
	shadow.Shadow = true
	forced := big
	forced.Force = true
	refund := big
	refund.Cost = -1
	conc := limit.Charge{Key: "c", Algorithm: limit.Concurrency, Amount: 10, Window: time.Minute, Cost: 1, Member: "m"}
	fair := big
	fair.Key = "f"
	fair.Fair = limit.FairCharge{Policy: &limit.FairPolicy{Backlog: time.Minute, Quantum: 1, Credit: 10}, Member: limit.FairMember("a"), Weight: 1}
	tests := []struct {
		name string
		give []limit.Charge
	}{
		{"below MinAmount", []limit.Charge{small}},
		{"token bucket", []limit.Charge{tb}},
		{"shadow", []limit.Charge{shadow}},
		{"force", []limit.Charge{forced}},
		{"refund", []limit.Charge{refund}},
		{"concurrency beside a leasable charge", []limit.Charge{big, conc}},
		{"key twice", []limit.Charge{big, big}},
		// The fair gate must see every decision on a shared limit.
		{"fair", []limit.Charge{fair}},
		{"fair beside a leasable charge", []limit.Charge{big, fair}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			inner := &counting{Store: memstore.New()}
			s := lease.New(inner, lease.Options{})
			for i := range 10 {
				res := make([]limit.Result, len(tt.give))
				if _, err := s.Apply(context.Background(), t0.Add(ms(int64(i))), tt.give, res); err != nil {
					t.Fatal(err)
				}
			}
			if got := inner.calls.Load(); got != 10 {
				t.Errorf("%d store calls for 10 decisions, want 10", got)
			}
			if st := s.Stats(); st.Granted != 0 {
				t.Errorf("granted %d leases", st.Granted)
			}
		})
	}
}

// TestLimitChange: a lease taken under one Amount is not spent under
// another (a plan or pressure change), and is given back.
func TestLimitChange(t *testing.T) {
	t.Parallel()
	inner := &counting{Store: memstore.New()}
	s := lease.New(inner, lease.Options{MinAmount: 1})
	c := limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 3000, Window: time.Minute, Cost: 1}
	ctx := context.Background()
	res := make([]limit.Result, 1)
	for range 3 {
		_, _ = s.Apply(ctx, t0, []limit.Charge{c}, res)
	}
	if got := inner.calls.Load(); got != 2 {
		t.Fatalf("%d store calls, want 2 (the first seen, the second leasing, the third from the lease)", got)
	}
	shed := c
	shed.Amount = 1000
	_, _ = s.Apply(ctx, t0, []limit.Charge{shed}, res)
	if got := inner.calls.Load(); got != 3 {
		t.Fatalf("%d store calls, want 3: a lease under 3000 answered a limit of 1000", got)
	}
	s.ReturnEnded(ctx, t0.Add(time.Millisecond))
	if st := s.Stats(); st.Returned == 0 {
		t.Errorf("the lease under the old limit was not given back: %+v", st)
	}
}

// TestDeniedByExtraRetries: near the limit, a decision whose own cost
// fits is admitted although the lease it asked for does not fit.
func TestDeniedByExtraRetries(t *testing.T) {
	t.Parallel()
	shared := memstore.New()
	c := limit.Charge{Key: "k", Algorithm: limit.FixedWindow, Amount: 100, Window: time.Minute, Cost: 1}
	ctx := context.Background()
	res := make([]limit.Result, 1)
	fill := c
	fill.Cost = 90
	if ok, _ := shared.Apply(ctx, t0, []limit.Charge{fill}, res); !ok {
		t.Fatal("fill")
	}
	// This replica sees k with 9 left (a key seen once is not leased);
	// another takes 8, so the lease it asks for next does not fit.
	s := lease.New(shared, lease.Options{MinAmount: 1, Fraction: 1})
	if ok, _ := s.Apply(ctx, t0, []limit.Charge{c}, res); !ok {
		t.Fatal("first k")
	}
	fill.Cost = 8
	if ok, _ := shared.Apply(ctx, t0, []limit.Charge{fill}, res); !ok {
		t.Fatal("fill k")
	}
	ok, err := s.Apply(ctx, t0, []limit.Charge{c}, res)
	if err != nil || !ok {
		t.Fatalf("the last unit was refused: admitted %v, err %v, res %+v", ok, err, res)
	}
	if st := s.Stats(); st.Retries != 1 {
		t.Errorf("retries = %d, want 1: the last unit is admitted by asking again without the lease", st.Retries)
	}
	if ok, _ := s.Apply(ctx, t0, []limit.Charge{c}, res); ok {
		t.Fatal("admitted past the limit")
	}
}

// TestDeniedElsewhereLeasedFits: in a decision another charge denies, a
// leased charge whose own cost fits is answered as fitting (Result.Fits
// is about the charge alone), though the store was asked for its cost
// plus a lease that did not fit. Otherwise RLS would answer that
// descriptor OVER_LIMIT too.
func TestDeniedElsewhereLeasedFits(t *testing.T) {
	t.Parallel()
	shared := memstore.New()
	ctx := context.Background()
	a := limit.Charge{Key: "a", Algorithm: limit.FixedWindow, Amount: 100, Window: time.Minute, Cost: 1}
	b := limit.Charge{Key: "b", Algorithm: limit.FixedWindow, Amount: 1, Window: time.Minute, Cost: 1}
	fillA, fillB := a, b
	fillA.Cost = 90
	res := make([]limit.Result, 2)
	if ok, _ := shared.Apply(ctx, t0, []limit.Charge{fillA, fillB}, res); !ok {
		t.Fatal("fill")
	}
	// This replica sees a with 9 left (a key seen once is not leased)...
	s := lease.New(shared, lease.Options{MinAmount: 1, Fraction: 1})
	if ok, _ := s.Apply(ctx, t0, []limit.Charge{a}, res[:1]); !ok {
		t.Fatal("first a")
	}
	// ...another takes 8 of them, so the lease this one asks for with
	// its next charge on a no longer fits, though the charge does.
	fillA.Cost = 8
	if ok, _ := shared.Apply(ctx, t0, []limit.Charge{fillA}, res[:1]); !ok {
		t.Fatal("fill a")
	}
	ok, err := s.Apply(ctx, t0, []limit.Charge{a, b}, res)
	if err != nil || ok {
		t.Fatalf("admitted %v, err %v: b is full", ok, err)
	}
	if !res[0].Fits || res[0].RetryAfter != 0 || res[0].Remaining != 1 {
		t.Errorf("a (1 of 100 left, cost 1) = %+v, want Fits, Remaining 1, no RetryAfter", res[0])
	}
	if res[1].Fits {
		t.Errorf("b (full) = %+v, want not Fits", res[1])
	}
	if st := s.Stats(); st.Retries != 0 {
		t.Errorf("retried: %+v (b denies whatever a asks)", st)
	}
}

// returning is a lease.Store that gives every lease back right after the
// decision that took it, at that decision's time: each decision on a
// leasable key asks the store for its cost plus a lease, is answered as
// if it asked for its cost, and the lease's units go back to the bucket
// they were charged in. The suite's exact answers then hold only if
// granting, reporting and returning a lease change nothing the store
// says. (Spending leases locally is what TestNeverOverAdmits drives: an
// exact suite cannot, as a held lease is room the store counts as spent,
// by design.)
type returning struct{ *lease.Store }

func (r returning) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	admitted, err := r.Store.Apply(ctx, now, charges, res)
	r.ReturnAll(ctx, now)
	return admitted, err
}

// leaseExcept are the conformance subtests a leasing store does not
// pass, by design. They check every answer of random decisions against an
// exact model that knows no leases. In a decision another charge denies,
// a leased charge was asked for with its lease: it is answered as fitting
// when its cost alone fits (TestDeniedElsewhereLeasedFits), but when it
// does not fit its RetryAfter is the wait for its cost plus the lease, a
// longer one than the model's; and a window's Remaining counts the room a
// lease of the same step took before it was given back. Nothing is kept
// either way, so no window admits more: the lease's promise, that no
// window admits more than its limit (the package doc), is what
// TestNeverOverAdmits asserts over random schedules of the same kinds of
// charges, from several replicas spending leases.
var leaseExcept = map[string]string{
	"Property": "Remaining and RetryAfter count the leases asked for with the charges (see leaseExcept)",
	"Model":    "Remaining and RetryAfter count the leases asked for with the charges (see leaseExcept)",
}

// TestConformance runs the conformance suite with leasing on (every
// window limit leased, each lease up to all the room, see returning),
// less leaseExcept, and checks that leases were granted and given back:
// the suite's exact answers hold with leases in play.
func TestConformance(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var stores []*lease.Store
	t.Run("suite", func(t *testing.T) {
		storetest.RunExcept(t, func(testing.TB) limit.Store {
			// The suite's steps are seconds apart: a MaxLife of a day
			// leases every key decided on twice (a lease still ends
			// before its bucket does).
			s := lease.New(memstore.New(), lease.Options{MinAmount: 1, Fraction: 1, MaxLife: 24 * time.Hour})
			mu.Lock()
			stores = append(stores, s)
			mu.Unlock()
			return returning{s}
		}, leaseExcept)
	})
	var sum lease.Stats
	for _, s := range stores {
		st := s.Stats()
		sum.Granted += st.Granted
		sum.Returned += st.Returned
	}
	t.Logf("%d stores: %d leases granted, %d units given back", len(stores), sum.Granted, sum.Returned)
	if sum.Granted < 100 || sum.Returned == 0 {
		t.Errorf("leases granted %d, units given back %d: want 100 or more (433 when written) and above 0, or the suite did not run with leasing on",
			sum.Granted, sum.Returned)
	}
}

// TestRunReturnsAndStops: Run gives ended leases back as it goes and all
// of them when its context ends, then returns.
func TestRunReturnsAndStops(t *testing.T) {
	t.Parallel()
	shared := memstore.New()
	clock := storetest.NewFakeClock(t0)
	s := lease.New(shared, lease.Options{MinAmount: 1, Fraction: 1, Clock: clock})
	c := limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 1000, Window: time.Minute, Cost: 1}
	res := make([]limit.Result, 1)
	if ok, _ := s.Apply(context.Background(), t0, []limit.Charge{c}, res); !ok {
		t.Fatal("refused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	cancel()
	<-done
	if got := remaining(t, shared, t0, c); got != 999 {
		t.Errorf("after Run stopped the store has %d left, want 999", got)
	}
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// slow makes every store call take a while, as a Redis round trip does.
type slow struct {
	counting
	delay time.Duration
}

func (s *slow) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	time.Sleep(s.delay)
	return s.counting.Apply(ctx, now, charges, res)
}

// TestUsedUpLeaseOneCall: when many concurrent decisions find the lease
// used up at once, one store call refills it for all of them.
func TestUsedUpLeaseOneCall(t *testing.T) {
	t.Parallel()
	inner := &slow{counting: counting{Store: memstore.New()}, delay: 2 * time.Millisecond}
	s := lease.New(inner, lease.Options{})
	c := limit.Charge{Key: "tenant", Algorithm: limit.SlidingWindow, Amount: 1_000_000_000, Window: time.Hour, Cost: 1}
	ctx := context.Background()
	res := make([]limit.Result, 1)
	if ok, _ := s.Apply(ctx, t0, []limit.Charge{c}, res); !ok { // the key's first lease
		t.Fatal("refused")
	}
	const workers, each = 50, 200
	errs := make(chan error, workers)
	for range workers {
		go func() {
			res := make([]limit.Result, 1)
			for range each {
				if ok, err := s.Apply(ctx, t0, []limit.Charge{c}, res); !ok || err != nil {
					errs <- fmt.Errorf("admitted %v, err %v", ok, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	calls := inner.calls.Load()
	t.Logf("%d store calls for %d decisions; %+v", calls, workers*each+1, s.Stats())
	// Doubling from 16 to cover 10,000 decisions takes about 10 grants;
	// without waiting, each used-up lease would cost up to 50 calls.
	if calls > 40 {
		t.Errorf("%d store calls, want <= 40", calls)
	}
}

// TestOnceSeenKeysNotLeased: keys decided on once each (a long tail of
// tenants) cost one store call each, never a lease and its refund.
func TestOnceSeenKeysNotLeased(t *testing.T) {
	t.Parallel()
	inner := &counting{Store: memstore.New()}
	s := lease.New(inner, lease.Options{MaxEntries: 1000})
	ctx := context.Background()
	res := make([]limit.Result, 1)
	const n = 5000
	for i := range n {
		c := limit.Charge{Key: fmt.Sprint("tenant-", i), Algorithm: limit.SlidingWindow, Amount: 1_000_000, Window: time.Hour, Cost: 1}
		if ok, err := s.Apply(ctx, t0.Add(ms(int64(i))), []limit.Charge{c}, res); !ok || err != nil {
			t.Fatalf("admitted %v, err %v", ok, err)
		}
	}
	s.ReturnAll(ctx, t0.Add(ms(n)))
	if got := inner.calls.Load(); got != n {
		t.Errorf("%d store calls for %d once-seen keys, want %d", got, n, n)
	}
	if st := s.Stats(); st.Granted != 0 || st.Keys != 0 {
		t.Errorf("stats %+v: want no lease and no entry: a key seen once is remembered without one", st)
	}
	// A hot key arriving while the table is full of once-seen keys is
	// still leased.
	hot := limit.Charge{Key: "hot", Algorithm: limit.SlidingWindow, Amount: 1_000_000, Window: time.Hour, Cost: 1}
	for i := range 100 {
		_, _ = s.Apply(ctx, t0.Add(ms(n+int64(i))), []limit.Charge{hot}, res)
	}
	if st := s.Stats(); st.Granted == 0 || st.Local < 90 {
		t.Errorf("hot key after a full table: %+v, want leases", st)
	}
	// As before the once-seen table, a key's second decision within a
	// lease's life asks for a lease.
	second := limit.Charge{Key: "second", Algorithm: limit.SlidingWindow, Amount: 1_000_000, Window: time.Hour, Cost: 1}
	before := s.Stats().Granted
	for i := range 2 {
		_, _ = s.Apply(ctx, t0.Add(ms(n+200+int64(i))), []limit.Charge{second}, res)
	}
	if st := s.Stats(); st.Granted != before+1 || st.Keys != 2 {
		t.Errorf("a key decided on twice: %+v, want one more lease (%d) and its entry beside the hot key's", st, before+1)
	}
}

// TestFairConformance: with leasing on as in TestConformance, fair-shared
// decisions still meet the store's fair contract: they pass through.
func TestFairConformance(t *testing.T) {
	t.Parallel()
	storetest.RunFair(t, func(testing.TB) limit.Store {
		return lease.New(memstore.New(), lease.Options{MinAmount: 1, Fraction: 1, MaxLife: 24 * time.Hour})
	})
}
