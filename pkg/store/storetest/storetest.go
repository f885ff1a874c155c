// Package storetest is the conformance suite every limit.Store passes, and
// a fake clock.
//
// The suite passes time to Apply explicitly (from a FakeClock), so it runs
// unchanged against a Store whose state lives elsewhere, such as Redis. It
// assumes that a Store keeps a counter's state at least until that state
// is equivalent to a fresh counter in the suite's time: a store whose TTLs
// run on a real clock should add a margin (a second is plenty), since a
// test moves its fake time by minutes in a few real microseconds and may
// equally stall for a few real milliseconds between two steps at one
// fake instant.
//
// Beyond store.go's contract, the suite pins the readings documented on
// limit.Counter: the token bucket's At + Debt state and tolerance, the
// windows' high-water mark (moved by checks and denied decisions too), a
// change of bucket width, Results that describe each counter after the
// whole Apply, Force and Shadow acquisitions of leases, and Once marks
// kept in denied decisions and untouched by Shadow and Force. Every expected value in it is exact, and the Model
// subtest compares every answer with limit.Counter's.
package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// base is the suite's time origin: a Unix time that is a whole number of
// days, so every window the suite uses starts on it.
var base = time.UnixMilli(20000 * 86400000)

// Run runs the conformance suite against stores made by newStore. Each
// subtest calls newStore and uses keys unique to the subtest; all keys of
// a subtest share one hash tag. newStore may return the same store each
// time unless the store expires state by the times passed to Apply (as
// memstore does): the subtests' fake clocks are days apart.
func Run(t *testing.T, newStore func(t testing.TB) limit.Store) {
	RunExcept(t, newStore, nil)
}

// RunExcept runs the suite as Run does, less the subtests named in except,
// each mapped to why the store cannot meet it; the reasons are logged. It
// is for a decorator that by design answers some scripts otherwise (a
// lease holds room the store counts as spent); such a decorator must
// test its own bound in their place. A name in except that is not a
// subtest fails, so the list cannot outlive the subtests it names.
func RunExcept(t *testing.T, newStore func(t testing.TB) limit.Store, except map[string]string) {
	known := make(map[string]bool, len(suite))
	for _, st := range suite {
		known[st.name] = true
		if why, ok := except[st.name]; ok {
			t.Logf("%s not run: %s", st.name, why)
			continue
		}
		t.Run(st.name, func(t *testing.T) { t.Parallel(); st.run(t, newStore) })
	}
	for name := range except {
		if !known[name] {
			t.Errorf("RunExcept: no subtest %q to leave out", name)
		}
	}
}

// suite is the conformance subtests, in the order Run runs them.
var suite = []struct {
	name string
	run  func(t *testing.T, newStore func(testing.TB) limit.Store)
}{
	{"SlidingWindow", func(t *testing.T, newStore func(testing.TB) limit.Store) { runScripts(t, newStore, slidingCases) }},
	{"FixedWindow", func(t *testing.T, newStore func(testing.TB) limit.Store) { runScripts(t, newStore, fixedCases) }},
	{"TokenBucket", func(t *testing.T, newStore func(testing.TB) limit.Store) { runScripts(t, newStore, tokenCases) }},
	{"TokenBucketFillsBurstExactly", func(t *testing.T, newStore func(testing.TB) limit.Store) { testBurstExact(t, newStore) }},
	{"TargetedRefund", func(t *testing.T, newStore func(testing.TB) limit.Store) {
		runDecisions(t, newStore, targetedRefundCases)
	}},
	{"Concurrency", func(t *testing.T, newStore func(testing.TB) limit.Store) { runDecisions(t, newStore, concurrencyCases) }},
	{"Once", func(t *testing.T, newStore func(testing.TB) limit.Store) { runDecisions(t, newStore, onceCases) }},
	{"AllOrNothing", func(t *testing.T, newStore func(testing.TB) limit.Store) { testAllOrNothing(t, newStore) }},
	{"Shadow", func(t *testing.T, newStore func(testing.TB) limit.Store) { testShadow(t, newStore) }},
	{"Force", func(t *testing.T, newStore func(testing.TB) limit.Store) { testForce(t, newStore) }},
	{"SameKeyTwice", func(t *testing.T, newStore func(testing.TB) limit.Store) { testSameKeyTwice(t, newStore) }},
	{"Expiry", func(t *testing.T, newStore func(testing.TB) limit.Store) { testExpiry(t, newStore) }},
	{"BucketWidthChange", func(t *testing.T, newStore func(testing.TB) limit.Store) { testWidthChange(t, newStore) }},
	{"ClockBehindHighWater", func(t *testing.T, newStore func(testing.TB) limit.Store) { testClockBack(t, newStore) }},
	{"EmptyApply", func(t *testing.T, newStore func(testing.TB) limit.Store) { testEmpty(t, newStore) }},
	{"Concurrent", func(t *testing.T, newStore func(testing.TB) limit.Store) { testConcurrent(t, newStore) }},
	{"Property", func(t *testing.T, newStore func(testing.TB) limit.Store) { runProperties(t, newStore) }},
	{"Model", func(t *testing.T, newStore func(testing.TB) limit.Store) { testModel(t, newStore) }},
	{"Saturation", func(t *testing.T, newStore func(testing.TB) limit.Store) { testSaturation(t, newStore) }},
	{"ModelFullRange", func(t *testing.T, newStore func(testing.TB) limit.Store) { testModelFullRange(t, newStore) }},
}

// env is one subtest's store, clock and key space.
type env struct {
	tb     testing.TB
	store  limit.Store
	clock  *FakeClock
	domain string
}

func newEnv(tb testing.TB, newStore func(testing.TB) limit.Store) *env {
	tb.Helper()
	name := tb.Name()
	if len(name) > 120 {
		name = name[len(name)-120:]
	}
	return &env{
		tb:     tb,
		store:  newStore(tb),
		clock:  NewFakeClock(base),
		domain: fmt.Sprintf("storetest-%016x-%s", rand.Uint64(), strings.ReplaceAll(name, "/", ".")),
	}
}

// key returns a counter key for name. Every key of one env shares its
// first entry, so they share a hash tag and can be charged together.
func (e *env) key(name string, alg limit.Algorithm, window time.Duration) string {
	return limit.Key(limit.Requests, alg, window, e.domain, []limit.Entry{{Key: "storetest", Value: "x"}, {Key: "counter", Value: name}})
}

// charge returns a charge template with a key of its own.
func (e *env) charge(name string, c limit.Charge) limit.Charge {
	c.Key = e.key(name, c.Algorithm, c.Window)
	return c
}

// maxAt is the furthest at can set the clock: ms past it would overflow
// the time.Duration added to base and wrap the clock backwards.
const maxAt = math.MaxInt64 / int64(time.Millisecond)

// at sets the clock to base+ms.
func (e *env) at(ms int64) time.Time {
	if ms > maxAt {
		e.tb.Fatalf("storetest: clock offset %d ms overflows a time.Duration (at most %d)", ms, maxAt)
	}
	t := base.Add(time.Duration(ms) * time.Millisecond)
	e.clock.Set(t)
	return t
}

// apply runs one Apply at the clock's time and fails the test on error.
func (e *env) apply(charges ...limit.Charge) (bool, []limit.Result) {
	e.tb.Helper()
	res := make([]limit.Result, len(charges))
	ok, err := e.store.Apply(context.Background(), e.clock.Now(), charges, res)
	if err != nil {
		e.tb.Fatalf("Apply at %v: %v", e.clock.Now().Sub(base), err)
	}
	return ok, res
}

func cost(c limit.Charge, n int64) limit.Charge {
	c.Cost = n
	return c
}

func shadow(c limit.Charge) limit.Charge {
	c.Shadow = true
	return c
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// res builds a Result from milliseconds.
func res(fits bool, remaining uint64, resetMs, retryMs int64) limit.Result {
	return limit.Result{Fits: fits, Remaining: remaining, ResetAfter: ms(resetMs), RetryAfter: ms(retryMs)}
}

func fmtResult(r limit.Result) string {
	return fmt.Sprintf("{Fits:%v Remaining:%d ResetAfter:%dms RetryAfter:%dms}", r.Fits, r.Remaining, r.ResetAfter.Milliseconds(), r.RetryAfter.Milliseconds())
}

func checkResult(tb testing.TB, what string, got, want limit.Result) {
	tb.Helper()
	if got != want {
		tb.Errorf("%s:\n got  %s\n want %s", what, fmtResult(got), fmtResult(want))
	}
}

// step is one single-charge Apply of a script.
type step struct {
	at   int64 // ms after base
	cost int64
	want limit.Result
}

type scriptCase struct {
	name  string
	give  limit.Charge // Key is filled in per case
	steps []step
}

// runScripts runs each case's steps on a fresh key. A single charge is
// admitted exactly when it fits (a refund always is).
func runScripts(t *testing.T, newStore func(testing.TB) limit.Store, cases []scriptCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			c := e.charge("c", tc.give)
			for i, s := range tc.steps {
				e.at(s.at)
				admitted, r := e.apply(cost(c, s.cost))
				what := fmt.Sprintf("step %d (at %dms, cost %d)", i, s.at, s.cost)
				checkResult(t, what, r[0], s.want)
				if admitted != s.want.Fits {
					t.Errorf("%s: admitted = %v, want %v", what, admitted, s.want.Fits)
				}
			}
		})
	}
}

// The sliding window cases use W = 60s in N = 6 buckets (w = 10s, M = 6),
// so a bucket leaves the count (M+1)*w = 70s after it starts.
var sliding = limit.Charge{Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Minute, Buckets: 6}

func withBuckets(c limit.Charge, n uint16) limit.Charge { c.Buckets = n; return c }
func withAmount(c limit.Charge, n uint64) limit.Charge  { c.Amount = n; return c }
func withBurst(c limit.Charge, n uint64) limit.Charge   { c.Burst = n; return c }
func withWindow(c limit.Charge, d time.Duration) limit.Charge {
	c.Window = d
	return c
}

var slidingCases = []scriptCase{
	{name: "charge on a fresh counter", give: sliding, steps: []step{
		{at: 0, cost: 1, want: res(true, 9, 70000, 0)},
	}},
	{name: "reset counts from the bucket start", give: sliding, steps: []step{
		{at: 5000, cost: 1, want: res(true, 9, 65000, 0)},
		{at: 9999, cost: 0, want: res(true, 9, 60001, 0)},
	}},
	{name: "fills to the limit then denies", give: sliding, steps: []step{
		{at: 0, cost: 10, want: res(true, 0, 70000, 0)},
		{at: 0, cost: 1, want: res(false, 0, 70000, 70000)},
		{at: 69999, cost: 1, want: res(false, 0, 1, 1)},
		{at: 70000, cost: 10, want: res(true, 0, 70000, 0)},
	}},
	{name: "a full window later the old bucket still counts", give: sliding, steps: []step{
		{at: 0, cost: 10, want: res(true, 0, 70000, 0)},
		{at: 60000, cost: 1, want: res(false, 0, 10000, 10000)},
	}},
	{name: "oldest bucket leaves first", give: sliding, steps: []step{
		{at: 0, cost: 4, want: res(true, 6, 70000, 0)},
		{at: 25000, cost: 6, want: res(true, 0, 65000, 0)},
		{at: 30000, cost: 1, want: res(false, 0, 60000, 40000)},
		{at: 69999, cost: 1, want: res(false, 0, 20001, 1)},
		{at: 70000, cost: 4, want: res(true, 0, 70000, 0)},
		{at: 70000, cost: 1, want: res(false, 0, 70000, 20000)},
	}},
	{name: "weighted retry waits for enough room", give: sliding, steps: []step{
		{at: 0, cost: 3, want: res(true, 7, 70000, 0)},
		{at: 10000, cost: 3, want: res(true, 4, 70000, 0)},
		{at: 20000, cost: 3, want: res(true, 1, 70000, 0)},
		{at: 30000, cost: 5, want: res(false, 1, 60000, 50000)},
		{at: 30000, cost: 1, want: res(true, 0, 70000, 0)},
	}},
	{name: "cost above amount never fits", give: sliding, steps: []step{
		{at: 0, cost: 11, want: res(false, 10, 0, 0)},
		{at: 0, cost: 2, want: res(true, 8, 70000, 0)},
		{at: 1000, cost: 11, want: res(false, 8, 69000, 69000)},
		{at: 1000, cost: 8, want: res(true, 0, 69000, 0)},
	}},
	// A check asks whether the counter is over its limit, as
	// envoyproxy/ratelimit answers hits_addend 0: at the limit it is not.
	{name: "check fits up to the limit", give: sliding, steps: []step{
		{at: 0, cost: 9, want: res(true, 1, 70000, 0)},
		{at: 0, cost: 0, want: res(true, 1, 70000, 0)},
		{at: 0, cost: 1, want: res(true, 0, 70000, 0)},
		{at: 0, cost: 0, want: res(true, 0, 70000, 0)},
		{at: 0, cost: 1, want: res(false, 0, 70000, 70000)},
	}},
	{name: "refund takes the newest bucket first", give: sliding, steps: []step{
		{at: 0, cost: 3, want: res(true, 7, 70000, 0)},
		{at: 10000, cost: 4, want: res(true, 3, 70000, 0)},
		{at: 20000, cost: -5, want: res(true, 8, 50000, 0)},
		{at: 20000, cost: 0, want: res(true, 8, 50000, 0)},
		{at: 20000, cost: -100, want: res(true, 10, 0, 0)},
		{at: 20000, cost: 10, want: res(true, 0, 70000, 0)},
	}},
	{name: "refund on a fresh counter", give: sliding, steps: []step{
		{at: 0, cost: -3, want: res(true, 10, 0, 0)},
		{at: 0, cost: 10, want: res(true, 0, 70000, 0)},
		{at: 0, cost: 1, want: res(false, 0, 70000, 70000)},
	}},
	{name: "amount zero admits nothing", give: withAmount(sliding, 0), steps: []step{
		{at: 0, cost: 1, want: res(false, 0, 0, 0)},
		{at: 0, cost: 0, want: res(false, 0, 0, 0)},
		{at: 0, cost: -1, want: res(true, 0, 0, 0)},
	}},
	{name: "default buckets", give: withBuckets(sliding, 0), steps: []step{
		// 20 buckets: w = 3s, M = 20.
		{at: 0, cost: 10, want: res(true, 0, 63000, 0)},
		{at: 62999, cost: 1, want: res(false, 0, 1, 1)},
		{at: 63000, cost: 1, want: res(true, 9, 63000, 0)},
	}},
	{name: "buckets that do not divide the window", give: withBuckets(sliding, 7), steps: []step{
		// w = ceil(60000/7) = 8572, M = 7; base is 7680ms into its bucket.
		{at: 0, cost: 1, want: res(true, 9, 60896, 0)},
		{at: 20000, cost: 9, want: res(true, 0, 66612, 0)},
		{at: 20000, cost: 1, want: res(false, 0, 66612, 40896)},
		{at: 60896, cost: 1, want: res(true, 0, 68576, 0)},
	}},
	{name: "one bucket", give: withBuckets(sliding, 1), steps: []step{
		// w = W, M = 1: the previous window counts too.
		{at: 30000, cost: 10, want: res(true, 0, 90000, 0)},
		{at: 60000, cost: 1, want: res(false, 0, 60000, 60000)},
		{at: 120000, cost: 10, want: res(true, 0, 120000, 0)},
	}},
}

// The fixed window cases use W = 1 minute, aligned to the Unix epoch.
var fixed = limit.Charge{Algorithm: limit.FixedWindow, Amount: 3, Window: time.Minute}

var fixedCases = []scriptCase{
	{name: "counts per window", give: fixed, steps: []step{
		{at: 0, cost: 1, want: res(true, 2, 60000, 0)},
		{at: 30000, cost: 2, want: res(true, 0, 30000, 0)},
		{at: 59999, cost: 1, want: res(false, 0, 1, 1)},
		{at: 60000, cost: 1, want: res(true, 2, 60000, 0)},
	}},
	{name: "resets at the epoch-aligned boundary", give: fixed, steps: []step{
		{at: 45000, cost: 3, want: res(true, 0, 15000, 0)},
		{at: 59000, cost: 1, want: res(false, 0, 1000, 1000)},
		{at: 60000, cost: 3, want: res(true, 0, 60000, 0)},
	}},
	{name: "check on an empty window reports its end", give: fixed, steps: []step{
		{at: 15000, cost: 0, want: res(true, 3, 45000, 0)},
	}},
	{name: "cost above amount never fits", give: fixed, steps: []step{
		{at: 10000, cost: 4, want: res(false, 3, 50000, 50000)},
		{at: 10000, cost: 1, want: res(true, 2, 50000, 0)},
		{at: 20000, cost: 4, want: res(false, 2, 40000, 40000)},
	}},
	{name: "check at the limit", give: fixed, steps: []step{
		{at: 0, cost: 2, want: res(true, 1, 60000, 0)},
		{at: 1000, cost: 0, want: res(true, 1, 59000, 0)},
		{at: 1000, cost: 1, want: res(true, 0, 59000, 0)},
		{at: 2000, cost: 0, want: res(true, 0, 58000, 0)},
		{at: 2000, cost: 1, want: res(false, 0, 58000, 58000)},
	}},
	{name: "a limit of 0 refuses checks too", give: withAmount(fixed, 0), steps: []step{
		{at: 1000, cost: 0, want: res(false, 0, 59000, 59000)},
	}},
	{name: "refund", give: fixed, steps: []step{
		{at: 0, cost: 3, want: res(true, 0, 60000, 0)},
		{at: 1000, cost: -1, want: res(true, 1, 59000, 0)},
		{at: 1000, cost: 1, want: res(true, 0, 59000, 0)},
		{at: 1000, cost: -5, want: res(true, 3, 59000, 0)},
	}},
	{name: "hour window", give: withWindow(withAmount(fixed, 100), time.Hour), steps: []step{
		{at: 1800000, cost: 100, want: res(true, 0, 1800000, 0)},
		{at: 3599999, cost: 1, want: res(false, 0, 1, 1)},
		{at: 3600000, cost: 1, want: res(true, 99, 3600000, 0)},
	}},
}

// The token bucket cases use W = 1000s and Amount = 10, so T = 100s: long
// enough that a store with real-clock TTLs keeps state between steps.
var token = limit.Charge{Algorithm: limit.TokenBucket, Amount: 10, Window: 1000 * time.Second}

var tokenCases = []scriptCase{
	{name: "charge on a fresh bucket", give: token, steps: []step{
		{at: 0, cost: 1, want: res(true, 9, 100000, 0)},
	}},
	{name: "burst then deny", give: token, steps: []step{
		{at: 0, cost: 10, want: res(true, 0, 1000000, 0)},
		{at: 0, cost: 1, want: res(false, 0, 1000000, 100000)},
		{at: 50000, cost: 1, want: res(false, 0, 950000, 50000)},
		{at: 50000, cost: 0, want: res(false, 0, 950000, 50000)},
		{at: 99999, cost: 0, want: res(false, 0, 900001, 1)},
		{at: 100000, cost: 1, want: res(true, 0, 1000000, 0)},
	}},
	{name: "refills at the rate", give: token, steps: []step{
		{at: 0, cost: 10, want: res(true, 0, 1000000, 0)},
		{at: 250000, cost: 0, want: res(true, 2, 750000, 0)},
		{at: 250000, cost: 3, want: res(false, 2, 750000, 50000)},
		{at: 250000, cost: 2, want: res(true, 0, 950000, 0)},
	}},
	{name: "burst smaller than amount", give: withBurst(token, 5), steps: []step{
		{at: 0, cost: 5, want: res(true, 0, 500000, 0)},
		{at: 0, cost: 1, want: res(false, 0, 500000, 100000)},
		{at: 1000000, cost: 6, want: res(false, 5, 0, 0)},
		{at: 1000000, cost: 2, want: res(true, 3, 200000, 0)},
		{at: 1000000, cost: 6, want: res(false, 3, 200000, 200000)},
	}},
	{name: "refund", give: withBurst(token, 5), steps: []step{
		{at: 0, cost: 5, want: res(true, 0, 500000, 0)},
		{at: 0, cost: -2, want: res(true, 2, 300000, 0)},
		{at: 0, cost: -10, want: res(true, 5, 0, 0)},
		{at: 0, cost: 5, want: res(true, 0, 500000, 0)},
	}},
	{name: "refund never goes past a full bucket", give: token, steps: []step{
		{at: 0, cost: 1, want: res(true, 9, 100000, 0)},
		{at: 500000, cost: -3, want: res(true, 10, 0, 0)},
		{at: 500000, cost: 10, want: res(true, 0, 1000000, 0)},
		{at: 500000, cost: 1, want: res(false, 0, 1000000, 100000)},
	}},
	{name: "burst of one at a rate that is not a binary fraction", give: withBurst(withAmount(token, 6), 1), steps: []step{
		// T = 166666.66...ms. A lone tat of ~1.7e12ms would round it away.
		{at: 0, cost: 1, want: res(true, 0, 166667, 0)},
		{at: 0, cost: 1, want: res(false, 0, 166667, 166667)},
		{at: 166666, cost: 0, want: res(false, 0, 1, 1)},
		{at: 166667, cost: 1, want: res(true, 0, 166667, 0)},
	}},
	{name: "burst of three at T = W/3", give: withAmount(token, 3), steps: []step{
		{at: 0, cost: 1, want: res(true, 2, 333334, 0)},
		{at: 0, cost: 1, want: res(true, 1, 666667, 0)},
		{at: 0, cost: 1, want: res(true, 0, 1000000, 0)},
		{at: 0, cost: 1, want: res(false, 0, 1000000, 333334)},
		{at: 333334, cost: 1, want: res(true, 0, 1000000, 0)},
	}},
	{name: "amount zero admits nothing", give: withAmount(token, 0), steps: []step{
		{at: 0, cost: 1, want: res(false, 0, 0, 0)},
		{at: 0, cost: 0, want: res(false, 0, 0, 0)},
		{at: 0, cost: -1, want: res(true, 0, 0, 0)},
	}},
}

// testBurstExact: a fresh bucket admits exactly Burst charges of 1 at one
// instant, whatever T is; floats must not lose the last token.
func testBurstExact(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	e.at(0)
	for amount := uint64(1); amount <= 40; amount++ {
		bursts := []uint64{1, amount + 3}
		if amount > 1 {
			bursts = append(bursts, amount)
		}
		for _, burst := range bursts {
			c := e.charge(fmt.Sprintf("a%d-b%d", amount, burst), limit.Charge{
				Algorithm: limit.TokenBucket, Amount: amount, Burst: burst, Window: 1000 * time.Second, Cost: 1,
			})
			for i := uint64(0); i <= burst; i++ {
				ok, r := e.apply(c)
				if want := i < burst; ok != want || r[0].Fits != want {
					t.Fatalf("amount %d, burst %d: charge %d admitted = %v, want %v", amount, burst, i+1, ok, want)
				}
				if r[0].Remaining != burst-min(i+1, burst) {
					t.Fatalf("amount %d, burst %d: charge %d Remaining = %d, want %d", amount, burst, i+1, r[0].Remaining, burst-min(i+1, burst))
				}
			}
		}
	}
}

func testAllOrNothing(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	a := e.charge("a", withAmount(sliding, 5))
	b := e.charge("b", withAmount(fixed, 1))
	c := e.charge("c", withAmount(withWindow(token, 1000*time.Second), 2)) // T = 500s
	e.at(0)

	ok, r := e.apply(cost(a, 1), cost(b, 1), cost(c, 1))
	if !ok {
		t.Fatalf("first decision denied: %v", r)
	}
	checkResult(t, "first a", r[0], res(true, 4, 70000, 0))
	checkResult(t, "first b", r[1], res(true, 0, 60000, 0))
	checkResult(t, "first c", r[2], res(true, 1, 500000, 0))

	// b is full: nothing of this decision is kept, and the results say so.
	e.at(1000)
	ok, r = e.apply(cost(a, 1), cost(b, 1), cost(c, 1))
	if ok {
		t.Fatal("second decision admitted past b's limit")
	}
	checkResult(t, "denied a", r[0], res(true, 4, 69000, 0))
	checkResult(t, "denied b", r[1], res(false, 0, 59000, 59000))
	checkResult(t, "denied c", r[2], res(true, 1, 499000, 0))

	ok, r = e.apply(cost(a, 0), cost(c, 0))
	if !ok {
		t.Fatal("follow-up check denied")
	}
	checkResult(t, "a after the denial", r[0], res(true, 4, 69000, 0))
	checkResult(t, "c after the denial", r[1], res(true, 1, 499000, 0))

	// A denial still applies refunds.
	ok, r = e.apply(cost(a, -1), cost(b, 1), cost(c, 1))
	if ok {
		t.Fatal("third decision admitted past b's limit")
	}
	checkResult(t, "refunded a", r[0], res(true, 5, 0, 0))
	checkResult(t, "c", r[2], res(true, 1, 499000, 0))

	// The denying charge may come first.
	ok, r = e.apply(cost(b, 1), cost(a, 2))
	if ok {
		t.Fatal("fourth decision admitted past b's limit")
	}
	checkResult(t, "a behind a denial", r[1], res(true, 5, 0, 0))
}

func testShadow(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	s := shadow(e.charge("s", withAmount(sliding, 3)))
	k := e.charge("k", sliding)
	e.at(0)

	ok, r := e.apply(cost(s, 2), cost(k, 1))
	if !ok {
		t.Fatal("denied with room everywhere")
	}
	checkResult(t, "shadow that fits", r[0], res(true, 1, 70000, 0))

	// A shadow charge that does not fit is reported, not kept, and blocks nothing.
	ok, r = e.apply(cost(s, 2), cost(k, 1))
	if !ok {
		t.Fatal("a shadow charge blocked the decision")
	}
	checkResult(t, "shadow over", r[0], res(false, 1, 70000, 70000))
	checkResult(t, "k", r[1], res(true, 8, 70000, 0))
	ok, r = e.apply(cost(s, 1))
	if !ok {
		t.Fatal("the shadow charge that did not fit was kept")
	}
	checkResult(t, "shadow after", r[0], res(true, 0, 70000, 0))

	// A shadow check fits at the limit (it is not over it); a shadow
	// charge that does not fit does not block either.
	ok, r = e.apply(cost(s, 0), cost(k, 1))
	if !ok || !r[0].Fits {
		t.Fatalf("shadow check at the limit: admitted %v, fits %v; want true, true", ok, r[0].Fits)
	}
	ok, r = e.apply(cost(s, 1), cost(k, 1))
	if !ok || r[0].Fits {
		t.Fatalf("shadow charge at the limit: admitted %v, fits %v; want true, false", ok, r[0].Fits)
	}

	// A shadow charge that fits is not kept when another charge denies.
	s2 := shadow(e.charge("s2", withAmount(sliding, 3)))
	never := e.charge("never", withAmount(sliding, 0))
	ok, r = e.apply(cost(s2, 1), cost(never, 1))
	if ok {
		t.Fatal("admitted past a zero limit")
	}
	checkResult(t, "shadow in a denied decision", r[0], res(true, 3, 0, 0))
}

// testForce: a Force charge (a usage report) is kept whatever the usage,
// never blocks, and is kept in a denied decision too.
func testForce(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, give := range []limit.Charge{
		withAmount(sliding, 3),
		{Algorithm: limit.FixedWindow, Amount: 3, Window: time.Hour},
		{Algorithm: limit.TokenBucket, Amount: 3, Window: time.Hour},
	} {
		t.Run(give.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			k := e.charge("k", give)
			force := func(n int64) limit.Charge { c := cost(k, n); c.Force = true; return c }
			e.at(0)
			e.apply(cost(k, 2))
			ok, r := e.apply(force(2))
			if !ok || r[0].Fits || r[0].Remaining != 0 {
				t.Fatalf("force past the limit: admitted %v, %+v; want admitted, not fitting, 0 left", ok, r[0])
			}
			if ok, r := e.apply(cost(k, 0)); ok || r[0].Fits {
				t.Fatalf("a check after the forced charge fits: %+v", r[0])
			}
			// Far beyond the window, with the key fresh again, a decision
			// that another charge denies still keeps the Force charge.
			never := e.charge("never", withAmount(sliding, 0))
			e.at(10 * 3600 * 1000)
			if ok, _ := e.apply(force(3), cost(never, 1)); ok {
				t.Fatal("admitted past a zero limit")
			}
			if ok, r := e.apply(cost(k, 1)); ok || r[0].Remaining != 0 {
				t.Fatalf("the Force charge of a denied decision was not kept: %+v", r[0])
			}
		})
	}
}

// testSameKeyTwice: a charge sees the ones before it on its key, and
// every Result describes the counter after the whole Apply.
func testSameKeyTwice(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	k := e.charge("k", withAmount(sliding, 5))
	e.at(0)

	ok, r := e.apply(cost(k, 3), cost(k, 3))
	if ok {
		t.Fatal("admitted 6 against 5")
	}
	checkResult(t, "first of 3+3", r[0], res(true, 5, 0, 0))
	checkResult(t, "second of 3+3", r[1], res(false, 5, 0, 70000))

	ok, r = e.apply(cost(k, 2), cost(k, 3))
	if !ok {
		t.Fatal("denied 5 against 5")
	}
	checkResult(t, "first of 2+3", r[0], res(true, 0, 70000, 0))
	checkResult(t, "second of 2+3", r[1], res(true, 0, 70000, 0))

	ok, r = e.apply(cost(k, -2), cost(k, 2), cost(k, 1))
	if ok {
		t.Fatal("the charge after refund and charge should not fit")
	}
	checkResult(t, "refund of -2+2+1", r[0], res(true, 2, 70000, 0))
	checkResult(t, "last of -2+2+1", r[2], res(false, 2, 70000, 70000))

	tb := e.charge("tb", token) // T = 100s
	ok, r = e.apply(cost(tb, 6), cost(tb, 5))
	if ok {
		t.Fatal("token bucket admitted 11 against 10")
	}
	checkResult(t, "first of 6+5", r[0], res(true, 10, 0, 0))
	checkResult(t, "second of 6+5", r[1], res(false, 10, 0, 100000))
	ok, r = e.apply(cost(tb, 6), cost(tb, 4))
	if !ok {
		t.Fatal("token bucket denied 10 against 10")
	}
	checkResult(t, "first of 6+4", r[0], res(true, 0, 1000000, 0))
}

// testExpiry: once its TTL has passed, a counter behaves as a fresh one.
func testExpiry(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	s := e.charge("s", sliding)
	f := e.charge("f", fixed)
	k := e.charge("k", token)
	e.at(0)
	for _, c := range []limit.Charge{s, f, k} {
		if ok, _ := e.apply(cost(c, int64(c.Amount))); !ok {
			t.Fatalf("%v: fill denied", c.Algorithm)
		}
	}
	// In order of TTL, so that time only moves forward.
	cases := []struct {
		name string
		give limit.Charge
		ttl  int64 // ms, from the contract
		want limit.Result
	}{
		{name: "fixed", give: f, ttl: 60000, want: res(true, 0, 60000, 0)},
		{name: "sliding", give: s, ttl: 70000, want: res(true, 0, 70000, 0)},
		{name: "token", give: k, ttl: 1000000, want: res(true, 0, 1000000, 0)},
	}
	for _, tc := range cases {
		full := cost(tc.give, int64(tc.give.Amount))
		e.at(tc.ttl - 1)
		if ok, r := e.apply(full); ok {
			t.Errorf("%s: admitted 1ms before the TTL: %s", tc.name, fmtResult(r[0]))
		}
		e.at(tc.ttl)
		_, r := e.apply(full)
		checkResult(t, tc.name+" refill at the TTL", r[0], tc.want)
	}
	e.at(7 * 86400000)
	for _, tc := range cases {
		_, r := e.apply(cost(tc.give, 0))
		want := res(true, tc.give.Amount, 0, 0)
		if tc.give.Algorithm == limit.FixedWindow {
			want.ResetAfter = ms(60000)
		}
		checkResult(t, tc.name+" a week later", r[0], want)
	}
}

// testWidthChange: a counter is kept in one bucket width; changing a
// rule's Buckets starts afresh rather than reading buckets of another
// width, from the first decision in the new width (a check included).
func testWidthChange(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	six := e.charge("k", sliding)
	three := withBuckets(six, 3) // w = 20s, M = 3
	e.at(0)
	if ok, _ := e.apply(cost(six, 10)); !ok {
		t.Fatal("fill denied")
	}
	_, r := e.apply(cost(three, 0))
	checkResult(t, "check in another width", r[0], res(true, 10, 0, 0))
	_, r = e.apply(cost(six, 0))
	checkResult(t, "the check replaced the first width", r[0], res(true, 10, 0, 0))
	_, r = e.apply(cost(three, 4))
	checkResult(t, "charge in another width", r[0], res(true, 6, 80000, 0))
	_, r = e.apply(cost(six, 0))
	checkResult(t, "back to the first width", r[0], res(true, 10, 0, 0))
}

// testClockBack: a decision whose now is behind the key's high-water mark
// hw (a lagging replica, or a decision that reached the store late)
// counts as if at hw: it sees the buckets the callers ahead filled and
// charges the newest one. Every decision moves hw, checks and denied
// decisions included.
func testClockBack(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	k := e.charge("k", sliding)
	e.at(25000) // bucket 2
	if ok, _ := e.apply(cost(k, 6)); !ok {
		t.Fatal("charge denied")
	}
	e.at(15000) // bucket 1, behind hw = 2
	_, r := e.apply(cost(k, 3))
	checkResult(t, "behind", r[0], res(true, 1, 75000, 0))
	_, r = e.apply(cost(k, 2))
	checkResult(t, "behind, over", r[0], res(false, 1, 75000, 75000))
	_, r = e.apply(cost(k, -5))
	checkResult(t, "refund behind", r[0], res(true, 6, 75000, 0))
	e.at(25000)
	_, r = e.apply(cost(k, 0))
	checkResult(t, "back in step", r[0], res(true, 6, 65000, 0))

	// A check moves hw: a fixed window's later charge behind it counts in
	// the window the check saw.
	f := e.charge("f", fixed)
	e.at(60000)
	_, r = e.apply(cost(f, 0))
	checkResult(t, "check in window 1", r[0], res(true, 3, 60000, 0))
	e.at(59999)
	_, r = e.apply(cost(f, 1))
	checkResult(t, "charge behind it", r[0], res(true, 2, 60001, 0))

	// So does a denied decision, for charges it did not keep.
	g := e.charge("g", sliding)
	never := e.charge("never", withAmount(sliding, 0))
	e.at(70000) // bucket 7
	if ok, _ := e.apply(cost(g, 1), cost(never, 1)); ok {
		t.Fatal("admitted past a zero limit")
	}
	e.at(65000) // bucket 6, behind hw = 7
	_, r = e.apply(cost(g, 1))
	checkResult(t, "charge behind a denied decision", r[0], res(true, 9, 75000, 0))
}

func testEmpty(t *testing.T, newStore func(testing.TB) limit.Store) {
	e := newEnv(t, newStore)
	ok, err := e.store.Apply(context.Background(), base, nil, nil)
	if err != nil || !ok {
		t.Fatalf("empty Apply = %v, %v; want true, nil", ok, err)
	}
}
