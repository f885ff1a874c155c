package redisstore

import (
	"context"
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
// ch fits, whether the gate alone denied it, and whether the decision is
// admitted.
func (r *fairRef) apply(ch *limit.Charge, now int64, elsewhere bool) (fits, gated, admitted bool) {
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
		fits, _ = work.Step(ch, now)
	} else {
		work.Touch(ch, now)
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
	r.state.Record(p, now, f.Member, f.Weight, ch.Cost, out)
	return fits, gated, admitted
}

// readFair decodes the hash apply.lua keeps at key.
func readFair(tb testing.TB, c redis.UniversalClient, key string) limit.FairState {
	tb.Helper()
	h, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		tb.Fatalf("HGETALL %s: %v", key, err)
	}
	var st limit.FairState
	for field, v := range h {
		if field == "clock" {
			st.Clock = parseFloat(tb, v)
			continue
		}
		x := strings.Split(v, " ")
		if len(x) != 8 {
			tb.Fatalf("field %q = %q: want 8 values", field, v)
		}
		st.Keys = append(st.Keys, limit.FairKey{
			Key: field, Weight: parseFloat(tb, x[0]), Finish: parseFloat(tb, x[1]),
			Asked: parseInt(tb, x[2]), Denied: parseInt(tb, x[3]), Admitted: parseInt(tb, x[4]),
			Asks: parseFloat(tb, x[5]), Admits: parseFloat(tb, x[6]), Aged: parseInt(tb, x[7]),
		})
	}
	slices.SortFunc(st.Keys, func(a, b limit.FairKey) int { return strings.Compare(a.Key, b.Key) })
	return st
}

func parseFloat(tb testing.TB, s string) float64 {
	tb.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		tb.Fatalf("parse %q: %v", s, err)
	}
	return f
}

func parseInt(tb testing.TB, s string) int64 {
	tb.Helper()
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		tb.Fatalf("parse %q: %v", s, err)
	}
	return i
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
		fits, g, wantAdmitted := ref.apply(&ch, now, elsewhere)
		if g {
			gated++
		}
		if res[0].Fits != fits || admitted != wantAdmitted {
			t.Fatalf("step %d (%+v, elsewhere %v): fits %v admitted %v, want %v %v", step, ch.Fair, elsewhere, res[0].Fits, admitted, fits, wantAdmitted)
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
