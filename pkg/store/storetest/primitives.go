package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// decision is one Apply of a decisionCase. Each charge's Key names a
// counter of the case, which env.charge turns into a key of its own.
type decision struct {
	at     int64 // ms after base
	give   []limit.Charge
	wantOK bool
	want   []limit.Result
}

type decisionCase struct {
	name  string
	steps []decision
}

// runDecisions runs each case's decisions on fresh keys and checks every
// answer exactly.
func runDecisions(t *testing.T, newStore func(testing.TB) limit.Store, cases []decisionCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			for i, d := range tc.steps {
				if len(d.want) != len(d.give) {
					t.Fatalf("step %d: %d results wanted for %d charges", i, len(d.want), len(d.give))
				}
				e.at(d.at)
				cs := make([]limit.Charge, len(d.give))
				for j, c := range d.give {
					cs[j] = e.charge(c.Key, c)
				}
				ok, rs := e.apply(cs...)
				if ok != d.wantOK {
					t.Errorf("step %d (at %dms): admitted = %v, want %v", i, d.at, ok, d.wantOK)
				}
				for j := range rs {
					checkResult(t, fmt.Sprintf("step %d (at %dms) charge %d (%v %s cost %d)", i, d.at, j, cs[j].Algorithm, d.give[j].Key, cs[j].Cost), rs[j], d.want[j])
				}
			}
		})
	}
}

func named(c limit.Charge, name string) limit.Charge { c.Key = name; return c }

func force(c limit.Charge) limit.Charge { c.Force = true; return c }

// refundAt is a refund of n (> 0) charged at atMs after base.
func refundAt(c limit.Charge, n, atMs int64) limit.Charge {
	c.Cost, c.At = -n, base.UnixMilli()+atMs
	return c
}

func take(c limit.Charge, member string) limit.Charge {
	c.Cost, c.Member = 1, member
	return c
}

func release(c limit.Charge, member string) limit.Charge {
	c.Cost, c.Member = -1, member
	return c
}

func ds(charges ...limit.Charge) []limit.Charge { return charges }
func rs(results ...limit.Result) []limit.Result { return results }

// The targeted refund cases use the sliding window of slidingCases: w =
// 10s, M = 6, so bucket i is [10i, 10i+10)s after base and leaves the
// count at 10(i+7)s.
var targetedRefundCases = func() []decisionCase {
	k := named(sliding, "k")
	f := named(fixed, "f")
	tb := named(withBurst(token, 5), "t")
	// Three buckets: 3 in bucket 0, 4 in bucket 1, 2 in bucket 2.
	fill := []decision{
		{at: 0, give: ds(cost(k, 3)), wantOK: true, want: rs(res(true, 7, 70000, 0))},
		{at: 10000, give: ds(cost(k, 4)), wantOK: true, want: rs(res(true, 3, 70000, 0))},
		{at: 20000, give: ds(cost(k, 2)), wantOK: true, want: rs(res(true, 1, 70000, 0))},
	}
	then := func(more ...decision) []decision { return append(append([]decision(nil), fill...), more...) }
	return []decisionCase{
		{name: "drains the bucket of At first", steps: then(
			// Newest first would leave buckets 0 and 1 and reset at 55s.
			decision{at: 25000, give: ds(refundAt(k, 3, 0)), wantOK: true, want: rs(res(true, 4, 65000, 0))},
			decision{at: 25000, give: ds(refundAt(k, 3, 15000)), wantOK: true, want: rs(res(true, 7, 65000, 0))},
			// Bucket 0 has left: buckets 1 (1 left) and 2 (2) count.
			decision{at: 70000, give: ds(cost(k, 0)), wantOK: true, want: rs(res(true, 7, 20000, 0))},
		)},
		{name: "takes the rest from the newest", steps: then(
			decision{at: 25000, give: ds(refundAt(k, 5, 5000)), wantOK: true, want: rs(res(true, 6, 55000, 0))},
			// Newest first would have left 1 in bucket 1 and 3 in bucket 0.
			decision{at: 70000, give: ds(cost(k, 0)), wantOK: true, want: rs(res(true, 6, 10000, 0))},
		)},
		{name: "an empty bucket of At is passed over", steps: then(
			decision{at: 25000, give: ds(refundAt(k, 3, 9999)), wantOK: true, want: rs(res(true, 4, 65000, 0))},
			decision{at: 25000, give: ds(refundAt(k, 4, 0)), wantOK: true, want: rs(res(true, 8, 55000, 0))},
		)},
		{name: "At outside the counted buckets falls back to newest first", steps: []decision{
			{at: 0, give: ds(cost(k, 3)), wantOK: true, want: rs(res(true, 7, 70000, 0))},
			{at: 10000, give: ds(cost(k, 4)), wantOK: true, want: rs(res(true, 3, 70000, 0))},
			{at: 65000, give: ds(cost(k, 2)), wantOK: true, want: rs(res(true, 1, 65000, 0))},
			// Bucket 0 no longer counts at 70s: buckets 6, then 1.
			{at: 70000, give: ds(refundAt(k, 3, 5000)), wantOK: true, want: rs(res(true, 7, 10000, 0))},
			// A bucket ahead of cur is not counted either.
			{at: 70000, give: ds(refundAt(k, 2, 500000)), wantOK: true, want: rs(res(true, 9, 10000, 0))},
		}},
		{name: "a fixed window ignores At", steps: []decision{
			{at: 0, give: ds(cost(f, 3)), wantOK: true, want: rs(res(true, 0, 60000, 0))},
			{at: 1000, give: ds(refundAt(f, 1, -60000)), wantOK: true, want: rs(res(true, 1, 59000, 0))},
		}},
		{name: "a token bucket ignores At", steps: []decision{
			{at: 0, give: ds(cost(tb, 5)), wantOK: true, want: rs(res(true, 0, 500000, 0))},
			{at: 0, give: ds(refundAt(tb, 2, -5000)), wantOK: true, want: rs(res(true, 2, 300000, 0))},
		}},
	}
}()

// The concurrency cases hold at most 2 leases of 10s.
var conc = limit.Charge{Algorithm: limit.Concurrency, Amount: 2, Window: 10 * time.Second}

var concurrencyCases = func() []decisionCase {
	c := named(conc, "c")
	one := named(withAmount(conc, 1), "c1")
	never := named(withAmount(sliding, 0), "never")
	denied := res(false, 0, 0, 0) // never's result
	return []decisionCase{
		{name: "acquires up to Amount then denies", steps: []decision{
			{at: 0, give: ds(take(c, "a")), wantOK: true, want: rs(res(true, 1, 10000, 0))},
			{at: 1000, give: ds(take(c, "b")), wantOK: true, want: rs(res(true, 0, 9000, 0))},
			{at: 2000, give: ds(take(c, "c")), wantOK: false, want: rs(res(false, 0, 8000, 8000))},
			{at: 2000, give: ds(cost(c, 0)), wantOK: false, want: rs(res(false, 0, 8000, 8000))},
		}},
		{name: "a holder renews past the cap", steps: []decision{
			{at: 0, give: ds(take(c, "a")), wantOK: true, want: rs(res(true, 1, 10000, 0))},
			{at: 1000, give: ds(take(c, "b")), wantOK: true, want: rs(res(true, 0, 9000, 0))},
			{at: 5000, give: ds(take(c, "a")), wantOK: true, want: rs(res(true, 0, 6000, 0))},
			// a now lasts until 15s, b until 11s.
			{at: 10000, give: ds(take(c, "c")), wantOK: false, want: rs(res(false, 0, 1000, 1000))},
			{at: 11000, give: ds(take(c, "c")), wantOK: true, want: rs(res(true, 0, 4000, 0))},
		}},
		{name: "a release frees a slot", steps: []decision{
			{at: 0, give: ds(take(c, "a")), wantOK: true, want: rs(res(true, 1, 10000, 0))},
			{at: 1000, give: ds(take(c, "b")), wantOK: true, want: rs(res(true, 0, 9000, 0))},
			{at: 2000, give: ds(release(c, "a")), wantOK: true, want: rs(res(true, 1, 9000, 0))},
			{at: 2000, give: ds(take(c, "c")), wantOK: true, want: rs(res(true, 0, 9000, 0))},
			{at: 2000, give: ds(release(c, "z")), wantOK: true, want: rs(res(true, 0, 9000, 0))},
			{at: 3000, give: ds(release(c, "b"), release(c, "c")), wantOK: true, want: rs(res(true, 2, 0, 0), res(true, 2, 0, 0))},
		}},
		{name: "leases expire after the window", steps: []decision{
			{at: 0, give: ds(take(c, "a"), take(c, "b")), wantOK: true, want: rs(res(true, 0, 10000, 0), res(true, 0, 10000, 0))},
			{at: 9999, give: ds(take(c, "c")), wantOK: false, want: rs(res(false, 0, 1, 1))},
			{at: 10000, give: ds(take(c, "c")), wantOK: true, want: rs(res(true, 1, 10000, 0))},
			{at: 10000, give: ds(cost(c, 0)), wantOK: true, want: rs(res(true, 1, 10000, 0))},
		}},
		{name: "a release on a fresh counter", steps: []decision{
			{at: 0, give: ds(release(c, "a")), wantOK: true, want: rs(res(true, 2, 0, 0))},
		}},
		{name: "amount zero admits nothing", steps: []decision{
			{at: 0, give: ds(take(named(withAmount(conc, 0), "z"), "a")), wantOK: false, want: rs(res(false, 0, 0, 0))},
			{at: 0, give: ds(cost(named(withAmount(conc, 0), "z"), 0)), wantOK: false, want: rs(res(false, 0, 0, 0))},
		}},
		{name: "a denied decision keeps no acquisition", steps: []decision{
			{at: 0, give: ds(take(c, "a"), cost(never, 1)), wantOK: false, want: rs(res(true, 2, 0, 0), denied)},
			{at: 0, give: ds(cost(c, 0)), wantOK: true, want: rs(res(true, 2, 0, 0))},
			// Nor a renewal: a keeps its first deadline.
			{at: 0, give: ds(take(c, "a")), wantOK: true, want: rs(res(true, 1, 10000, 0))},
			{at: 5000, give: ds(take(c, "a"), cost(never, 1)), wantOK: false, want: rs(res(true, 1, 5000, 0), denied)},
		}},
		{name: "releases apply in a denied decision", steps: []decision{
			{at: 0, give: ds(take(c, "a"), take(c, "b")), wantOK: true, want: rs(res(true, 0, 10000, 0), res(true, 0, 10000, 0))},
			{at: 1000, give: ds(release(c, "a"), take(c, "c"), cost(never, 1)), wantOK: false, want: rs(res(true, 1, 9000, 0), res(true, 1, 9000, 0), denied)},
			{at: 1000, give: ds(take(c, "c")), wantOK: true, want: rs(res(true, 0, 9000, 0))},
		}},
		{name: "a Force acquisition takes a lease past the cap", steps: []decision{
			{at: 0, give: ds(take(one, "a")), wantOK: true, want: rs(res(true, 0, 10000, 0))},
			{at: 1000, give: ds(force(take(one, "b"))), wantOK: true, want: rs(res(false, 0, 9000, 9000))},
			// a has gone, b holds until 11s.
			{at: 10000, give: ds(cost(one, 0)), wantOK: false, want: rs(res(false, 0, 1000, 1000))},
			// A denied decision keeps it too.
			{at: 11000, give: ds(force(take(one, "c")), cost(never, 1)), wantOK: false, want: rs(res(true, 0, 10000, 0), denied)},
		}},
		{name: "a Shadow acquisition past the cap is not kept", steps: []decision{
			{at: 0, give: ds(take(one, "a")), wantOK: true, want: rs(res(true, 0, 10000, 0))},
			{at: 0, give: ds(shadow(take(one, "b"))), wantOK: true, want: rs(res(false, 0, 10000, 10000))},
			{at: 0, give: ds(release(one, "a")), wantOK: true, want: rs(res(true, 1, 0, 0))},
		}},
	}
}()

// The Once cases keep a mark for a minute.
var once = limit.Charge{Algorithm: limit.Once, Window: time.Minute}

var onceCases = func() []decisionCase {
	o := named(once, "o")
	p := named(once, "p")
	k := named(sliding, "k")
	kf := named(sliding, "kf")
	g := named(sliding, "g")
	never := named(withAmount(sliding, 0), "never")
	marked, void := res(true, 0, 0, 0), res(false, 0, 0, 0)
	// A reconciliation: a refund and a usage report behind a mark.
	report := ds(cost(k, -2), force(cost(kf, 3)), cost(o, 1))
	return []decisionCase{
		{name: "a mark fits once per window", steps: []decision{
			{at: 0, give: ds(cost(o, 1)), wantOK: true, want: rs(marked)},
			{at: 1000, give: ds(cost(o, 1)), wantOK: false, want: rs(void)},
			// A check on a live mark voids too.
			{at: 59999, give: ds(cost(o, 0)), wantOK: false, want: rs(void)},
			{at: 60000, give: ds(cost(o, 0)), wantOK: true, want: rs(marked)},
			{at: 60000, give: ds(cost(o, 1)), wantOK: true, want: rs(marked)},
			{at: 60000, give: ds(cost(o, 1)), wantOK: false, want: rs(void)},
		}},
		{name: "a second delivery voids the refund and Force charge", steps: []decision{
			{at: 0, give: ds(cost(k, 5)), wantOK: true, want: rs(res(true, 5, 70000, 0))},
			{at: 1000, give: report, wantOK: true, want: rs(res(true, 7, 69000, 0), res(true, 7, 69000, 0), marked)},
			// Both would have fit: the results say so, and nothing is kept.
			{at: 2000, give: report, wantOK: false, want: rs(res(true, 7, 68000, 0), res(true, 7, 68000, 0), void)},
			{at: 2000, give: ds(cost(k, 0), cost(kf, 0)), wantOK: true, want: rs(res(true, 7, 68000, 0), res(true, 7, 68000, 0))},
			// The mark has gone a minute after it was set.
			{at: 61000, give: report, wantOK: true, want: rs(res(true, 9, 9000, 0), res(true, 4, 69000, 0), marked)},
		}},
		{name: "a void decision moves no high-water mark", steps: []decision{
			{at: 0, give: ds(cost(o, 1)), wantOK: true, want: rs(marked)},
			{at: 30000, give: ds(cost(g, 1), cost(o, 1)), wantOK: false, want: rs(res(true, 10, 0, 0), void)},
			// Bucket 2 still counts as bucket 2, not as the void's bucket 3.
			{at: 20000, give: ds(cost(g, 1)), wantOK: true, want: rs(res(true, 9, 70000, 0))},
		}},
		{name: "a mark that fits is kept in a denied decision", steps: []decision{
			{at: 0, give: ds(cost(k, 5)), wantOK: true, want: rs(res(true, 5, 70000, 0))},
			{at: 1000, give: ds(cost(o, 1), cost(k, -1), cost(never, 1)), wantOK: false, want: rs(marked, res(true, 6, 69000, 0), res(false, 0, 0, 0))},
			{at: 2000, give: ds(cost(o, 1), cost(k, -1)), wantOK: false, want: rs(void, res(true, 6, 68000, 0))},
			{at: 2000, give: ds(cost(k, 0)), wantOK: true, want: rs(res(true, 6, 68000, 0))},
		}},
		{name: "a negative cost removes the mark, except in a void", steps: []decision{
			{at: 0, give: ds(cost(o, 1)), wantOK: true, want: rs(marked)},
			{at: 1000, give: ds(cost(o, -1)), wantOK: true, want: rs(marked)},
			{at: 1000, give: ds(cost(o, 1), cost(p, 1)), wantOK: true, want: rs(marked, marked)},
			{at: 2000, give: ds(cost(o, -1), cost(p, 1)), wantOK: false, want: rs(marked, void)},
			{at: 2000, give: ds(cost(o, 1)), wantOK: false, want: rs(void)},
		}},
		{name: "a mark sees the one before it in the decision", steps: []decision{
			{at: 0, give: ds(cost(o, 1), cost(o, 1)), wantOK: false, want: rs(marked, void)},
			{at: 0, give: ds(cost(o, 1)), wantOK: true, want: rs(marked)},
		}},
		{name: "Shadow and Force do not stop a void", steps: []decision{
			{at: 0, give: ds(cost(o, 1)), wantOK: true, want: rs(marked)},
			{at: 0, give: ds(shadow(cost(o, 1)), cost(k, 1)), wantOK: false, want: rs(void, res(true, 10, 0, 0))},
			{at: 0, give: ds(force(cost(o, 1)), cost(k, 1)), wantOK: false, want: rs(void, res(true, 10, 0, 0))},
		}},
	}
}()
