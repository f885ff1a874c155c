package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fairRef is the Go side of the differential test: the shared counter as
// limit.Counter keeps it and the fair state as limit.FairState keeps it,
// stepped as the Store contract says.
type fairRef struct {
	counter limit.Counter
	state   limit.FairState
}

// apply runs one decision on the reference: the fair charge ch, and, when
// elsewhere is set, a second charge that never fits. It returns whether
// ch fits and its RetryAfter (ms), whether the gate alone denied it, and
// whether the decision is admitted. A refund neither asks the gate nor is
// recorded.
func (r *fairRef) apply(ch *limit.Charge, now int64, elsewhere bool) (fits bool, retry int64, gated, admitted bool) {
	p, f := ch.Fair.Policy, &ch.Fair
	work := r.counter
	work.Buckets = slices.Clone(r.counter.Buckets)
	fits = true
	if ch.Cost >= 0 {
		room, _ := r.counter.Report(ch, now)
		fits = r.state.Gate(p, now, f.Member, f.Weight, ch.Cost, int64(room))
		gated = !fits
	}
	if fits {
		fits, retry = work.Step(ch, now)
	} else {
		work.Touch(ch, now)
		// When room frees next: the end of the bucket, or one token.
		retry = limit.BucketEnd(ch, now) - now
		if ch.Algorithm == limit.TokenBucket {
			retry = max(int64(min(math.Ceil(limit.EmissionMillis(ch)), float64(limit.MaxWindow/time.Millisecond))), 1)
		}
	}
	admitted = fits && !elsewhere
	if admitted || ch.Cost < 0 {
		r.counter = work
	} else {
		r.counter.Touch(ch, now)
	}
	out := limit.FairElsewhere
	switch {
	case !fits:
		out = limit.FairDenied
	case admitted:
		out = limit.FairAdmitted
	}
	if ch.Cost >= 0 {
		r.state.Record(p, now, f.Member, f.Weight, ch.Cost, out)
	}
	return fits, retry, gated, admitted
}

// readFair decodes the string apply.lua keeps at key: the clock, then
// each key's record, ten little-endian doubles: the member's first and
// last 8 hex digits as numbers (-1 and 0 for ""), then the FairKey's
// fields, in key order.
func readFair(tb testing.TB, c redis.UniversalClient, key string) limit.FairState {
	tb.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return limit.FairState{} // no decision recorded yet
	}
	if err != nil {
		tb.Fatalf("GET %s: %v", key, err)
	}
	const rec = 10 * 8
	if len(v) < 8 || (len(v)-8)%rec != 0 {
		tb.Fatalf("state is %d bytes: want 8 + %d per key", len(v), rec)
	}
	double := func(b string) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(b))) }
	st := limit.FairState{Clock: double(v)}
	for r := v[8:]; r != ""; r = r[rec:] {
		var x [10]float64
		for i := range x {
			x[i] = double(r[8*i:])
		}
		member := limit.FairOverflowKey
		if hi, lo := exactInt(tb, x[0]), exactInt(tb, x[1]); hi != -1 || lo != 0 {
			if hi < 0 || hi > math.MaxUint32 || lo < 0 || lo > math.MaxUint32 {
				tb.Fatalf("member %v %v out of range", hi, lo)
			}
			member = fmt.Sprintf("%08x%08x", hi, lo)
		}
		st.Keys = append(st.Keys, limit.FairKey{
			Key: member, Weight: x[2], Finish: x[3], Asked: exactInt(tb, x[4]), Denied: exactInt(tb, x[5]),
			Admitted: exactInt(tb, x[6]), Asks: x[7], Admits: x[8], Aged: exactInt(tb, x[9]),
		})
	}
	if !slices.IsSortedFunc(st.Keys, func(a, b limit.FairKey) int { return strings.Compare(a.Key, b.Key) }) {
		tb.Fatalf("state keys out of order: %+v", st.Keys)
	}
	return st
}

// exactInt is a time the script keeps as a double, which must be a whole
// number of ms.
func exactInt(tb testing.TB, x float64) int64 {
	tb.Helper()
	if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
		tb.Fatalf("%v is not an exact integer", x)
	}
	return int64(x)
}

// fairDiff is the first difference between two states, bit for bit ("":
// none). == would take -0 for +0.
func fairDiff(got, want *limit.FairState) string {
	bits := math.Float64bits
	if bits(got.Clock) != bits(want.Clock) {
		return fmt.Sprintf("Clock = %v, want %v", got.Clock, want.Clock)
	}
	if len(got.Keys) != len(want.Keys) {
		return fmt.Sprintf("%d keys, want %d: %+v, want %+v", len(got.Keys), len(want.Keys), got.Keys, want.Keys)
	}
	for i := range got.Keys {
		g, w := &got.Keys[i], &want.Keys[i]
		if g.Key != w.Key || bits(g.Weight) != bits(w.Weight) || bits(g.Finish) != bits(w.Finish) ||
			g.Asked != w.Asked || g.Denied != w.Denied || g.Admitted != w.Admitted ||
			bits(g.Asks) != bits(w.Asks) || bits(g.Admits) != bits(w.Admits) || g.Aged != w.Aged {
			return fmt.Sprintf("Keys[%d] = %+v, want %+v", i, *g, *w)
		}
	}
	return ""
}

// fairSeq counts the differential sequences, so every one has its own
// keys on a shared server.
var fairSeq atomic.Int64

// runFairDiff applies random decisions on one fair-shared counter through
// s and through fairRef, and requires the same Fits and verdict and a
// bit-identical state after every decision. otherSlot puts the charge
// that denies elsewhere on another hash tag: on a cluster, that decision
// is tried per slot and the fair slot's record taken back.
func runFairDiff(t *testing.T, s *Store, alg limit.Algorithm, seed uint64, otherSlot bool) (gated int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 16))
	n := fairSeq.Add(1)
	p := &limit.FairPolicy{
		MinShare: []float64{0, 0.1, 0.3}[rng.IntN(3)],
		// Backlogs of seconds: the state's TTL runs on the server's
		// clock while the test's clock jumps.
		Backlog: []time.Duration{3 * time.Second, 10 * time.Second}[rng.IntN(2)],
		Quantum: []float64{0, 1, 3}[rng.IntN(3)],
		Credit:  []float64{0, 4, 20}[rng.IntN(3)],
		MaxKeys: []int{0, 3}[rng.IntN(2)],
	}
	ch := limit.Charge{
		Key: fmt.Sprintf("{fairdiff-%d}:shared", n), Algorithm: alg, Amount: 10, Window: time.Second,
		Buckets: 4, Fair: limit.FairCharge{Policy: p},
	}
	if alg == limit.TokenBucket {
		ch.Burst = 5
	}
	other := limit.Charge{
		Key: fmt.Sprintf("{fairdiff-%d}:other", n), Algorithm: limit.FixedWindow, Amount: 1, Window: time.Second, Cost: 2,
	}
	if otherSlot {
		other.Key = fmt.Sprintf("{fairdiff-%d-x}:other", n)
	}
	members := []string{limit.FairOverflowKey}
	for i := range 5 {
		members = append(members, limit.FairMember(fmt.Sprintf("tenant-%d-%d", n, i)))
	}
	weights := []float64{1, 1, 2, 4, 0.5, 3, math.NaN(), 0, -5, math.Inf(1), math.Inf(-1), 1e9, 1e-12, 0.1}
	costs := []int64{1, 1, 1, 2, 3, 5, 0, -1, 11, math.MaxInt64}
	now := int64(1_700_000_000_000) + rng.Int64N(1000)
	var ref fairRef
	for step := range 200 {
		switch r := rng.IntN(100); {
		case r < 2:
			now += 3_600_000
		case r < 6:
			now += 4000 + rng.Int64N(8000)
		default:
			now += rng.Int64N(150)
		}
		m := rng.IntN(len(members))
		ch.Fair.Member = members[m]
		// A member keeps its weight mostly, as a tenant's plan does.
		ch.Fair.Weight = weights[m%4]
		if rng.IntN(5) == 0 {
			ch.Fair.Weight = weights[rng.IntN(len(weights))]
		}
		ch.Cost = costs[rng.IntN(len(costs))]
		elsewhere := rng.IntN(8) == 0
		decision := []limit.Charge{ch}
		if elsewhere {
			decision = append(decision, other)
		}
		res := make([]limit.Result, len(decision))
		admitted, err := s.Apply(context.Background(), time.UnixMilli(now), decision, res)
		if err != nil {
			t.Fatalf("step %d: Apply: %v", step, err)
		}
		fits, retry, g, wantAdmitted := ref.apply(&ch, now, elsewhere)
		if g {
			gated++
		}
		if res[0].Fits != fits || admitted != wantAdmitted || res[0].RetryAfter != limit.Millis(retry) {
			t.Fatalf("step %d (%+v, cost %d, elsewhere %v, gated %v): fits %v admitted %v retry %v, want %v %v %v",
				step, ch.Fair, ch.Cost, elsewhere, g, res[0].Fits, admitted, res[0].RetryAfter, fits, wantAdmitted, limit.Millis(retry))
		}
		if rem, _ := ref.counter.Report(&ch, now); res[0].Remaining != rem {
			t.Fatalf("step %d: Remaining = %d, want %d", step, res[0].Remaining, rem)
		}
		got := readFair(t, s.c, limit.FairStateKey(ch.Key))
		if d := fairDiff(&got, &ref.state); d != "" {
			t.Fatalf("step %d (member %q weight %v cost %d elsewhere %v, policy %+v): %s", step, ch.Fair.Member, ch.Fair.Weight, ch.Cost, elsewhere, *p, d)
		}
	}
	return gated
}

func TestFairDifferential(t *testing.T) {
	t.Parallel()
	s, _ := newSingle(t)
	gated := 0
	for _, alg := range []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket} {
		for seed := range uint64(6) {
			gated += runFairDiff(t, s, alg, seed, false)
		}
	}
	// The gate must have denied somewhere, or the test compared only the
	// records of an open gate.
	if gated == 0 {
		t.Error("the gate never denied a charge")
	}
	t.Logf("gate denials: %d", gated)
}

// TestFairDifferentialCluster runs the differential on a cluster, with
// the charge that denies elsewhere on another slot: the fair slot is
// tried, records the admission, and its take-back must leave the state a
// denial elsewhere records, to the bit. With the two on one slot the
// decision is one call, as on a single node.
func TestFairDifferentialCluster(t *testing.T) {
	t.Parallel()
	s := newCluster(t)
	for _, otherSlot := range []bool{true, false} {
		for _, alg := range []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket} {
			for seed := range uint64(2) {
				runFairDiff(t, s, alg, 100+seed, otherSlot)
			}
		}
	}
}

// TestFairGate sets up a member far ahead of a waiting one and checks
// the gate's denial on each algorithm: Fits false with the counter's
// room untouched, RetryAfter one bucket width (a token's time for a
// token bucket), the denial recorded, the state's TTL Backlog + Window + ttlMargin.
func TestFairGate(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	ms := time.Millisecond
	p := &limit.FairPolicy{Backlog: 10 * time.Second, Quantum: 1, Credit: 100}
	a, b := limit.FairMember("a"), limit.FairMember("b")
	tests := []struct {
		name      string
		give      limit.Charge
		wantRetry time.Duration
	}{
		{name: "sliding", give: limit.Charge{Algorithm: limit.SlidingWindow, Buckets: 4}, wantRetry: 250 * ms},
		{name: "fixed", give: limit.Charge{Algorithm: limit.FixedWindow}, wantRetry: 1000 * ms},
		{name: "token", give: limit.Charge{Algorithm: limit.TokenBucket}, wantRetry: 100 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := tt.give
			ch.Key, ch.Amount, ch.Window = "{fairgate-"+tt.name+"}:shared", 10, time.Second
			at := func(member string, cost int64) limit.Charge {
				c := ch
				c.Cost, c.Fair = cost, limit.FairCharge{Policy: p, Member: member, Weight: 1}
				return c
			}
			t0 := time.UnixMilli(1_700_000_000_000)
			steps := []struct {
				at     time.Duration
				give   limit.Charge
				wantOK bool
			}{
				{at: 0, give: at(b, 1), wantOK: true},
				{at: 0, give: at(a, 9), wantOK: true},
				// The counter is full: b is denied and waits, owed 9.
				{at: 0, give: at(b, 1), wantOK: false},
			}
			for i, st := range steps {
				if ok, _ := apply(t, s, t0.Add(st.at), st.give); ok != st.wantOK {
					t.Fatalf("step %d: admitted = %v, want %v", i, ok, st.wantOK)
				}
			}
			// The counter has room for a again, but not for a and the 9 b
			// is owed.
			now := t0.Add(2 * time.Second)
			ok, res := apply(t, s, now, at(a, 9))
			want := limit.Result{Fits: false, Remaining: 10, RetryAfter: tt.wantRetry}
			// ResetAfter is the counter's own (a fixed window's end).
			res[0].ResetAfter = 0
			if ok || res[0] != want {
				t.Errorf("a far ahead: admitted %v, %+v; want false, %+v", ok, res[0], want)
			}
			key := limit.FairStateKey(ch.Key)
			got := readFair(t, rc, key)
			if i, ok := slices.BinarySearchFunc(got.Keys, a, func(k limit.FairKey, m string) int { return strings.Compare(k.Key, m) }); !ok || got.Keys[i].Denied != now.UnixMilli() {
				t.Errorf("a's denial is not recorded: %+v", got.Keys)
			}
			ttl, err := rc.PTTL(context.Background(), key).Result()
			// Backlog + Window + ttlMargin, as the other keys.
			if err != nil || ttl <= 11*time.Second || ttl > 12*time.Second {
				t.Errorf("PTTL = %v, %v; want in (11s, 12s]", ttl, err)
			}
			// b asks its share and gets it.
			if ok, res := apply(t, s, now, at(b, 1)); !ok || !res[0].Fits {
				t.Errorf("b: admitted %v, %+v; want admitted", ok, res[0])
			}
		})
	}
}

// TestFairVoid checks that a decision a Once charge voids writes no fair
// state, and that a denial elsewhere does.
func TestFairVoid(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	p := &limit.FairPolicy{Backlog: time.Second}
	fair := limit.Charge{Key: "{fairvoid}:shared", Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Second, Cost: 1,
		Fair: limit.FairCharge{Policy: p, Member: limit.FairMember("t"), Weight: 1}}
	once := limit.Charge{Key: "{fairvoid}:once", Algorithm: limit.Once, Window: time.Minute, Cost: 1}
	deny := limit.Charge{Key: "{fairvoid}:deny", Algorithm: limit.FixedWindow, Amount: 1, Window: time.Second, Cost: 2}
	now := time.UnixMilli(1_700_000_000_000)
	if ok, _ := apply(t, s, now, once); !ok {
		t.Fatal("the first Once mark does not fit")
	}
	if ok, _ := apply(t, s, now, fair, once); ok {
		t.Fatal("a decision with a Once charge already marked is admitted")
	}
	key := limit.FairStateKey(fair.Key)
	if n, err := rc.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		t.Fatalf("after a void decision EXISTS %s = %d, %v; want 0", key, n, err)
	}
	if ok, _ := apply(t, s, now, fair, deny); ok {
		t.Fatal("a decision with a charge over its limit is admitted")
	}
	got := readFair(t, rc, key)
	if len(got.Keys) != 1 || got.Keys[0].Asked != now.UnixMilli() || got.Keys[0].Denied != 0 || got.Keys[0].Asks != 0 {
		t.Errorf("after a denial elsewhere the state is %+v; want the key asked, not denied, no asks", got)
	}
}

// TestFairBadInput checks that what the script could not repeat to the
// bit, or a state key that holds something else, is an error and not a
// crash or a guess.
func TestFairBadInput(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	p := &limit.FairPolicy{Backlog: time.Second}
	base := limit.Charge{Key: "{fairbad}:shared", Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Second, Cost: 1,
		Fair: limit.FairCharge{Policy: p, Member: limit.FairMember("t"), Weight: 1}}
	// Two records of ten doubles, members (5, 0) then (1, 0): out of
	// order, so the script's binary search could not trust it.
	unsorted := binary.LittleEndian.AppendUint64(nil, math.Float64bits(0))
	for _, hi := range []float64{5, 1} {
		for i := range 10 {
			x := 0.0
			if i == 0 {
				x = hi
			}
			unsorted = binary.LittleEndian.AppendUint64(unsorted, math.Float64bits(x))
		}
	}
	ctx := context.Background()
	for key, err := range map[string]error{
		"wrongtype": rc.Set(ctx, limit.FairStateKey("{fairbad}:wrongtype"), "x", 0).Err(),
		"unsorted":  rc.Set(ctx, limit.FairStateKey("{fairbad}:unsorted"), unsorted, 0).Err(),
		"hash":      rc.HSet(ctx, limit.FairStateKey("{fairbad}:hash"), "clock", "x").Err(),
	} {
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
	}
	tests := []struct {
		name string
		give func(*limit.Charge)
		want string
	}{
		{name: "member not hex", give: func(c *limit.Charge) { c.Fair.Member = "Tenant A" }, want: "not a limit.FairMember"},
		{name: "member upper case", give: func(c *limit.Charge) { c.Fair.Member = "ABCDEF0123456789" }, want: "not a limit.FairMember"},
		{name: "min share NaN", give: func(c *limit.Charge) { c.Fair.Policy = &limit.FairPolicy{MinShare: math.NaN()} }, want: "out of range"},
		{name: "min share 1", give: func(c *limit.Charge) { c.Fair.Policy = &limit.FairPolicy{MinShare: 1} }, want: "out of range"},
		{name: "quantum inf", give: func(c *limit.Charge) { c.Fair.Policy = &limit.FairPolicy{Quantum: math.Inf(1)} }, want: "out of range"},
		{name: "credit NaN", give: func(c *limit.Charge) { c.Fair.Policy = &limit.FairPolicy{Credit: math.NaN()} }, want: "out of range"},
		{name: "state of another type", give: func(c *limit.Charge) { c.Key = "{fairbad}:wrongtype" }, want: "does not hold a fair-share state"},
		{name: "state a hash", give: func(c *limit.Charge) { c.Key = "{fairbad}:hash" }, want: "does not hold a fair-share state"},
		{name: "state out of order", give: func(c *limit.Charge) { c.Key = "{fairbad}:unsorted" }, want: "does not hold a fair-share state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := base
			tt.give(&ch)
			_, err := s.Apply(context.Background(), time.UnixMilli(1_700_000_000_000), []limit.Charge{ch}, make([]limit.Result, 1))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Apply: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestFairSlots(t *testing.T) {
	t.Parallel()
	p := &limit.FairPolicy{}
	tests := []struct {
		name    string
		give    []limit.Charge
		wantErr bool
	}{
		{name: "tagged", give: []limit.Charge{{Key: "{t}:k", Fair: limit.FairCharge{Policy: p}}}},
		{name: "untagged, not fair", give: []limit.Charge{{Key: "k"}}},
		{name: "untagged fair", give: []limit.Charge{{Key: "{t}:k"}, {Key: "k", Fair: limit.FairCharge{Policy: p}}}, wantErr: true},
		{name: "empty tag", give: []limit.Charge{{Key: "{}k", Fair: limit.FairCharge{Policy: p}}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := fairSlots(tt.give); (err != nil) != tt.wantErr {
				t.Errorf("fairSlots = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

// BenchmarkFairApply measures what fair share adds to a decision: one
// sliding-window charge without it, and with it on a state of 4, 64 and
// 256 members (every one asked, half of them waiting), the decisions taking
// the members in turn.
func BenchmarkFairApply(b *testing.B) {
	for _, bc := range []struct {
		name    string
		members int // 0: not fair-shared
	}{
		{"plain", 0},
		{"fair4", 4},
		{"fair64", 64},
		{"fair256", 256}, // config's default max_keys
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, admin := newSingle(b)
			ctx := context.Background()
			p := &limit.FairPolicy{Backlog: 10 * time.Minute, Quantum: 1, Credit: 1 << 20}
			ch := limit.Charge{Key: "{fairbench}:shared", Algorithm: limit.SlidingWindow, Amount: 1 << 40, Window: time.Minute, Cost: 1}
			members := make([]string, bc.members)
			now := t0
			res := make([]limit.Result, 1)
			for i := range members {
				members[i] = limit.FairMember(strconv.Itoa(i))
				ch.Fair = limit.FairCharge{Policy: p, Member: members[i], Weight: float64(1 + i%3)}
				ch.Cost = 1
				apply(b, s, now, ch)
				if i%2 == 0 {
					// Denied by the counter: the member waits.
					ch.Cost = 1 << 41
					apply(b, s, now, ch)
				}
			}
			ch.Cost = 1
			if bc.members == 0 {
				apply(b, s, now, ch) // loads the function
			}
			calls, usec := scriptStats(b, admin)
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				now = now.Add(time.Millisecond)
				if bc.members > 0 {
					ch.Fair.Member, ch.Fair.Weight = members[i%len(members)], float64(1+i%3)
				}
				i++
				if _, err := s.Apply(ctx, now, []limit.Charge{ch}, res); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			calls2, usec2 := scriptStats(b, admin)
			if calls2 > calls {
				b.ReportMetric(float64(usec2-usec)/float64(calls2-calls), "redis-µs/op")
			}
		})
	}
}
