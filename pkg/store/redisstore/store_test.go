package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// t0 is a fixed instant in milliseconds: tests pass time to Apply, they
// never read the wall clock.
var t0 = time.UnixMilli(1_700_000_000_123)

func key(alg limit.Algorithm, window time.Duration, tenant string) string {
	return limit.Key(limit.Requests, alg, window, "test", []limit.Entry{{Key: "tenant", Value: tenant}})
}

// newSingle starts a redis-server and returns a Store on it and a plain
// client for looking at the keys.
func newSingle(t testing.TB, opts ...redistest.Option) (*Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, opts...)
	c, err := NewClient(srv.URL())
	if err != nil {
		t.Fatalf("NewClient(%q): %v", srv.URL(), err)
	}
	s := newStore(c)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	return s, srv.Client(t)
}

func apply(t testing.TB, s limit.Store, now time.Time, cs ...limit.Charge) (bool, []limit.Result) {
	t.Helper()
	res := make([]limit.Result, len(cs))
	ok, err := s.Apply(context.Background(), now, cs, res)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return ok, res
}

func TestApply(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	sliding := limit.Charge{Key: key(limit.SlidingWindow, time.Second, "s"), Algorithm: limit.SlidingWindow, Amount: 5, Window: time.Second}
	fixed := limit.Charge{Key: key(limit.FixedWindow, time.Second, "f"), Algorithm: limit.FixedWindow, Amount: 5, Window: time.Second}
	bucket := limit.Charge{Key: key(limit.TokenBucket, time.Second, "t"), Algorithm: limit.TokenBucket, Amount: 5, Window: time.Second}
	with := func(c limit.Charge, cost int64) limit.Charge { c.Cost = cost; return c }

	// now = 1_700_000_000_123 ms. Sliding: w = 50, M = 20, cur*w = ..._100,
	// so a bucket charged now leaves the count at ..._100 + 21*50 = now+1027.
	// Fixed: the window ends at now+877. Token bucket: T = 200ms.
	type step struct {
		at     time.Duration
		give   []limit.Charge
		wantOK bool
		want   []limit.Result
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "sliding window fills, then frees bucket by bucket", steps: []step{
			{give: []limit.Charge{with(sliding, 3)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 2, ResetAfter: 1027 * ms}}},
			{at: 100 * ms, give: []limit.Charge{with(sliding, 2)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 0, ResetAfter: 1027 * ms}}},
			{at: 200 * ms, give: []limit.Charge{with(sliding, 3)}, wantOK: false, want: []limit.Result{{Fits: false, Remaining: 0, ResetAfter: 927 * ms, RetryAfter: 827 * ms}}},
			// A check at the limit fits: the counter is not over it.
			{at: 200 * ms, give: []limit.Charge{with(sliding, 0)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 0, ResetAfter: 927 * ms}}},
			{at: 1027 * ms, give: []limit.Charge{with(sliding, 3)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 0, ResetAfter: 1050 * ms}}},
			{at: 1027 * ms, give: []limit.Charge{with(sliding, -4)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 4, ResetAfter: 100 * ms}}},
		}},
		{name: "a charge larger than the limit never fits", steps: []step{
			{give: []limit.Charge{with(sliding, 1)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 4, ResetAfter: 1027 * ms}}},
			{give: []limit.Charge{with(sliding, 6)}, wantOK: false, want: []limit.Result{{Fits: false, Remaining: 4, ResetAfter: 1027 * ms, RetryAfter: 1027 * ms}}},
		}},
		{name: "fixed window resets at the epoch-aligned boundary", steps: []step{
			{give: []limit.Charge{with(fixed, 0)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 5, ResetAfter: 877 * ms}}},
			{give: []limit.Charge{with(fixed, 5)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 0, ResetAfter: 877 * ms}}},
			{at: 876 * ms, give: []limit.Charge{with(fixed, 1)}, wantOK: false, want: []limit.Result{{Fits: false, Remaining: 0, ResetAfter: 1 * ms, RetryAfter: 1 * ms}}},
			{at: 877 * ms, give: []limit.Charge{with(fixed, 1)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 4, ResetAfter: 1000 * ms}}},
		}},
		{name: "token bucket", steps: []step{
			{give: []limit.Charge{with(bucket, 2)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 3, ResetAfter: 400 * ms}}},
			{give: []limit.Charge{with(bucket, 3)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 0, ResetAfter: 1000 * ms}}},
			{at: 150 * ms, give: []limit.Charge{with(bucket, 1)}, wantOK: false, want: []limit.Result{{Fits: false, Remaining: 0, ResetAfter: 850 * ms, RetryAfter: 50 * ms}}},
			{at: 200 * ms, give: []limit.Charge{with(bucket, 0)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 1, ResetAfter: 800 * ms}}},
			{at: 200 * ms, give: []limit.Charge{with(bucket, -2)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 3, ResetAfter: 400 * ms}}},
			{at: 200 * ms, give: []limit.Charge{with(bucket, 6)}, wantOK: false, want: []limit.Result{{Fits: false, Remaining: 3, ResetAfter: 400 * ms, RetryAfter: 400 * ms}}},
		}},
		{name: "all or nothing", steps: []step{
			{give: []limit.Charge{with(sliding, 4), with(fixed, 4)}, wantOK: true, want: []limit.Result{
				{Fits: true, Remaining: 1, ResetAfter: 1027 * ms}, {Fits: true, Remaining: 1, ResetAfter: 877 * ms}}},
			// The bucket fits, the fixed window does not: nothing is kept,
			// the refund still applies.
			{give: []limit.Charge{with(sliding, -1), with(bucket, 2), with(fixed, 2)}, wantOK: false, want: []limit.Result{
				{Fits: true, Remaining: 2, ResetAfter: 1027 * ms},
				{Fits: true, Remaining: 5, ResetAfter: 0},
				{Fits: false, Remaining: 1, ResetAfter: 877 * ms, RetryAfter: 877 * ms}}},
			{give: []limit.Charge{with(bucket, 0)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 5}}},
		}},
		{name: "charges see the ones before them on the same key; results the end", steps: []step{
			{give: []limit.Charge{with(sliding, 3), with(sliding, 2)}, wantOK: true, want: []limit.Result{
				{Fits: true, Remaining: 0, ResetAfter: 1027 * ms}, {Fits: true, Remaining: 0, ResetAfter: 1027 * ms}}},
			{give: []limit.Charge{with(sliding, -1), with(sliding, 2)}, wantOK: false, want: []limit.Result{
				{Fits: true, Remaining: 1, ResetAfter: 1027 * ms}, {Fits: false, Remaining: 1, ResetAfter: 1027 * ms, RetryAfter: 1027 * ms}}},
		}},
		{name: "a shadow charge that does not fit is reported, not kept, and does not deny", steps: []step{
			{give: []limit.Charge{with(fixed, 4)}, wantOK: true, want: []limit.Result{{Fits: true, Remaining: 1, ResetAfter: 877 * ms}}},
			{give: []limit.Charge{func() limit.Charge { c := with(fixed, 2); c.Shadow = true; return c }(), with(bucket, 1)}, wantOK: true, want: []limit.Result{
				{Fits: false, Remaining: 1, ResetAfter: 877 * ms, RetryAfter: 877 * ms},
				{Fits: true, Remaining: 4, ResetAfter: 200 * ms}}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newSingle(t)
			// memstore is the reference: the expectations hold for both.
			for _, st := range []limit.Store{s, memstore.New()} {
				for i, step := range tt.steps {
					ok, res := apply(t, st, t0.Add(step.at), step.give...)
					if ok != step.wantOK {
						t.Errorf("%T step %d: admitted = %v, want %v", st, i, ok, step.wantOK)
					}
					for j := range res {
						if res[j] != step.want[j] {
							t.Errorf("%T step %d: res[%d] = %+v, want %+v", st, i, j, res[j], step.want[j])
						}
					}
				}
			}
		})
	}
}

// TestApplyForce checks Force charges as store.go words them: kept
// whatever the usage, never blocking, kept in a denied decision too.
func TestApplyForce(t *testing.T) {
	t.Parallel()
	s, _ := newSingle(t)
	force := func(c limit.Charge, cost int64) limit.Charge { c.Cost, c.Force = cost, true; return c }
	for _, give := range []limit.Charge{
		{Key: key(limit.FixedWindow, time.Hour, "f"), Algorithm: limit.FixedWindow, Amount: 3, Window: time.Hour},
		{Key: key(limit.SlidingWindow, time.Hour, "s"), Algorithm: limit.SlidingWindow, Amount: 3, Window: time.Hour},
		{Key: key(limit.TokenBucket, time.Hour, "t"), Algorithm: limit.TokenBucket, Amount: 3, Window: time.Hour},
	} {
		t.Run(give.Algorithm.String(), func(t *testing.T) {
			c := give
			c.Cost = 2
			apply(t, s, t0, c)
			ok, res := apply(t, s, t0, force(give, 2))
			if !ok || res[0].Fits || res[0].Remaining != 0 {
				t.Fatalf("force past the limit: admitted %v, %+v; want admitted, not fitting, 0 left", ok, res[0])
			}
			c.Cost = 0
			if ok, res := apply(t, s, t0, c); ok || res[0].Fits {
				t.Fatalf("a check after the forced charge fits: %+v", res[0])
			}
			// In a decision another charge denies, the Force charge stays.
			never := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "never"), Algorithm: limit.FixedWindow, Window: time.Hour, Cost: 1}
			later := t0.Add(3 * time.Hour)
			if ok, _ := apply(t, s, later, force(give, 3), never); ok {
				t.Fatal("admitted past a zero limit")
			}
			c.Cost = 1
			if ok, res := apply(t, s, later, c); ok || res[0].Remaining != 0 {
				t.Fatalf("the Force charge of a denied decision was not kept: %+v", res[0])
			}
		})
	}
}

// randomCharges is a random decision at now over a few keys of every
// algorithm: refunds (when refunds is set) aimed at a bucket or not,
// lease acquisitions, renewals and releases, and Once marks. The windows
// are long, so no key expires on the Redis clock while the test runs;
// fake time moves in steps comparable to the windows.
func randomCharges(r *rand.Rand, now time.Time, refunds bool) []limit.Charge {
	type spec struct {
		alg     limit.Algorithm
		window  time.Duration
		buckets uint16
	}
	specs := []spec{
		{limit.SlidingWindow, time.Hour, 0},
		{limit.SlidingWindow, 10 * time.Minute, 7},
		{limit.SlidingWindow, 10 * time.Minute, 3}, // the same key in another width
		{limit.SlidingWindow, 7 * time.Minute, 600},
		{limit.FixedWindow, time.Hour, 0},
		{limit.TokenBucket, time.Hour, 0},
		{limit.TokenBucket, 7 * time.Minute, 0},
		{limit.Concurrency, 3 * time.Minute, 0},
		{limit.Concurrency, 10 * time.Minute, 0},
		{limit.Once, 4 * time.Minute, 0}, // last: see below
	}
	n := 1 + r.IntN(5)
	cs := make([]limit.Charge, n)
	for i := range cs {
		sp := specs[r.IntN(len(specs))]
		if sp.alg == limit.Once && r.IntN(2) == 0 {
			// A live mark voids the whole decision: draw marks half as
			// often as the others, so that most decisions count.
			sp = specs[r.IntN(len(specs)-1)]
		}
		tenant := strconv.Itoa(r.IntN(4))
		c := limit.Charge{
			Key:       key(sp.alg, sp.window, tenant),
			Algorithm: sp.alg,
			Amount:    uint64(1 + r.IntN(30)),
			Window:    sp.window,
			Buckets:   sp.buckets,
			Cost:      int64(r.IntN(8)),
			Shadow:    r.IntN(10) == 0,
		}
		if sp.alg == limit.TokenBucket && r.IntN(2) == 0 {
			c.Burst = uint64(1 + r.IntN(40))
		}
		if refunds && r.IntN(6) == 0 {
			c.Cost = -int64(1 + r.IntN(8))
			if r.IntN(2) == 0 {
				c.At = now.UnixMilli() - r.Int64N(int64(2*sp.window/time.Millisecond))
			}
		}
		switch sp.alg {
		case limit.Concurrency:
			c.Amount = uint64(r.IntN(4))
			c.Member = "m" + strconv.Itoa(r.IntN(5))
			c.Cost = int64(r.IntN(3)) - 1
		case limit.Once:
			c.Cost = []int64{1, 1, 1, 0, -1}[r.IntN(5)]
		}
		cs[i] = c
	}
	return cs
}

// lateCharges is a random decision at now on the counters of prev: some
// of its charges, with costs drawn again.
func lateCharges(r *rand.Rand, now time.Time, prev []limit.Charge, refunds bool) []limit.Charge {
	var cs []limit.Charge
	for _, c := range prev {
		if len(cs) > 0 && r.IntN(3) == 0 {
			continue
		}
		c.Cost, c.At = int64(r.IntN(8)), 0
		if refunds && r.IntN(6) == 0 {
			c.Cost = -int64(1 + r.IntN(8))
			if r.IntN(2) == 0 {
				c.At = now.UnixMilli() - r.Int64N(int64(2*c.Window/time.Millisecond))
			}
		}
		switch c.Algorithm {
		case limit.Concurrency:
			c.Cost = int64(r.IntN(3)) - 1
		case limit.Once:
			c.Cost = []int64{1, 1, 1, 0, -1}[r.IntN(5)]
		}
		cs = append(cs, c)
	}
	return cs
}

// tally counts the decisions of a compare run that a cluster store must
// handle across slots.
type tally struct {
	// compensated is the denied decisions that spanned several slots with
	// a charge that fit in a slot other than a denying one.
	compensated int
	// voided is the decisions a Once mark voided that spanned several
	// slots; markedAcross, those with a Once charge that spanned several
	// slots (voided or not).
	voided, markedAcross int
}

// compare runs the same random schedule on s and on memstore, the
// reference implementation of limit.Counter, and tallies what a cluster
// store must do across slots.
func compare(t *testing.T, s limit.Store, seed uint64, decisions int, refunds bool) (n tally) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	m := memstore.New()
	latest := t0
	var now time.Time
	var cs []limit.Charge
	for d := range decisions {
		if d > 0 && r.IntN(8) == 0 {
			// Now and then a decision reaches the store after a later one,
			// or comes from a replica whose clock is behind: on the
			// counters of the decision just before it. Only those: a
			// memstore sweep drops state that has expired by the time of
			// the decision that sweeps, and a caller behind that time
			// would still count it, as Redis does (see memstore's package
			// doc). The counters the last decision wrote cannot have been
			// swept since.
			now = latest.Add(-time.Duration(r.IntN(40_000)) * time.Millisecond)
			cs = lateCharges(r, now, cs, refunds)
		} else {
			latest = latest.Add(time.Duration(r.IntN(90_000)) * time.Millisecond)
			now = latest
			cs = randomCharges(r, now, refunds)
		}
		want := make([]limit.Result, len(cs))
		wantOK, _ := m.Apply(context.Background(), now, cs, want)
		ok, got := apply(t, s, now, cs...)
		if ok != wantOK {
			t.Fatalf("seed %d decision %d at %d: admitted = %v, want %v\ncharges %+v", seed, d, now.UnixMilli(), ok, wantOK, cs)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("seed %d decision %d at %d: res[%d] = %+v, want %+v\ncharges %+v", seed, d, now.UnixMilli(), i, got[i], want[i], cs)
			}
		}
		if !ok && keptElsewhere(cs, got) {
			n.compensated++
		}
		if across, marked, voided := onceAcross(cs, got); across && marked {
			n.markedAcross++
			if voided {
				n.voided++
			}
		}
	}
	return n
}

// onceAcross reports whether a decision spans several slots, holds a Once
// charge, and was voided by one.
func onceAcross(cs []limit.Charge, res []limit.Result) (across, marked, voided bool) {
	for i, c := range cs {
		across = across || slot(c.Key) != slot(cs[0].Key)
		if c.Algorithm == limit.Once {
			marked = true
			voided = voided || (c.Cost >= 0 && !res[i].Fits)
		}
	}
	return across, marked, voided
}

// keptElsewhere reports whether a positive charge fit in a slot where no
// charge denied.
func keptElsewhere(cs []limit.Charge, res []limit.Result) bool {
	denying := map[int]bool{}
	for i, c := range cs {
		if c.Cost >= 0 && !c.Shadow && !res[i].Fits {
			denying[slot(c.Key)] = true
		}
	}
	for i, c := range cs {
		if c.Cost > 0 && res[i].Fits && !denying[slot(c.Key)] {
			return true
		}
	}
	return false
}

func TestApplyMatchesMemstore(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		give []redistest.Option
	}{
		{name: "tcp"},
		{name: "unix socket", give: []redistest.Option{redistest.WithUnixSocket()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newSingle(t, tt.give...)
			compare(t, s, 1, 1500, true)
		})
	}
}

func TestApplyTTL(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	r := rand.New(rand.NewPCG(2, 2))
	now := t0
	for range 300 {
		now = now.Add(time.Duration(r.IntN(90_000)) * time.Millisecond)
		res := make([]limit.Result, 5)
		cs := randomCharges(r, now, true)
		if _, err := s.Apply(context.Background(), now, cs, res[:len(cs)]); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no keys written")
	}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// -1 is a key without a TTL. Every TTL has a margin of a second,
		// so none can run out between KEYS and PTTL.
		if ttl <= 0 {
			t.Errorf("PTTL %s = %v, want > 0", k, ttl)
		}
	}
}

func TestApplyTTLValues(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	ctx := context.Background()
	sliding := limit.Charge{Key: key(limit.SlidingWindow, time.Hour, "a"), Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Hour, Buckets: 7, Cost: 1}
	fixed := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "a"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
	bucket := limit.Charge{Key: key(limit.TokenBucket, time.Hour, "a"), Algorithm: limit.TokenBucket, Amount: 10, Window: time.Hour, Cost: 3}
	lease := limit.Charge{Key: key(limit.Concurrency, time.Hour, "a"), Algorithm: limit.Concurrency, Amount: 10, Window: time.Hour, Cost: 1, Member: "r1"}
	shorter := lease
	shorter.Window, shorter.Member = time.Minute, "r2"
	mark := limit.Charge{Key: key(limit.Once, time.Hour, "a"), Algorithm: limit.Once, Window: 30 * time.Minute, Cost: 1}
	apply(t, s, t0, sliding, fixed, bucket, lease, shorter, mark)
	// A fixed window alone runs the counts function: the same expiry.
	alone := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "alone"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
	apply(t, s, t0, alone)
	// A key lives until it is equivalent to a fresh counter, plus a
	// second for the clocks of Redis and the replicas. Sliding:
	// w = ceil(3600000/7) = 514286, M = 7, so the bucket charged leaves
	// the count (cur+8)*w. Fixed: the end of the hour. Token bucket:
	// 3 * 360000ms of debt. Leases: the latest deadline. Once: the mark's.
	now := t0.UnixMilli()
	for _, tt := range []struct {
		key  string
		want int64
	}{
		{sliding.Key, (now/514286+8)*514286 - now + 1000},
		{countKeyAt(t, fixed, t0), (now/3600000+1)*3600000 - now + 1000},
		{countKeyAt(t, alone, t0), (now/3600000+1)*3600000 - now + 1000},
		{bucket.Key, 1080000 + 1000},
		{lease.Key, 3600000 + 1000},
		{mark.Key, 1800000 + 1000},
	} {
		got, err := c.PTTL(ctx, tt.key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// PTTL counts down on the Redis clock from the moment of writing.
		want := time.Duration(tt.want) * time.Millisecond
		if got > want || got < want-5*time.Second {
			t.Errorf("PTTL %s = %v, want %v", tt.key, got, want)
		}
	}
}

// roundTrips counts the commands a client sends, and among them the runs
// of the apply code (FCALL, or EVALSHA on a server without functions).
type roundTrips struct{ n, runs atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		if cmd.Name() == "fcall" || cmd.Name() == "evalsha" {
			h.runs.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		for _, cmd := range cmds { // a batching store's calls
			if cmd.Name() == "fcall" || cmd.Name() == "evalsha" {
				h.runs.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// commandStats returns INFO commandstats' calls and usec for cmd.
func commandStats(t testing.TB, c *redis.Client, cmd string) (calls, usec int64) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			name, v, _ := strings.Cut(field, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case name != "calls" && name != "usec":
			case err != nil:
				t.Fatalf("commandstats line %q: %v", line, err)
			case name == "calls":
				calls = n
			default:
				usec = n
			}
		}
	}
	return calls, usec
}

// scriptStats sums INFO commandstats' calls and usec over the commands
// that run the apply code, however the store sends it.
func scriptStats(t testing.TB, c *redis.Client) (calls, usec int64) {
	t.Helper()
	for _, cmd := range []string{"fcall", "evalsha", "eval"} {
		n, u := commandStats(t, c, cmd)
		calls += n
		usec += u
	}
	return calls, usec
}

func commandCalls(t testing.TB, c *redis.Client, cmd string) int64 {
	t.Helper()
	calls, _ := commandStats(t, c, cmd)
	return calls
}

func TestApplyOneRoundTrip(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	h := &roundTrips{}
	client.AddHook(h)
	s := newStore(client)
	t.Cleanup(func() { _ = s.Close() })
	admin := srv.Client(t)

	r := rand.New(rand.NewPCG(3, 3))
	now := t0
	apply(t, s, now, randomCharges(r, now, true)...) // loads the function (FCALL, FUNCTION LOAD, FCALL)
	h.n.Store(0)
	h.runs.Store(0)
	before := commandCalls(t, admin, "fcall")
	const decisions = 50
	for range decisions {
		now = now.Add(time.Second)
		apply(t, s, now, randomCharges(r, now, true)...)
	}
	if got := h.n.Load(); got != decisions {
		t.Errorf("%d round trips for %d decisions", got, decisions)
	}
	if got := h.runs.Load(); got != decisions {
		t.Errorf("%d FCALL for %d decisions", got, decisions)
	}
	if got := commandCalls(t, admin, "fcall") - before; got != decisions {
		t.Errorf("server counted %d FCALL for %d decisions", got, decisions)
	}
}

// TestApplyLoadsCode checks that the store loads its code again when the
// server lost it, and runs scripts on a server without functions.
func TestApplyLoadsCode(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		// wantRun is the command that runs the code once it is loaded.
		wantRun string
	}{
		{name: "functions", wantRun: "fcall"},
		{name: "no FCALL", args: []string{"--rename-command", "FCALL", ""}, wantRun: "evalsha"},
		{name: "no FUNCTION", args: []string{"--rename-command", "FUNCTION", ""}, wantRun: "evalsha"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, c := newSingle(t, redistest.WithArgs(tt.args...))
			ctx := context.Background()
			ch := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "a"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
			apply(t, s, t0, ch)
			for i, flush := range []func() error{
				func() error { return c.ScriptFlush(ctx).Err() },
				func() error {
					if tt.wantRun != "fcall" {
						return nil
					}
					return c.FunctionFlush(ctx).Err()
				},
			} {
				if err := flush(); err != nil {
					t.Fatal(err)
				}
				before := commandCalls(t, c, tt.wantRun)
				ok, res := apply(t, s, t0, ch)
				if want := uint64(10 - 2 - i); !ok || res[0].Remaining != want {
					t.Fatalf("flush %d: admitted %v, %+v; want admitted with %d left", i, ok, res[0], want)
				}
				if got := commandCalls(t, c, tt.wantRun) - before; got < 1 {
					t.Errorf("flush %d: no %s", i, tt.wantRun)
				}
			}
			before := commandCalls(t, c, tt.wantRun)
			apply(t, s, t0, ch)
			if got := commandCalls(t, c, tt.wantRun) - before; got != 1 {
				t.Errorf("a decision after the code was loaded: %d %s, want 1", got, tt.wantRun)
			}
		})
	}
}

func TestApplyWrongType(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name  string
		alg   limit.Algorithm
		setup func(k string) error
	}{
		{"window on a string", limit.SlidingWindow, func(k string) error { return c.Set(ctx, k, "x", 0).Err() }},
		{"window on a list", limit.SlidingWindow, func(k string) error { return c.RPush(ctx, k, "x").Err() }},
		{"fixed window count on a list", limit.FixedWindow, func(k string) error { return c.RPush(ctx, countKeyAt(t, fixedAt(k), t0), "x").Err() }},
		{"fixed window count not an integer", limit.FixedWindow, func(k string) error { return c.Set(ctx, countKeyAt(t, fixedAt(k), t0), "1.5", 0).Err() }},
		{"fixed window count below zero", limit.FixedWindow, func(k string) error { return c.Set(ctx, countKeyAt(t, fixedAt(k), t0), "-1", 0).Err() }},
		{"next fixed window count not a number", limit.FixedWindow, func(k string) error {
			return c.Set(ctx, countKeyAt(t, fixedAt(k), t0.Add(time.Hour)), "x", 0).Err()
		}},
		{"window with a non-numeric field", limit.SlidingWindow, func(k string) error { return c.HSet(ctx, k, "x", "1").Err() }},
		{"window with a non-numeric count", limit.SlidingWindow, func(k string) error { return c.HSet(ctx, k, "1", "y").Err() }},
		{"token bucket on a hash", limit.TokenBucket, func(k string) error { return c.HSet(ctx, k, "1", "1").Err() }},
		{"token bucket on a non-number", limit.TokenBucket, func(k string) error { return c.Set(ctx, k, "x", 0).Err() }},
		{"concurrency on a string", limit.Concurrency, func(k string) error { return c.Set(ctx, k, "1", 0).Err() }},
		{"concurrency on a hash", limit.Concurrency, func(k string) error { return c.HSet(ctx, k, "m", "1").Err() }},
		{"once on a hash", limit.Once, func(k string) error { return c.HSet(ctx, k, "1", "1").Err() }},
		{"once on a sorted set", limit.Once, func(k string) error { return c.ZAdd(ctx, k, redis.Z{Score: 1, Member: "m"}).Err() }},
		{"once on a token bucket", limit.Once, func(k string) error { return c.Set(ctx, k, "1:2.5", 0).Err() }},
		{"once on a fraction", limit.Once, func(k string) error { return c.Set(ctx, k, "1.5", 0).Err() }},
		{"token bucket on a mark", limit.TokenBucket, func(k string) error { return c.Set(ctx, k, "1700000000000", 0).Err() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := key(tt.alg, time.Hour, tt.name)
			if err := tt.setup(k); err != nil {
				t.Fatal(err)
			}
			res := make([]limit.Result, 1)
			ch := limit.Charge{Key: k, Algorithm: tt.alg, Amount: 10, Window: time.Hour, Cost: 1, Member: "m"}
			ok, err := s.Apply(ctx, t0, []limit.Charge{ch}, res)
			if err == nil || ok {
				t.Fatalf("Apply = %v, %v; want an error", ok, err)
			}
			if tt.alg == limit.FixedWindow {
				// A shadow charge runs apply's general path, not counts.
				ch.Shadow = true
				if ok, err := s.Apply(ctx, t0, []limit.Charge{ch}, res); err == nil || ok {
					t.Fatalf("Apply of a shadow charge = %v, %v; want an error", ok, err)
				}
			}
		})
	}
}

func TestApplyInvalid(t *testing.T) {
	t.Parallel()
	// No server is needed: invalid charges fail before any call.
	s := newStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))
	t.Cleanup(func() { _ = s.Close() })
	for _, tt := range []struct {
		name string
		give limit.Charge
		want string
	}{
		{"unknown algorithm", limit.Charge{Key: "k", Algorithm: 9, Amount: 1, Window: time.Second}, "unknown algorithm"},
		{"acquisition without a member", limit.Charge{Key: "k", Algorithm: limit.Concurrency, Amount: 1, Window: time.Second, Cost: 1}, "no member"},
		{"release without a member", limit.Charge{Key: "k", Algorithm: limit.Concurrency, Amount: 1, Window: time.Second, Cost: -1}, "no member"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Apply(context.Background(), t0, []limit.Charge{tt.give}, make([]limit.Result, 1))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Apply error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := s.Apply(context.Background(), t0, make([]limit.Charge, 2), make([]limit.Result, 1)); err == nil {
		t.Error("Apply with 1 result for 2 charges: no error")
	}
}

func TestResultMalformed(t *testing.T) {
	t.Parallel()
	win := limit.Charge{Algorithm: limit.SlidingWindow, Amount: 5, Window: time.Second}
	tb := limit.Charge{Algorithm: limit.TokenBucket, Amount: 5, Window: time.Second}
	for _, tt := range []struct {
		name string
		ch   limit.Charge
		rep  []any
	}{
		{"empty", win, []any{}},
		{"short", win, []any{int64(1), int64(1)}},
		{"long", win, []any{int64(1), int64(1), int64(0), int64(0), int64(0), int64(0)}},
		{"admitted not an integer", win, []any{"1", int64(1), int64(0), int64(0), int64(0)}},
		{"admitted out of range", win, []any{int64(2), int64(1), int64(0), int64(0), int64(0)}},
		{"fits nil", win, []any{int64(1), nil, int64(0), int64(0), int64(0)}},
		{"negative retry", win, []any{int64(1), int64(0), int64(-1), int64(0), int64(0)}},
		{"usage a string", win, []any{int64(1), int64(1), int64(0), "0", int64(0)}},
		{"negative reset", win, []any{int64(1), int64(1), int64(0), int64(0), int64(-1)}},
		{"debt an integer", tb, []any{int64(1), int64(1), int64(0), int64(5), int64(0)}},
		{"debt not a number", tb, []any{int64(1), int64(1), int64(0), "x", int64(0)}},
		{"debt negative", tb, []any{int64(1), int64(1), int64(0), "-1", int64(0)}},
		{"debt NaN", tb, []any{int64(1), int64(1), int64(0), "nan", int64(0)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &call{mode: "apply", now: 1000}
			_, err := c.decode(tt.rep, []limit.Charge{tt.ch}, make([]limit.Result, 1))
			if !errors.Is(err, errReply) {
				t.Fatalf("decode error = %v, want a malformed reply error", err)
			}
		})
	}
}

func TestApplyContextDeadline(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	ctx := context.Background()
	// A paused server answers nothing; the caller's deadline still holds.
	if err := c.Do(ctx, "client", "pause", "2000", "all").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	ch := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "a"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
	_, err := s.Apply(ctx, t0, []limit.Charge{ch}, make([]limit.Result, 1))
	if err == nil {
		t.Fatal("Apply on a paused server: no error")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Apply returned after %v, want about the 50ms deadline", d)
	}
}

func BenchmarkApply(b *testing.B) {
	for _, bc := range []struct {
		name string
		algs []limit.Algorithm
	}{
		{"sliding", []limit.Algorithm{limit.SlidingWindow}},
		{"fixed", []limit.Algorithm{limit.FixedWindow}},
		{"token", []limit.Algorithm{limit.TokenBucket}},
		{"all3", []limit.Algorithm{limit.SlidingWindow, limit.TokenBucket, limit.FixedWindow}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := redistest.Start(b)
			c, err := NewClient(srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			s := newStore(c)
			b.Cleanup(func() { _ = s.Close() })
			// A descriptor's limits share a hash tag, as limit.Key makes them.
			cs := make([]limit.Charge, len(bc.algs))
			for i, alg := range bc.algs {
				cs[i] = limit.Charge{Key: key(alg, time.Minute, "bench"), Algorithm: alg, Amount: 1 << 40, Window: time.Minute, Cost: 1}
			}
			res := make([]limit.Result, len(cs))
			ctx := context.Background()
			now := t0
			admin := srv.Client(b)
			if _, err := s.Apply(ctx, now, cs, res); err != nil { // loads the script
				b.Fatal(err)
			}
			calls, usec := scriptStats(b, admin)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				now = now.Add(time.Millisecond)
				if _, err := s.Apply(ctx, now, cs, res); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			// The script's own time in Redis, apart from the round trip.
			calls2, usec2 := scriptStats(b, admin)
			if calls2 > calls {
				b.ReportMetric(float64(usec2-usec)/float64(calls2-calls), "redis-µs/op")
			}
		})
	}
}

// TestPingLoadsTheLibrary: the first Ping (a replica's readiness check)
// loads the function library, so the first decision runs it in one FCALL
// rather than finding it missing and loading it within its timeout.
func TestPingLoadsTheLibrary(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	s := newStore(client)
	t.Cleanup(func() { _ = s.Close() })
	admin := srv.Client(t)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	libs, err := admin.FunctionList(context.Background(), redis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 1 || !strings.HasPrefix(libs[0].Name, "tollgate_") {
		t.Fatalf("libraries after Ping: %+v, want the tollgate library", libs)
	}
	before := commandCalls(t, admin, "fcall")
	apply(t, s, t0, limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Second, Cost: 1})
	if got := commandCalls(t, admin, "fcall") - before; got != 1 {
		t.Errorf("the first decision after Ping ran %d FCALLs, want 1", got)
	}
}

// countKeyAt is the key where the store counts fixed-window charge ch's
// window at now (limit.CountKey).
func countKeyAt(t testing.TB, ch limit.Charge, now time.Time) string {
	t.Helper()
	k, ok := limit.CountKey(&ch, now.UnixMilli())
	if !ok {
		t.Fatalf("%q has no count key", ch.Key)
	}
	return k
}

// fixedAt is TestApplyWrongType's fixed-window charge on key k.
func fixedAt(k string) limit.Charge {
	return limit.Charge{Key: k, Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
}
