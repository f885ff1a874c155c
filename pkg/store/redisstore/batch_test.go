package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// testBatch is the WithBatch of the stores the tests make with newStore.
var testBatch int

// TestMain runs every test twice: with batching off, as the service runs
// by default, then with WithBatch(8), so that conformance, the
// differential tests against memstore, undo and the cost tests hold both
// ways.
func TestMain(m *testing.M) {
	code := m.Run()
	testBatch = 8
	fmt.Println("=== the same tests, with WithBatch(8)")
	if c := m.Run(); code == 0 {
		code = c
	}
	os.Exit(code)
}

// newStore is New, batching as testBatch says.
func newStore(c redis.UniversalClient) *Store {
	if testBatch > 1 {
		return New(c, WithBatch(testBatch))
	}
	return New(c)
}

// pipelines counts the pipelines a client sends and the FCALLs in them,
// and the FCALLs it sends alone (lone).
type pipelines struct {
	n, fcalls, largest, lone atomic.Int64
}

func (h *pipelines) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			h.lone.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		k := int64(0)
		for _, c := range cmds {
			if c.Name() == "fcall" {
				k++
			}
		}
		h.fcalls.Add(k)
		for {
			l := h.largest.Load()
			if k <= l || h.largest.CompareAndSwap(l, k) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestBatchSharesPipelines: decisions queued while Redis is busy go in
// pipelines of up to the batch size, each still its own atomic FCALL, and
// a key they share admits exactly its limit. At most one of them runs
// alone (batcher.direct: the store was idle when it came).
func TestBatchSharesPipelines(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	h := &pipelines{}
	client.AddHook(h)
	const size = 16
	s := New(client, WithBatch(size))
	t.Cleanup(func() { _ = s.Close() })
	admin := srv.Client(t)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// An idle store sends a lone decision as it comes, not through a
	// worker's pipeline.
	// (A pipeline without FCALL is a new connection's handshake.)
	h.fcalls.Store(0)
	alone := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "alone"), Algorithm: limit.FixedWindow, Amount: 20, Window: time.Hour, Cost: 1}
	apply(t, s, t0, alone)
	if n, lone := h.fcalls.Load(), h.lone.Load(); n != 0 || lone != 1 {
		t.Errorf("a decision on an idle store: %d FCALLs in pipelines and %d alone, want 0 and 1", n, lone)
	}
	h.n.Store(0)
	h.fcalls.Store(0)
	h.lone.Store(0)
	before := commandCalls(t, admin, "fcall")
	// The workers' first pipelines wait out the pause; the rest queue
	// behind them.
	if err := admin.Do(ctx, "client", "pause", "300", "all").Err(); err != nil {
		t.Fatal(err)
	}
	const decisions = 64
	shared := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "shared"), Algorithm: limit.FixedWindow, Amount: 20, Window: time.Hour, Cost: 1}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range decisions {
		wg.Go(func() {
			own := limit.Charge{Key: key(limit.SlidingWindow, time.Minute, fmt.Sprint("own", i)), Algorithm: limit.SlidingWindow, Amount: 1000, Window: time.Minute, Cost: 1}
			cs := []limit.Charge{own, shared}
			res := make([]limit.Result, 2)
			ok, err := s.Apply(ctx, t0, cs, res)
			if err != nil {
				t.Errorf("Apply: %v", err)
				return
			}
			if ok {
				admitted.Add(1)
			}
			if want := uint64(999); ok && res[0].Remaining != want {
				t.Errorf("own key: remaining %d, want %d", res[0].Remaining, want)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 20 {
		t.Errorf("%d of %d decisions admitted on a shared limit of 20", got, decisions)
	}
	if got, lone := h.fcalls.Load(), h.lone.Load(); got+lone != decisions || lone > 1 {
		t.Errorf("%d FCALLs in pipelines and %d alone for %d decisions, want at most 1 alone", got, lone, decisions)
	}
	if got := commandCalls(t, admin, "fcall") - before; got != decisions {
		t.Errorf("server counted %d FCALL for %d decisions", got, decisions)
	}
	n, largest := h.n.Load(), h.largest.Load()
	t.Logf("%d decisions in %d pipelines, the largest of %d", decisions, n, largest)
	if n > decisions/4 {
		t.Errorf("%d pipelines for %d concurrent decisions, want at most %d", n, decisions, decisions/4)
	}
	if largest > size {
		t.Errorf("a pipeline of %d calls, want at most %d", largest, size)
	}
}

// TestBatchCallerGivesUp: a decision whose context ends while its call
// waits in a pipeline has its error at once; the pipeline still completes
// (Redis runs the call, as it would without batching) and its connection
// goes back to the pool rather than being closed.
func TestBatchCallerGivesUp(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c, err := NewClient(srv.URL()) // 250ms read timeout, contexts bound calls
	if err != nil {
		t.Fatal(err)
	}
	rc := c.(*redis.Client)
	s := New(c, WithBatch(16))
	t.Cleanup(func() { _ = s.Close() })
	admin := srv.Client(t)
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	// The connections open now, by the server's client ids: a caller that
	// gives up must close none of them (the pool may dial more on a busy
	// machine, which is no harm).
	before := clientIDs(t, admin)
	if err := admin.Do(ctx, "client", "pause", "150", "all").Err(); err != nil {
		t.Fatal(err)
	}
	mine := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "gives-up"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
	other := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "waits"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
	// BatchWorkers decisions, one run alone (batcher.direct) and the
	// others by workers, wait out the pause, so that mine is queued.
	waited := make(chan error, BatchWorkers)
	for i := range BatchWorkers {
		go func() {
			ch := other
			ch.Key += strconv.Itoa(i)
			_, err := s.Apply(ctx, t0, []limit.Charge{ch}, make([]limit.Result, 1))
			waited <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); s.batch.senders.Load() < BatchWorkers; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d decisions in flight", s.batch.senders.Load(), BatchWorkers)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Apply(short, t0, []limit.Charge{mine}, make([]limit.Result, 1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply with a 20ms deadline on a paused server: %v, want the deadline", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Apply returned %v after its 20ms deadline, want at once", d)
	}
	for range BatchWorkers {
		if err := <-waited; err != nil {
			t.Fatalf("a decision that waited: %v", err)
		}
	}
	// The call whose caller gave up runs: its key holds its charge.
	for deadline := time.Now().Add(time.Second); admin.Exists(ctx, countKeyAt(t, mine, t0)).Val() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned call never ran")
		}
	}
	_, res := apply(t, s, t0, mine)
	if res[0].Remaining != 8 {
		t.Errorf("remaining %d after the abandoned call and one more, want 8", res[0].Remaining)
	}
	after := clientIDs(t, admin)
	for id := range before {
		if !after[id] {
			t.Errorf("connection %s was closed after the caller gave up (before: %v, after: %v; pool %+v)", id, before, after, *rc.PoolStats())
		}
	}
}

// clientIDs returns the ids of the connections the server has open.
func clientIDs(t *testing.T, admin *redis.Client) map[string]bool {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for line := range strings.Lines(list) {
		for f := range strings.FieldsSeq(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids[id] = true
			}
		}
	}
	if len(ids) == 0 {
		t.Fatalf("CLIENT LIST lists no connection: %q", list)
	}
	return ids
}

// TestBatchClose: Close stops the workers, and a call on a closed store
// fails at once. Not parallel, so that goleak sees only this test's
// goroutines.
func TestBatchClose(t *testing.T) {
	srv := redistest.Start(t)
	ignore := goleak.IgnoreCurrent()
	s := New(redis.NewClient(&redis.Options{Addr: srv.Addr()}), WithBatch(8))
	ch := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "close"), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
	apply(t, s, t0, ch)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Apply(context.Background(), t0, []limit.Charge{ch}, make([]limit.Result, 1))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, redis.ErrClosed) {
			t.Errorf("Apply on a closed store: %v, want redis.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Apply on a closed store did not return")
	}
	goleak.VerifyNone(t, ignore)
}

// TestCountsMerged sends four fixed-window decisions as one batch: they
// go to Redis as one FCALL of counts, run one after another, each all or
// nothing, and a decision whose key holds no count fails alone.
func TestCountsMerged(t *testing.T) {
	t.Parallel()
	s, admin := batching(t, 8)
	ctx := context.Background()
	fixed := func(name string, amount uint64, cost int64) limit.Charge {
		return limit.Charge{Key: key(limit.FixedWindow, time.Minute, name), Algorithm: limit.FixedWindow, Amount: amount, Window: time.Minute, Cost: cost}
	}
	broken := fixed("broken", 5, 1)
	if err := admin.RPush(ctx, countKeyAt(t, broken, t0), "x").Err(); err != nil {
		t.Fatal(err)
	}
	// A next window's key that holds no count (the one a clock ahead
	// would have started) fails its decision alone too.
	brokenNext := fixed("broken-next", 5, 1)
	if err := admin.Set(ctx, countKeyAt(t, brokenNext, t0.Add(time.Minute)), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	decisions := [][]limit.Charge{
		{fixed("a", 1, 1)},                           // admitted: a is full
		{fixed("b", 5, 2), fixed("a", 1, 1)},         // denied by a: b keeps nothing
		{fixed("d", 5, 1), fixed("e", 5, 1), broken}, // fails alone, and takes back d and e
		{brokenNext},                          // fails alone
		{fixed("a", 1, -1), fixed("b", 5, 0)}, // a refund and a check: admitted
	}
	batch := sendMerged(t, s, admin, fnCounts, decisions)
	end := limit.Millis(time.Minute.Milliseconds() - t0.UnixMilli()%time.Minute.Milliseconds())
	for i, want := range []struct {
		admitted bool
		res      []limit.Result
		err      bool
	}{
		{true, []limit.Result{{Fits: true, Remaining: 0, ResetAfter: end}}, false},
		{false, []limit.Result{{Fits: true, Remaining: 5, ResetAfter: end}, {Fits: false, Remaining: 0, ResetAfter: end, RetryAfter: end}}, false},
		{false, nil, true},
		{false, nil, true},
		{true, []limit.Result{{Fits: true, Remaining: 1, ResetAfter: end}, {Fits: true, Remaining: 5, ResetAfter: end}}, false},
	} {
		d := <-batch[i].out
		if d.err != nil {
			t.Fatalf("decision %d: %v", i, d.err)
		}
		res := make([]limit.Result, len(decisions[i]))
		admitted, err := batch[i].call.decode(d.rep, decisions[i], res)
		if want.err {
			if err == nil || !strings.Contains(err.Error(), "holds no count") {
				t.Errorf("decision %d: error %v, want one that says its key holds no count", i, err)
			}
			continue
		}
		if err != nil || admitted != want.admitted {
			t.Errorf("decision %d: admitted %v, %v; want %v", i, admitted, err, want.admitted)
		}
		for j := range res {
			if res[j] != want.res[j] {
				t.Errorf("decision %d charge %d: %+v, want %+v", i, j, res[j], want.res[j])
			}
		}
	}
	for _, name := range []string{"d", "e"} {
		if n := admin.Exists(ctx, countKeyAt(t, fixed(name, 5, 1), t0)).Val(); n != 0 {
			t.Errorf("the failed decision left %s's count", name)
		}
	}
	if n, err := admin.Get(ctx, countKeyAt(t, fixed("a", 1, 1), t0)).Result(); err != nil || n != "0" {
		t.Errorf("a's count = %q, %v; want 0 after its refund", n, err)
	}
}

// TestCountsConcurrentExact runs fixed-window decisions from many
// goroutines on a batching store: the batches merge them into counts
// calls, and a shared limit still admits exactly its amount, all or
// nothing with each decision's own counter.
func TestCountsConcurrentExact(t *testing.T) {
	t.Parallel()
	s, admin := batching(t, 32)
	const workers, each, amount = 16, 50, 300
	shared := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "shared"), Algorithm: limit.FixedWindow, Amount: amount, Window: time.Hour, Cost: 1}
	before := commandCalls(t, admin, "fcall")
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			own := limit.Charge{Key: key(limit.FixedWindow, time.Hour, fmt.Sprintf("own-%d", w)), Algorithm: limit.FixedWindow, Amount: each, Window: time.Hour, Cost: 1}
			for range each {
				ok, err := s.Apply(context.Background(), t0, []limit.Charge{own, shared}, make([]limit.Result, 2))
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != amount {
		t.Errorf("%d decisions admitted on a shared limit of %d", n, amount)
	}
	if n, _ := admin.Get(context.Background(), countKeyAt(t, shared, t0)).Int64(); n != amount {
		t.Errorf("shared count %d, want %d", n, amount)
	}
	var own int64
	for w := range workers {
		k := limit.Charge{Key: key(limit.FixedWindow, time.Hour, fmt.Sprintf("own-%d", w)), Algorithm: limit.FixedWindow, Window: time.Hour}
		n, _ := admin.Get(context.Background(), countKeyAt(t, k, t0)).Int64()
		own += n
	}
	if own != amount {
		t.Errorf("the decisions' own counters hold %d, want the %d admitted", own, amount)
	}
	calls := commandCalls(t, admin, "fcall") - before
	t.Logf("%d decisions in %d FCALLs", workers*each, calls)
	if calls >= workers*each {
		t.Errorf("%d FCALLs for %d concurrent decisions: none merged", calls, workers*each)
	}
}

// TestMergedMatchesMemstore sends random decisions in batches of eight,
// each batch one pipeline whose counts and plains calls merge into one
// FCALL each, and checks every decision against memstore applying the
// same decisions in the order Redis ran them: the other calls in the
// batch's order, then the merged counts decisions, then the plains ones.
func TestMergedMatchesMemstore(t *testing.T) {
	t.Parallel()
	s, _ := batching(t, 8)
	m := memstore.New()
	r := rand.New(rand.NewPCG(7, 7))
	now := t0
	mergedBy := map[fnKind]int{}
	for round := range 150 {
		now = now.Add(time.Duration(r.IntN(40_000)) * time.Millisecond)
		type decision struct {
			charges []limit.Charge
			now     time.Time
			p       *pending
		}
		var byFn [3][]decision
		for range 8 {
			cs := randomCharges(r, now, true)
			if r.IntN(3) == 0 {
				// A fixed window alone or a pair: counts.
				cs = []limit.Charge{{Key: key(limit.FixedWindow, time.Hour, strconv.Itoa(r.IntN(4))), Algorithm: limit.FixedWindow,
					Amount: uint64(1 + r.IntN(30)), Window: time.Hour, Cost: int64(r.IntN(8)) - 1}}
			}
			call, err := newCall("apply", now.UnixMilli(), cs)
			if err != nil {
				t.Fatal(err)
			}
			byFn[call.fn] = append(byFn[call.fn], decision{charges: cs})
		}
		// Each decision its own time, later in the order Redis runs them
		// (memstore sweeps what has expired at a decision's time).
		var batch []*pending
		for _, ds := range byFn {
			for i := range ds {
				now = now.Add(time.Duration(r.IntN(500)) * time.Millisecond)
				call, err := newCall("apply", now.UnixMilli(), ds[i].charges)
				if err != nil {
					t.Fatal(err)
				}
				ds[i].now, ds[i].p = now, &pending{ctx: context.Background(), call: call, out: make(chan detached, 1)}
				batch = append(batch, ds[i].p)
			}
			if len(ds) > 1 {
				mergedBy[ds[0].p.call.fn]++
			}
		}
		var mc, pl merged
		s.batch.send(batch, nil, &mc, &pl)
		for _, ds := range byFn {
			for i, d := range ds {
				want := make([]limit.Result, len(d.charges))
				wantOK, _ := m.Apply(context.Background(), d.now, d.charges, want)
				out := <-d.p.out
				if out.err != nil {
					t.Fatalf("round %d, %v call %d: %v", round, d.p.call.fn, i, out.err)
				}
				got := make([]limit.Result, len(d.charges))
				ok, err := d.p.call.decode(out.rep, d.charges, got)
				if err != nil || ok != wantOK {
					t.Fatalf("round %d, %v call %d: admitted %v, %v; want %v\ncharges %+v", round, d.p.call.fn, i, ok, err, wantOK, d.charges)
				}
				for j := range got {
					if got[j] != want[j] {
						t.Fatalf("round %d, %v call %d: res[%d] = %+v, want %+v\ncharges %+v", round, d.p.call.fn, i, j, got[j], want[j], d.charges)
					}
				}
			}
		}
	}
	if mergedBy[fnCounts] == 0 || mergedBy[fnPlains] == 0 {
		t.Errorf("batches that merged calls: %v; want some of counts and of plains", mergedBy)
	}
}

// TestPlainsFailAlone merges three sliding-window decisions into one
// plains call; the middle one's key holds a list: it fails alone, with
// the script's error, and the others are admitted and written.
func TestPlainsFailAlone(t *testing.T) {
	t.Parallel()
	s, admin := batching(t, 8)
	ctx := context.Background()
	sliding := func(name string) limit.Charge {
		return limit.Charge{Key: key(limit.SlidingWindow, time.Minute, name), Algorithm: limit.SlidingWindow, Amount: 5, Window: time.Minute, Cost: 2}
	}
	if err := admin.RPush(ctx, sliding("broken").Key, "x").Err(); err != nil {
		t.Fatal(err)
	}
	decisions := [][]limit.Charge{{sliding("a")}, {sliding("broken"), sliding("c")}, {sliding("c")}}
	batch := sendMerged(t, s, admin, fnPlains, decisions)
	for i := range decisions {
		d := <-batch[i].out
		if d.err != nil {
			t.Fatalf("decision %d: %v", i, d.err)
		}
		res := make([]limit.Result, len(decisions[i]))
		ok, err := batch[i].call.decode(d.rep, decisions[i], res)
		if i == 1 {
			if err == nil || !strings.Contains(err.Error(), "does not hold a window") {
				t.Errorf("decision on the broken key: %v, %v; want the script's error", ok, err)
			}
			continue
		}
		if err != nil || !ok {
			t.Errorf("decision %d: %v, %v; want admitted", i, ok, err)
		}
	}
	// c was charged once, by the third decision: the second wrote nothing.
	res := make([]limit.Result, 1)
	if _, err := s.Apply(ctx, t0, []limit.Charge{{Key: sliding("c").Key, Algorithm: limit.SlidingWindow, Amount: 5, Window: time.Minute}}, res); err != nil || res[0].Remaining != 3 {
		t.Errorf("c after the batch: %+v, %v; want 3 remaining", res[0], err)
	}
}

// batching starts a redis-server and returns a store on it that batches
// up to n calls, and a plain client for looking at the keys.
func batching(t *testing.T, n int) (*Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	c, err := NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	s := New(c, WithBatch(n))
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, srv.Client(t)
}

// sendMerged sends decisions at t0, each a call of fn, as one batch of s,
// checks that they went as one FCALL, and returns their pendings, whose
// outcomes are waiting.
func sendMerged(t *testing.T, s *Store, admin *redis.Client, fn fnKind, decisions [][]limit.Charge) []*pending {
	t.Helper()
	batch := make([]*pending, len(decisions))
	for i, d := range decisions {
		call, err := newCall("apply", t0.UnixMilli(), d)
		if err != nil || call.fn != fn {
			t.Fatalf("decision %d: newCall = %v; want a call of function %d", i, err, fn)
		}
		batch[i] = &pending{ctx: context.Background(), call: call, out: make(chan detached, 1)}
	}
	before := commandCalls(t, admin, "fcall")
	var m, pl merged
	s.batch.send(batch, nil, &m, &pl)
	if n := commandCalls(t, admin, "fcall") - before; n != 1 {
		t.Errorf("%d FCALLs for a batch of %d calls, want 1", n, len(decisions))
	}
	return batch
}

// BenchmarkApplyBatched: 50 callers at once, each decision on a key of
// its own (a fixed window, a sliding window), on a batching store: the
// queued path's allocations per decision, and Redis's time per decision.
func BenchmarkApplyBatched(b *testing.B) {
	for _, tt := range []struct {
		name       string
		alg        limit.Algorithm
		optimistic bool
	}{
		{"fixed_window", limit.FixedWindow, false},
		{"fixed_window_optimistic", limit.FixedWindow, true},
		{"sliding_window", limit.SlidingWindow, false},
	} {
		alg := tt.alg
		b.Run(tt.name, func(b *testing.B) {
			srv := redistest.Start(b)
			c, err := NewClient(srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			s := New(c, WithBatch(32), WithOptimisticFixed(tt.optimistic))
			b.Cleanup(func() { _ = s.Close() })
			ctx := context.Background()
			if err := s.Warm(ctx); err != nil {
				b.Fatal(err)
			}
			admin := srv.Client(b)
			before := redisCPU(b, admin)
			var seq atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(25)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				res := make([]limit.Result, 1)
				cs := make([]limit.Charge, 1)
				for pb.Next() {
					cs[0] = limit.Charge{Key: key(alg, time.Minute, strconv.FormatInt(seq.Add(1), 10)), Algorithm: alg, Amount: 100, Window: time.Minute, Cost: 1}
					if _, err := s.Apply(ctx, t0, cs, res); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric((redisCPU(b, admin)-before)/float64(b.N), "redis-µs/op")
		})
	}
}

// redisCPU is the CPU time (µs) Redis has used, all its threads and the
// kernel's work for them: what make bench-redis reads.
func redisCPU(tb testing.TB, admin *redis.Client) float64 {
	tb.Helper()
	return cpuMicros(tb, admin, "used_cpu_sys", "used_cpu_user")
}

// TestBatchWaitGathers: with WithBatchWait, a worker that took a queued
// decision waits for more, and decisions queued 10 ms apart go to Redis
// as one FCALL of counts; without it they do not.
// A lone call in flight (counted by hand) keeps the store from being
// idle, so that none of them runs directly.
func TestBatchWaitGathers(t *testing.T) {
	t.Parallel()
	const decisions = 5
	for _, tt := range []struct {
		name   string
		wait   time.Duration
		merged bool // all in one FCALL; else in more than one
	}{
		{name: "wait", wait: 500 * time.Millisecond, merged: true},
		{name: "no wait"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			h := &pipelines{}
			client.AddHook(h)
			s := New(client, WithBatch(16), WithBatchWait(tt.wait))
			t.Cleanup(func() { _ = s.Close() })
			ctx := context.Background()
			if err := s.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			h.fcalls.Store(0)
			s.batch.senders.Add(1)
			defer s.batch.senders.Add(-1)
			var wg sync.WaitGroup
			start := time.Now()
			for i := range decisions {
				ch := limit.Charge{Key: key(limit.FixedWindow, time.Hour, fmt.Sprint("gather", i)), Algorithm: limit.FixedWindow, Amount: 10, Window: time.Hour, Cost: 1}
				wg.Go(func() {
					ok, err := s.Apply(ctx, t0, []limit.Charge{ch}, make([]limit.Result, 1))
					if err != nil || !ok {
						t.Errorf("decision %d: %v, %v; want admitted", i, ok, err)
					}
				})
				time.Sleep(10 * time.Millisecond)
			}
			wg.Wait()
			// Without the wait, a stalled worker may still find two
			// queued; all five would take a 40ms stall.
			if n := h.fcalls.Load(); (n == 1) != tt.merged || h.lone.Load() != 0 {
				t.Errorf("%d decisions queued 10ms apart went as %d FCALLs in pipelines (%d alone), want them merged: %v", decisions, n, h.lone.Load(), tt.merged)
			}
			if took := time.Since(start); tt.wait > 0 && took > tt.wait+time.Second {
				t.Errorf("the decisions took %v, want about the %v wait", took, tt.wait)
			}
		})
	}
}

// BenchmarkLoneCall is what one decision sent alone costs Redis, each
// from one caller in turn (every call its own read and write, as at a
// moderate, evenly spaced load), against what the INCRBY baseline of
// make bench-redis sends, and against an empty script: redis-µs/op is
// INFO cpu's used_cpu_sys + used_cpu_user per call (main thread and
// kernel work for the socket). It says how far a script call per
// decision can come to the baseline when nothing merges decisions:
//
//   - incrby-pexpire: a pipeline of INCRBY and PEXPIRE (the baseline)
//   - eval-return-1: EVAL "return 1", no keys
//   - fixed, sliding: Store.Apply of one charge on a fresh key
//     (counts, plains)
func BenchmarkLoneCall(b *testing.B) {
	if testBatch != 0 {
		b.Skip("the unbatched pass measures it")
	}
	srv := redistest.Start(b)
	c, err := NewClient(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	s := New(c)
	b.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		b.Fatal(err)
	}
	admin := srv.Client(b)
	rc := srv.Client(b)
	var seq int64
	run := func(b *testing.B, f func(k string)) {
		before := redisCPU(b, admin)
		b.ResetTimer()
		for b.Loop() {
			seq++
			f(strconv.FormatInt(seq, 10))
		}
		b.StopTimer()
		b.ReportMetric((redisCPU(b, admin)-before)/float64(b.N), "redis-µs/op")
	}
	b.Run("incrby-pexpire", func(b *testing.B) {
		run(b, func(k string) {
			p := rc.Pipeline()
			p.IncrBy(ctx, "base_"+k, 1)
			p.PExpire(ctx, "base_"+k, time.Second)
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("eval-return-1", func(b *testing.B) {
		run(b, func(string) {
			if err := rc.Eval(ctx, "return 1", nil).Err(); err != nil {
				b.Fatal(err)
			}
		})
	})
	for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow} {
		b.Run(alg.String(), func(b *testing.B) {
			res := make([]limit.Result, 1)
			run(b, func(k string) {
				ch := []limit.Charge{{Key: key(alg, time.Minute, k), Algorithm: alg, Amount: 100, Window: time.Minute, Cost: 1}}
				if _, err := s.Apply(ctx, t0, ch, res); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
