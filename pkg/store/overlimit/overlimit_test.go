package overlimit_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/overlimit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// counting is a limit.Store that counts the calls reaching memstore.
type counting struct {
	inner limit.Store
	calls atomic.Int64
}

func (c *counting) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	c.calls.Add(1)
	return c.inner.Apply(ctx, now, charges, res)
}

var t0 = time.UnixMilli(20000 * 86400000)

func key(name string) string {
	return limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "overlimit", []limit.Entry{{Key: "k", Value: name}})
}

// A sliding window of 2 per minute in 6 buckets of 10 s.
func win(name string, cost int64) limit.Charge {
	return limit.Charge{Key: key(name), Algorithm: limit.SlidingWindow, Amount: 2, Window: time.Minute, Buckets: 6, Cost: cost}
}

func refund(c limit.Charge) limit.Charge { c.Cost = -c.Cost; return c }
func force(c limit.Charge) limit.Charge  { c.Force = true; return c }

// step is one Apply at ms after t0.
type step struct {
	at        int64
	give      []limit.Charge
	admitted  bool
	wantCalls int64 // inner calls so far, after the step
}

func ds(c ...limit.Charge) []limit.Charge { return c }

func TestLocalDenials(t *testing.T) {
	t.Parallel()
	// Every case starts by filling "a" (2 of 2) and being denied once at
	// 1 s: RetryAfter is then 69 s (the bucket of 0 s leaves at 70 s).
	fill := []step{
		{at: 0, give: ds(win("a", 2)), admitted: true, wantCalls: 1},
		{at: 1000, give: ds(win("a", 1)), admitted: false, wantCalls: 2},
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "over-limit key is answered locally until RetryAfter", steps: []step{
			{at: 2000, give: ds(win("a", 1)), wantCalls: 2},
			{at: 30000, give: ds(win("a", 1)), wantCalls: 2},
			{at: 69999, give: ds(win("a", 1)), wantCalls: 2},
			{at: 70000, give: ds(win("a", 1)), admitted: true, wantCalls: 3},
		}},
		{name: "another cost passes through", steps: []step{
			{at: 2000, give: ds(win("a", 2)), wantCalls: 3},
			{at: 3000, give: ds(win("a", 2)), wantCalls: 3},
			{at: 4000, give: ds(win("a", 1)), wantCalls: 4}, // a smaller cost asks too
		}},
		{name: "a check passes through", steps: []step{
			// At the limit, not over it: the store says it fits.
			{at: 2000, give: ds(win("a", 0)), admitted: true, wantCalls: 3},
		}},
		{name: "a refund passes through and invalidates", steps: []step{
			{at: 2000, give: ds(refund(win("a", 1))), admitted: true, wantCalls: 3},
			{at: 3000, give: ds(win("a", 1)), admitted: true, wantCalls: 4},
		}},
		{name: "a Force charge passes through", steps: []step{
			{at: 2000, give: ds(win("b", 1), force(win("a", 1))), admitted: true, wantCalls: 3},
			{at: 3000, give: ds(win("a", 1)), wantCalls: 4},
			{at: 4000, give: ds(win("a", 1)), wantCalls: 4},
		}},
		{name: "another key alone passes through", steps: []step{
			{at: 2000, give: ds(win("b", 1)), admitted: true, wantCalls: 3},
			{at: 3000, give: ds(win("b", 1)), admitted: true, wantCalls: 4},
		}},
		{name: "a decision with the cached key and an unknown one goes once, then locally", steps: []step{
			{at: 2000, give: ds(win("b", 1), win("a", 1)), wantCalls: 3},
			{at: 3000, give: ds(win("b", 1), win("a", 1)), wantCalls: 3},
			{at: 3000, give: ds(win("a", 1), win("b", 1)), wantCalls: 3},
			{at: 4000, give: ds(win("b", 1)), admitted: true, wantCalls: 4},
			{at: 5000, give: ds(win("b", 1), win("a", 1)), wantCalls: 5},
		}},
		{name: "another limit on the same key passes through", steps: []step{
			{at: 2000, give: ds(func() limit.Charge { c := win("a", 1); c.Amount = 5; return c }()), admitted: true, wantCalls: 3},
		}},
		{name: "a shadow charge on the key passes through", steps: []step{
			{at: 2000, give: ds(func() limit.Charge { c := win("a", 1); c.Shadow = true; return c }()), admitted: true, wantCalls: 3},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := &counting{inner: memstore.New()}
			s := overlimit.New(in, overlimit.Options{})
			clock := storetest.NewFakeClock(t0)
			local := int64(0)
			for i, st := range append(append([]step{}, fill...), tt.steps...) {
				clock.Set(t0.Add(time.Duration(st.at) * time.Millisecond))
				before := in.calls.Load()
				res := make([]limit.Result, len(st.give))
				ok, err := s.Apply(context.Background(), clock.Now(), st.give, res)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if ok != st.admitted {
					t.Errorf("step %d at %dms: admitted = %v, want %v (%+v)", i, st.at, ok, st.admitted, res)
				}
				if got := in.calls.Load(); got != st.wantCalls {
					t.Errorf("step %d at %dms: inner calls = %d, want %d", i, st.at, got, st.wantCalls)
				}
				if in.calls.Load() == before {
					local++
				}
			}
			if got := int64(s.LocalDenials()); got != local {
				t.Errorf("LocalDenials = %d, want %d", got, local)
			}
		})
	}
}

// TestLocalResult: a local denial reports what the store would have.
func TestLocalResult(t *testing.T) {
	t.Parallel()
	in := &counting{inner: memstore.New()}
	s := overlimit.New(in, overlimit.Options{})
	twin := memstore.New()
	ctx := context.Background()
	apply := func(st limit.Store, at int64, cs ...limit.Charge) (bool, []limit.Result) {
		res := make([]limit.Result, len(cs))
		ok, err := st.Apply(ctx, t0.Add(time.Duration(at)*time.Millisecond), cs, res)
		if err != nil {
			t.Fatal(err)
		}
		return ok, res
	}
	for _, at := range []int64{0, 1000} {
		apply(s, at, win("a", 2), win("b", 1))
		apply(twin, at, win("a", 2), win("b", 1))
	}
	calls := in.calls.Load()
	for _, at := range []int64{1000, 1500, 9999} {
		_, got := apply(s, at, win("a", 2), win("b", 1))
		_, want := apply(twin, at, win("a", 2), win("b", 1))
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("at %dms charge %d: got %+v, want %+v", at, i, got[i], want[i])
			}
		}
	}
	if in.calls.Load() != calls {
		t.Errorf("inner calls = %d, want %d", in.calls.Load(), calls)
	}
}

// TestBounded: the cache never holds more than MaxEntries keys.
func TestBounded(t *testing.T) {
	t.Parallel()
	s := overlimit.New(memstore.New(), overlimit.Options{MaxEntries: 128})
	ctx := context.Background()
	for i := range 2000 {
		fill := win("bounded-"+strconv.Itoa(i), 2)
		res := make([]limit.Result, 1)
		if ok, err := s.Apply(ctx, t0, []limit.Charge{fill}, res); err != nil || !ok {
			t.Fatalf("key %d: fill admitted %v err %v", i, ok, err)
		}
		one := fill
		one.Cost = 1
		if ok, err := s.Apply(ctx, t0, []limit.Charge{one}, res); err != nil || ok {
			t.Fatalf("key %d: admitted %v err %v", i, ok, err)
		}
	}
	if n := s.Len(); n > 128 || n == 0 {
		t.Fatalf("Len = %d, want 1..128", n)
	}
}

// TestNeverAdmitsMore: over random schedules the decorated store admits a
// subset of what a bare twin fed the same schedule admits, and with a
// single writer exactly the same decisions and results.
func TestNeverAdmitsMore(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 5))
		s := overlimit.New(memstore.New(), overlimit.Options{MaxEntries: 64})
		bare := memstore.New()
		ctx := context.Background()
		algs := []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket}
		protos := make([]limit.Charge, 4)
		for i := range protos {
			a := algs[r.IntN(len(algs))]
			protos[i] = limit.Charge{
				Key:       limit.Key(limit.Requests, a, time.Minute, "prop", []limit.Entry{{Key: "k", Value: string(rune('a' + i))}}),
				Algorithm: a, Amount: uint64(1 + r.IntN(8)), Window: time.Duration(1+r.IntN(60)) * time.Second,
				Buckets: uint16(r.IntN(7)),
			}
		}
		now := int64(0)
		var local int
		for step := range 3000 {
			now += int64(r.IntN(400))
			var cs []limit.Charge
			for _, i := range r.Perm(len(protos))[:1+r.IntN(2)] {
				c := protos[i]
				switch x := r.IntN(20); {
				case x == 0:
					c.Cost = -int64(1 + r.IntN(3))
				case x == 1:
					c.Cost, c.Force = 2, true
				case x == 2:
					c.Shadow, c.Cost = true, 1
				case x == 3:
					c.Cost = 0
				default:
					c.Cost = int64(1 + r.IntN(3))
				}
				cs = append(cs, c)
			}
			at := t0.Add(time.Duration(now) * time.Millisecond)
			got, want := make([]limit.Result, len(cs)), make([]limit.Result, len(cs))
			before := s.LocalDenials()
			okGot, err1 := s.Apply(ctx, at, cs, got)
			okWant, err2 := bare.Apply(ctx, at, cs, want)
			if err1 != nil || err2 != nil {
				t.Fatalf("seed %d step %d: %v %v", seed, step, err1, err2)
			}
			if okGot && !okWant {
				t.Fatalf("seed %d step %d: decorated store admitted %+v, bare store did not", seed, step, cs)
			}
			if s.LocalDenials() != before {
				local++
			}
			// One writer: the decorator must also agree exactly.
			if okGot != okWant {
				t.Fatalf("seed %d step %d: admitted %v, bare %v", seed, step, okGot, okWant)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("seed %d step %d charge %d %+v: got %+v, bare %+v", seed, step, i, cs[i], got[i], want[i])
				}
			}
		}
		if local == 0 {
			t.Errorf("seed %d: no local denial in the schedule", seed)
		}
	}
}

// TestFairNeverCached: denials on a fair-shared limit are not answered
// here. Member a takes the whole limit, b is denied (so b waits);
// when the limit refills, a is gated at half while b waits. a's gated
// denial must not answer b's request (the counter key is the same for
// both), and every decision reaches the store so the gate sees it.
func TestFairNeverCached(t *testing.T) {
	t.Parallel()
	inner := &counting{inner: memstore.New()}
	s := overlimit.New(inner, overlimit.Options{})
	p := &limit.FairPolicy{Backlog: 2 * time.Minute, Quantum: 1, Credit: 10}
	shared := limit.Charge{Key: key("shared"), Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Minute, Buckets: 6, Cost: 1}
	member := func(m string) limit.Charge {
		c := shared
		c.Fair = limit.FairCharge{Policy: p, Member: limit.FairMember(m), Weight: 1}
		return c
	}
	ask := func(at int64, c limit.Charge) bool {
		t.Helper()
		ok, err := s.Apply(context.Background(), t0.Add(time.Duration(at)*time.Millisecond), []limit.Charge{c}, make([]limit.Result, 1))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	steps := []struct {
		name   string
		at     int64
		member string
		n      int
		want   int // admitted of n
	}{
		{name: "a fills the limit", at: 0, member: "a", n: 10, want: 10},
		{name: "a denied by the counter, again and again", at: 1, member: "a", n: 5, want: 0},
		// The gate holds for b no more than b asked lately (20, decayed
		// with Backlog to 10.9 at 73s), so b asks for more than it is owed.
		{name: "b denied by the counter: b waits", at: 2, member: "b", n: 20, want: 0},
		{name: "a gated at half once the limit refills", at: 73_000, member: "a", n: 6, want: 5},
		{name: "b not answered by a's gated denial", at: 73_000, member: "b", n: 5, want: 5},
	}
	calls := int64(0)
	for _, st := range steps {
		got := 0
		for range st.n {
			if ask(st.at, member(st.member)) {
				got++
			}
		}
		calls += int64(st.n)
		if got != st.want {
			t.Errorf("%s: admitted %d of %d, want %d", st.name, got, st.n, st.want)
		}
		if c := inner.calls.Load(); c != calls {
			t.Errorf("%s: %d store calls so far, want %d (every decision)", st.name, c, calls)
		}
	}
	if n := s.LocalDenials(); n != 0 {
		t.Errorf("%d local denials on a fair-shared limit", n)
	}
}
