package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The conformance suites of the control loop's shared state (limit.Flights,
// limit.Meters, limit.Cells). Like RunBoard they pass every time
// explicitly, so they run unchanged against Redis, whose keys expire by
// its own clock: every lease and ttl below is at least a second, so that
// a test stalled on a busy machine does not see Redis drop a key before
// the test's fake time has moved past it. Every expected value is exact.
//
// Each subtest calls its constructor once and uses scopes unique to it.
// A store that drops other scopes' state by the caller's now (memstore
// sweeps a few scopes on each write) must be made fresh for each call:
// the subtests' times are days apart.

// sharedEnv is one subtest's time origin and scope prefix.
type sharedEnv struct {
	tb     testing.TB
	t0     time.Time
	prefix string
}

func newSharedEnv(tb testing.TB, day int) sharedEnv {
	name := tb.Name()
	// Scopes are capped at limit.MaxScopeBytes; the tail of a name is
	// what tells subtests apart.
	if len(name) > 80 {
		name = name[len(name)-80:]
	}
	return sharedEnv{tb: tb, t0: base.Add(time.Duration(day) * 24 * time.Hour), prefix: name + "/"}
}

func (e sharedEnv) scope(s string) string { return e.prefix + s }

func (e sharedEnv) at(ms int64) time.Time { return e.t0.Add(time.Duration(ms) * time.Millisecond) }

// RunFlights runs the limit.Flights conformance suite.
func RunFlights(t *testing.T, newFlights func(testing.TB) limit.Flights) {
	runSuite(t, newFlights, 0, []suiteCase[limit.Flights]{
		{name: "Lease", run: testFlightsLease},
		{name: "Renew", run: testFlightsRenew},
		{name: "EndIdempotent", run: testFlightsEnd},
		{name: "CountChangesNothing", run: testFlightsCountReadOnly},
		{name: "ScopesIndependent", run: testFlightsScopes},
		{name: "Bad", run: testFlightsBad},
		{name: "Concurrent", run: testFlightsConcurrent},
	})
}

// suiteCase is one case of a shared-state suite.
type suiteCase[S any] struct {
	name string
	run  func(*testing.T, S, sharedEnv)
}

// runSuite runs cases in parallel, each on a fresh store and its own day
// (day0 + its index), so that no two share keys or times.
func runSuite[S any](t *testing.T, newStore func(testing.TB) S, day0 int, cases []suiteCase[S]) {
	for i, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, newStore(t), newSharedEnv(t, day0+i))
		})
	}
}

// flights wraps a Flights with fatal-on-error helpers in an env's time.
type flights struct {
	sharedEnv
	f limit.Flights
}

func (x flights) begin(ms int64, scope string, lease time.Duration, ids ...string) int64 {
	x.tb.Helper()
	n, err := x.f.Begin(context.Background(), x.at(ms), x.scope(scope), ids, lease)
	if err != nil {
		x.tb.Fatalf("Begin(%d, %q, %q, %v): %v", ms, scope, ids, lease, err)
	}
	return n
}

func (x flights) end(ms int64, scope string, ids ...string) int64 {
	x.tb.Helper()
	n, err := x.f.End(context.Background(), x.at(ms), x.scope(scope), ids)
	if err != nil {
		x.tb.Fatalf("End(%d, %q, %q): %v", ms, scope, ids, err)
	}
	return n
}

func (x flights) count(ms int64, scopes ...string) []int64 {
	x.tb.Helper()
	full := make([]string, len(scopes))
	for i, s := range scopes {
		full[i] = x.scope(s)
	}
	n, err := x.f.Count(context.Background(), x.at(ms), full)
	if err != nil {
		x.tb.Fatalf("Count(%d, %q): %v", ms, scopes, err)
	}
	return n
}

// step is one call of a Flights script and the count it must return.
type flightStep struct {
	name  string
	at    int64 // ms after the subtest's origin
	op    string
	scope string
	ids   []string
	lease time.Duration
	want  int64
}

func runFlightSteps(t *testing.T, x flights, steps []flightStep) {
	t.Helper()
	for _, s := range steps {
		var got int64
		switch s.op {
		case "begin":
			got = x.begin(s.at, s.scope, s.lease, s.ids...)
		case "end":
			got = x.end(s.at, s.scope, s.ids...)
		case "count":
			got = x.count(s.at, s.scope)[0]
		default:
			t.Fatalf("%s: unknown op %q", s.name, s.op)
		}
		if got != s.want {
			t.Fatalf("%s: %s(%d, %q, %q) = %d, want %d", s.name, s.op, s.at, s.scope, s.ids, got, s.want)
		}
	}
}

func testFlightsLease(t *testing.T, f limit.Flights, e sharedEnv) {
	x := flights{e, f}
	runFlightSteps(t, x, []flightStep{
		{name: "first", at: 0, op: "begin", scope: "m", ids: []string{"a"}, lease: 5 * time.Second, want: 1},
		{name: "batch", at: 0, op: "begin", scope: "m", ids: []string{"b", "c"}, lease: 5 * time.Second, want: 3},
		{name: "later, shorter", at: 1000, op: "begin", scope: "m", ids: []string{"d"}, lease: 2 * time.Second, want: 4},
		{name: "just before d expires", at: 2999, op: "count", scope: "m", want: 4},
		{name: "d expires exactly at now+lease", at: 3000, op: "count", scope: "m", want: 3},
		{name: "just before a,b,c expire", at: 4999, op: "count", scope: "m", want: 3},
		{name: "a,b,c expire", at: 5000, op: "count", scope: "m", want: 0},
		{name: "a write after expiry counts only the live", at: 5000, op: "begin", scope: "m", ids: []string{"e"}, lease: 1500*time.Millisecond + time.Microsecond, want: 1},
		// A lease with a sub-millisecond remainder rounds up: e ends at 6501.
		{name: "rounded up", at: 6500, op: "count", scope: "m", want: 1},
		{name: "rounded up, gone", at: 6501, op: "count", scope: "m", want: 0},
		{name: "empty begin only counts", at: 6000, op: "begin", scope: "m", lease: time.Second, want: 1},
		{name: "empty end only counts", at: 6000, op: "end", scope: "m", want: 1},
	})
}

// testFlightsRenew: Begin on a flight already in flight sets its lease to
// now+lease, later or earlier than before, and counts it once.
func testFlightsRenew(t *testing.T, f limit.Flights, e sharedEnv) {
	x := flights{e, f}
	runFlightSteps(t, x, []flightStep{
		{name: "begin", at: 0, op: "begin", scope: "m", ids: []string{"a", "b"}, lease: 2 * time.Second, want: 2},
		{name: "renew a", at: 1500, op: "begin", scope: "m", ids: []string{"a"}, lease: 2 * time.Second, want: 2},
		{name: "b expires", at: 2000, op: "count", scope: "m", want: 1},
		{name: "a renewed", at: 3499, op: "count", scope: "m", want: 1},
		{name: "a expires", at: 3500, op: "count", scope: "m", want: 0},
		{name: "twice in a batch counts once", at: 4000, op: "begin", scope: "m", ids: []string{"c", "c", "d"}, lease: 10 * time.Second, want: 2},
		{name: "renew shorter", at: 4000, op: "begin", scope: "m", ids: []string{"c"}, lease: time.Second, want: 2},
		{name: "c ends at its new lease", at: 5000, op: "count", scope: "m", want: 1},
	})
}

func testFlightsEnd(t *testing.T, f limit.Flights, e sharedEnv) {
	x := flights{e, f}
	lease := time.Minute
	runFlightSteps(t, x, []flightStep{
		{name: "begin", at: 0, op: "begin", scope: "m", ids: []string{"a", "b", "c", "d"}, lease: lease, want: 4},
		{name: "end a", at: 10, op: "end", scope: "m", ids: []string{"a"}, want: 3},
		{name: "end a again (the other channel)", at: 11, op: "end", scope: "m", ids: []string{"a"}, want: 3},
		{name: "end unknown", at: 12, op: "end", scope: "m", ids: []string{"zz"}, want: 3},
		{name: "end twice in a batch", at: 13, op: "end", scope: "m", ids: []string{"b", "b", "zz"}, want: 2},
		{name: "end in another scope", at: 14, op: "end", scope: "other", ids: []string{"c"}, want: 0},
		{name: "still 2", at: 15, op: "count", scope: "m", want: 2},
		{name: "end the rest", at: 16, op: "end", scope: "m", ids: []string{"c", "d"}, want: 0},
		{name: "end on an empty scope", at: 17, op: "end", scope: "m", ids: []string{"c"}, want: 0},
		{name: "an ended flight may begin again", at: 18, op: "begin", scope: "m", ids: []string{"a"}, lease: lease, want: 1},
		{name: "end after the lease ran out", at: 18 + lease.Milliseconds(), op: "end", scope: "m", ids: []string{"a"}, want: 0},
	})
}

// testFlightsCountReadOnly: Count judges liveness by its own now and
// drops nothing, so a reader behind a lease's end still sees the flight
// until a write drops it.
func testFlightsCountReadOnly(t *testing.T, f limit.Flights, e sharedEnv) {
	x := flights{e, f}
	runFlightSteps(t, x, []flightStep{
		{name: "begin", at: 0, op: "begin", scope: "m", ids: []string{"a"}, lease: time.Second, want: 1},
		{name: "read after expiry", at: 5000, op: "count", scope: "m", want: 0},
		{name: "read behind", at: 500, op: "count", scope: "m", want: 1},
		{name: "a write drops it", at: 5000, op: "end", scope: "m", ids: []string{"zz"}, want: 0},
		{name: "read behind after the drop", at: 500, op: "count", scope: "m", want: 0},
	})
}

func testFlightsScopes(t *testing.T, f limit.Flights, e sharedEnv) {
	x := flights{e, f}
	// Scope names that look like key syntax stay apart.
	scopes := []string{"m", "m:x", "{m}", "m}", "gpt-4o/premium"}
	for i, s := range scopes {
		ids := make([]string, i+1)
		for j := range ids {
			ids[j] = fmt.Sprint("id", j)
		}
		if got := x.begin(0, s, time.Minute, ids...); got != int64(i+1) {
			t.Fatalf("Begin(%q) = %d, want %d", s, got, i+1)
		}
	}
	got := x.count(1, append([]string{"absent"}, scopes...)...)
	if diff := cmp.Diff([]int64{0, 1, 2, 3, 4, 5}, got); diff != "" {
		t.Errorf("Count (-want +got):\n%s", diff)
	}
	if got := x.count(1); len(got) != 0 {
		t.Errorf("Count() = %v, want none", got)
	}
}

func testFlightsBad(t *testing.T, f limit.Flights, e sharedEnv) {
	ctx := context.Background()
	now := e.at(0)
	good := e.scope("g")
	long := strings.Repeat("x", limit.MaxScopeBytes+1)
	idMax := strings.Repeat("i", limit.MaxFlightIDBytes)
	many := make([]string, limit.MaxFlightIDs+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	tests := []struct {
		name  string
		scope string
		ids   []string
		lease time.Duration
	}{
		{name: "EmptyScope", scope: "", ids: []string{"a"}, lease: time.Second},
		{name: "LongScope", scope: long, ids: []string{"a"}, lease: time.Second},
		{name: "EmptyID", scope: good, ids: []string{"a", ""}, lease: time.Second},
		{name: "LongID", scope: good, ids: []string{"a", idMax + "i"}, lease: time.Second},
		{name: "TooManyIDs", scope: good, ids: many, lease: time.Second},
	}
	for _, tt := range tests {
		if _, err := f.Begin(ctx, now, tt.scope, tt.ids, tt.lease); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("%s: Begin error = %v, want limit.ErrInvalid", tt.name, err)
		}
		if _, err := f.End(ctx, now, tt.scope, tt.ids); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("%s: End error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	for _, lease := range []time.Duration{0, -time.Second, 999 * time.Microsecond} {
		if _, err := f.Begin(ctx, now, good, []string{"a"}, lease); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Begin with lease %v: error = %v, want limit.ErrInvalid", lease, err)
		}
	}
	for _, scopes := range [][]string{{""}, {good, long}} {
		if _, err := f.Count(ctx, now, scopes); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Count(%.20q): error = %v, want limit.ErrInvalid", scopes, err)
		}
	}
	x := flights{e, f}
	if got := x.count(0, "g"); got[0] != 0 {
		t.Fatalf("a rejected call changed the scope: Count = %d", got[0])
	}
	// The caps themselves are allowed.
	maxScope := e.scope(strings.Repeat("s", limit.MaxScopeBytes-len(e.scope(""))))
	if n, err := f.Begin(ctx, now, maxScope, append([]string{idMax}, many[:limit.MaxFlightIDs-1]...), time.Second); err != nil || n != limit.MaxFlightIDs {
		t.Errorf("Begin at the caps = %d, %v; want %d", n, err, limit.MaxFlightIDs)
	}
}

// testFlightsConcurrent: many goroutines begin and end flights, each end
// sent twice as the two completion channels do; the count is exact.
func testFlightsConcurrent(t *testing.T, f limit.Flights, e sharedEnv) {
	x := flights{e, f}
	const workers, perWorker, batch = 8, 40, 4
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			scope := e.scope("m")
			for i := 0; i < perWorker; i += batch {
				ids := make([]string, batch)
				for j := range ids {
					ids[j] = fmt.Sprintf("w%d-%d", w, i+j)
				}
				n, err := f.Begin(ctx, e.at(int64(i)), scope, ids, time.Minute)
				if err == nil && (n < batch || n > workers*perWorker) {
					err = fmt.Errorf("Begin = %d, out of [%d, %d]", n, batch, workers*perWorker)
				}
				if err != nil {
					errs <- err
					continue
				}
				// End the odd ones, twice, one at a time.
				for j := 1; j < batch; j += 2 {
					for range 2 {
						if _, err := f.End(ctx, e.at(int64(i)), scope, ids[j:j+1]); err != nil {
							errs <- err
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, want := x.count(perWorker, "m")[0], int64(workers*perWorker/2); got != want {
		t.Errorf("Count = %d, want %d", got, want)
	}
}

// RunMeters runs the limit.Meters conformance suite.
func RunMeters(t *testing.T, newMeters func(testing.TB) limit.Meters) {
	runSuite(t, newMeters, 10, []suiteCase[limit.Meters]{
		{name: "WholeAndPartial", run: testMetersSum},
		{name: "Keep", run: testMetersKeep},
		{name: "ZeroCounts", run: testMetersZero},
		{name: "WidthsAndScopes", run: testMetersApart},
		{name: "Bad", run: testMetersBad},
		{name: "Concurrent", run: testMetersConcurrent},
	})
}

type meters struct {
	sharedEnv
	m limit.Meters
}

func (x meters) add(ms int64, scope string, bucket, keep time.Duration, counts map[string]int64) {
	x.tb.Helper()
	if err := x.m.Add(context.Background(), x.at(ms), x.scope(scope), bucket, keep, counts); err != nil {
		x.tb.Fatalf("Add(%d, %q, %v, %v, %v): %v", ms, scope, bucket, keep, counts, err)
	}
}

// sumCase is one Sum and the sums it must return.
type sumCase struct {
	name    string
	at      int64
	scope   string
	bucket  time.Duration
	n       int
	partial bool
	want    map[string]int64
}

func (x meters) check(t *testing.T, cases []sumCase) {
	t.Helper()
	for _, c := range cases {
		got, err := x.m.Sum(context.Background(), x.at(c.at), x.scope(c.scope), c.bucket, c.n, c.partial)
		if err != nil {
			t.Fatalf("%s: Sum: %v", c.name, err)
		}
		if diff := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: Sum(%d, %q, %v, %d, %v) (-want +got):\n%s", c.name, c.at, c.scope, c.bucket, c.n, c.partial, diff)
		}
	}
}

type sums = map[string]int64

func testMetersSum(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	const s, keep = time.Second, time.Minute
	x.add(100, "m", s, keep, sums{"a": 1, "b": 2})
	x.add(999, "m", s, keep, sums{"a": 3})
	x.add(1000, "m", s, keep, sums{"a": 10})
	x.add(2500, "m", s, keep, sums{"c": 5, "a": 100})
	x.check(t, []sumCase{
		{name: "two whole", at: 2500, scope: "m", bucket: s, n: 2, want: sums{"a": 14, "b": 2}},
		{name: "two whole and the partial", at: 2500, scope: "m", bucket: s, n: 2, partial: true, want: sums{"a": 114, "b": 2, "c": 5}},
		{name: "one whole", at: 2999, scope: "m", bucket: s, n: 1, want: sums{"a": 10}},
		{name: "only the partial", at: 2000, scope: "m", bucket: s, n: 0, partial: true, want: sums{"a": 100, "c": 5}},
		{name: "nothing", at: 2500, scope: "m", bucket: s, n: 0, want: sums{}},
		{name: "at a boundary the partial is empty", at: 3000, scope: "m", bucket: s, n: 3, partial: true, want: sums{"a": 114, "b": 2, "c": 5}},
		{name: "older buckets than asked are left out", at: 3000, scope: "m", bucket: s, n: 1, want: sums{"a": 100, "c": 5}},
		{name: "a reader behind", at: 1500, scope: "m", bucket: s, n: 1, partial: true, want: sums{"a": 14, "b": 2}},
		{name: "a reader far ahead", at: 100_000, scope: "m", bucket: s, n: 10, want: sums{}},
	})
}

// testMetersKeep: a bucket is summed until its end plus the longest keep
// any Add gave it, and not from then on.
func testMetersKeep(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	const s = time.Second
	x.add(0, "m", s, 2*s, sums{"a": 1})
	x.add(1000, "m", s, 2*s, sums{"a": 2})
	x.add(1500, "m", s, 4*s, sums{"a": 4}) // the second bucket now ends at 6000
	x.add(1800, "m", s, s, sums{"a": 16})  // and a shorter keep does not shorten it
	x.add(2000, "m", s, 1500*time.Millisecond+time.Microsecond, sums{"a": 8})
	x.check(t, []sumCase{
		{name: "all kept", at: 2999, scope: "m", bucket: s, n: 5, partial: true, want: sums{"a": 31}},
		{name: "first bucket gone at end+keep", at: 3000, scope: "m", bucket: s, n: 5, partial: true, want: sums{"a": 30}},
		// The third bucket ends at 3000 and is kept 1501ms, rounded up.
		{name: "sub-ms keep rounds up", at: 4500, scope: "m", bucket: s, n: 5, want: sums{"a": 30}},
		{name: "third gone", at: 4501, scope: "m", bucket: s, n: 5, want: sums{"a": 22}},
		{name: "longest keep holds", at: 5999, scope: "m", bucket: s, n: 6, want: sums{"a": 22}},
		{name: "all gone", at: 6000, scope: "m", bucket: s, n: 6, want: sums{}},
		{name: "a reader behind sees them again", at: 2999, scope: "m", bucket: s, n: 5, partial: true, want: sums{"a": 31}},
	})
	// A write far ahead may drop what only a reader behind would see;
	// readers are within a second of each other, so only its own buckets
	// are checked.
	x.add(100_000, "m", s, 0, sums{"b": 1})
	x.check(t, []sumCase{
		{name: "keep 0: the partial only", at: 100_999, scope: "m", bucket: s, n: 0, partial: true, want: sums{"b": 1}},
		{name: "keep 0: gone once whole", at: 101_000, scope: "m", bucket: s, n: 1, want: sums{}},
	})
}

func testMetersZero(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	x.add(0, "m", time.Second, time.Minute, sums{"z": 0, "a": 1})
	x.add(0, "m", time.Second, time.Minute, sums{"y": 0})
	x.add(0, "m", time.Second, time.Minute, nil)
	x.check(t, []sumCase{
		{name: "names with no counts are absent", at: 0, scope: "m", bucket: time.Second, n: 0, partial: true, want: sums{"a": 1}},
	})
}

func testMetersApart(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	x.add(500, "m", time.Second, time.Minute, sums{"a": 1})
	x.add(500, "m", 10*time.Second, time.Minute, sums{"a": 2})
	x.add(500, "m}:1000:0", time.Second, time.Minute, sums{"a": 4})
	x.add(500, "{m}", time.Second, time.Minute, sums{"a": 8})
	x.add(500, "m:1000", time.Second, time.Minute, sums{"a": 16})
	x.check(t, []sumCase{
		{name: "1s", at: 500, scope: "m", bucket: time.Second, partial: true, want: sums{"a": 1}},
		{name: "10s", at: 500, scope: "m", bucket: 10 * time.Second, partial: true, want: sums{"a": 2}},
		{name: "brace", at: 500, scope: "m}:1000:0", bucket: time.Second, partial: true, want: sums{"a": 4}},
		{name: "tag", at: 500, scope: "{m}", bucket: time.Second, partial: true, want: sums{"a": 8}},
		{name: "colon", at: 500, scope: "m:1000", bucket: time.Second, partial: true, want: sums{"a": 16}},
		{name: "other width", at: 500, scope: "m", bucket: 2 * time.Second, partial: true, want: sums{}},
	})
}

func testMetersBad(t *testing.T, m limit.Meters, e sharedEnv) {
	ctx := context.Background()
	now := e.at(0)
	good := e.scope("g")
	long := strings.Repeat("x", limit.MaxScopeBytes+1)
	manyNames := sums{}
	for i := range limit.MaxMeterNames + 1 {
		manyNames[fmt.Sprint("n", i)] = 1
	}
	adds := []struct {
		name   string
		scope  string
		bucket time.Duration
		keep   time.Duration
		counts sums
	}{
		{name: "EmptyScope", scope: "", bucket: time.Second, counts: sums{"a": 1}},
		{name: "LongScope", scope: long, bucket: time.Second, counts: sums{"a": 1}},
		{name: "ZeroBucket", scope: good, bucket: 0, counts: sums{"a": 1}},
		{name: "NegativeBucket", scope: good, bucket: -time.Second, counts: sums{"a": 1}},
		{name: "SubMillisecondBucket", scope: good, bucket: 1500 * time.Microsecond, counts: sums{"a": 1}},
		{name: "NegativeKeep", scope: good, bucket: time.Second, keep: -1, counts: sums{"a": 1}},
		{name: "EmptyName", scope: good, bucket: time.Second, counts: sums{"a": 1, "": 1}},
		{name: "LongName", scope: good, bucket: time.Second, counts: sums{"a": 1, strings.Repeat("n", limit.MaxMeterNameBytes+1): 1}},
		{name: "NegativeCount", scope: good, bucket: time.Second, counts: sums{"a": 1, "b": -1}},
		{name: "TooManyNames", scope: good, bucket: time.Second, counts: manyNames},
	}
	for _, tt := range adds {
		if err := m.Add(ctx, now, tt.scope, tt.bucket, tt.keep, tt.counts); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Add %s: error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	reads := []struct {
		name   string
		scope  string
		bucket time.Duration
		n      int
	}{
		{name: "EmptyScope", scope: "", bucket: time.Second, n: 1},
		{name: "LongScope", scope: long, bucket: time.Second, n: 1},
		{name: "ZeroBucket", scope: good, bucket: 0, n: 1},
		{name: "NegativeN", scope: good, bucket: time.Second, n: -1},
		{name: "TooManyBuckets", scope: good, bucket: time.Second, n: limit.MaxMeterBuckets + 1},
	}
	for _, tt := range reads {
		if _, err := m.Sum(ctx, now, tt.scope, tt.bucket, tt.n, true); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Sum %s: error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	x := meters{e, m}
	x.check(t, []sumCase{{name: "rejected adds changed nothing", at: 0, scope: "g", bucket: time.Second, n: 1, partial: true, want: sums{}}})
	// The caps themselves are allowed.
	delete(manyNames, "n0")
	delete(manyNames, "n1")
	manyNames[strings.Repeat("n", limit.MaxMeterNameBytes)] = 1
	x.add(0, "g", time.Second, time.Minute, manyNames)
	if got, err := m.Sum(ctx, now, good, time.Second, limit.MaxMeterBuckets, true); err != nil || len(got) != limit.MaxMeterNames {
		t.Errorf("Sum at the caps = %d names, %v; want %d", len(got), err, limit.MaxMeterNames)
	}
}

func testMetersConcurrent(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	const workers, adds = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*adds)
	for w := range workers {
		wg.Go(func() {
			for i := range adds {
				// Two buckets, 1000 and 1999 land in the same one.
				at := int64(1000 + 999*(i%2))
				if err := m.Add(context.Background(), e.at(at), e.scope("m"), time.Second, time.Minute, sums{"a": 1, fmt.Sprint("w", w): int64(i)}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := sums{"a": workers * adds}
	for w := range workers {
		want[fmt.Sprint("w", w)] = adds * (adds - 1) / 2
	}
	x.check(t, []sumCase{{name: "exact", at: 2000, scope: "m", bucket: time.Second, n: 1, want: want}})
}

// RunCells runs the limit.Cells conformance suite.
func RunCells(t *testing.T, newCells func(testing.TB) limit.Cells) {
	runSuite(t, newCells, 20, []suiteCase[limit.Cells]{
		{name: "Swap", run: testCellsSwap},
		{name: "Expiry", run: testCellsExpiry},
		{name: "KeysIndependent", run: testCellsKeys},
		{name: "Bad", run: testCellsBad},
		{name: "OneWinner", run: testCellsOneWinner},
		{name: "CounterByCAS", run: testCellsCounter},
	})
}

type cells struct {
	sharedEnv
	c limit.Cells
}

func (x cells) load(ms int64, key string) ([]byte, uint64) {
	x.tb.Helper()
	v, n, err := x.c.Load(context.Background(), x.at(ms), x.scope(key))
	if err != nil {
		x.tb.Fatalf("Load(%d, %q): %v", ms, key, err)
	}
	return v, n
}

func (x cells) swap(ms int64, key string, version uint64, value string, ttl time.Duration) (bool, uint64) {
	x.tb.Helper()
	ok, n, err := x.c.Swap(context.Background(), x.at(ms), x.scope(key), version, []byte(value), ttl)
	if err != nil {
		x.tb.Fatalf("Swap(%d, %q, %d, %q, %v): %v", ms, key, version, value, ttl, err)
	}
	return ok, n
}

// cellStep is a Load (op "load": want value and version) or a Swap (op
// "swap": want ok and version).
type cellStep struct {
	name    string
	at      int64
	op      string
	key     string
	version uint64
	value   string
	ttl     time.Duration
	wantOK  bool
	wantVal []byte
	wantVer uint64
}

func (x cells) run(t *testing.T, steps []cellStep) {
	t.Helper()
	for _, s := range steps {
		switch s.op {
		case "load":
			v, n := x.load(s.at, s.key)
			if string(v) != string(s.wantVal) || (v == nil) != (s.wantVal == nil) || n != s.wantVer {
				t.Fatalf("%s: Load(%d, %q) = %q (nil %v), %d; want %q (nil %v), %d", s.name, s.at, s.key, v, v == nil, n, s.wantVal, s.wantVal == nil, s.wantVer)
			}
		case "swap":
			ok, n := x.swap(s.at, s.key, s.version, s.value, s.ttl)
			if ok != s.wantOK || n != s.wantVer {
				t.Fatalf("%s: Swap(%d, %q, %d, %q) = %v, %d; want %v, %d", s.name, s.at, s.key, s.version, s.value, ok, n, s.wantOK, s.wantVer)
			}
		default:
			t.Fatalf("%s: unknown op %q", s.name, s.op)
		}
	}
}

func testCellsSwap(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	const ttl = time.Minute
	x.run(t, []cellStep{
		{name: "absent", at: 0, op: "load", key: "k"},
		{name: "absent, not version 0", at: 0, op: "swap", key: "k", version: 1, value: "x", ttl: ttl, wantVer: 0},
		{name: "create", at: 0, op: "swap", key: "k", version: 0, value: "x", ttl: ttl, wantOK: true, wantVer: 1},
		{name: "read", at: 1, op: "load", key: "k", wantVal: []byte("x"), wantVer: 1},
		{name: "create again loses", at: 2, op: "swap", key: "k", version: 0, value: "y", ttl: ttl, wantVer: 1},
		{name: "a future version loses", at: 2, op: "swap", key: "k", version: 2, value: "y", ttl: ttl, wantVer: 1},
		{name: "the current version wins", at: 3, op: "swap", key: "k", version: 1, value: "y", ttl: ttl, wantOK: true, wantVer: 2},
		{name: "the old version loses", at: 4, op: "swap", key: "k", version: 1, value: "z", ttl: ttl, wantVer: 2},
		{name: "the loser changed nothing", at: 5, op: "load", key: "k", wantVal: []byte("y"), wantVer: 2},
		{name: "empty value", at: 6, op: "swap", key: "k", version: 2, value: "", ttl: ttl, wantOK: true, wantVer: 3},
		{name: "empty value reads as empty, not absent", at: 7, op: "load", key: "k", wantVal: []byte{}, wantVer: 3},
		{name: "binary value", at: 8, op: "swap", key: "k", version: 3, value: "\x00\xff\n{}", ttl: ttl, wantOK: true, wantVer: 4},
		{name: "binary read", at: 9, op: "load", key: "k", wantVal: []byte("\x00\xff\n{}"), wantVer: 4},
	})
	// The value Load returns is the caller's to change.
	v, _ := x.load(10, "k")
	v[0] = 'X'
	if v2, _ := x.load(10, "k"); v2[0] != 0 {
		t.Errorf("changing a loaded value changed the cell: %q", v2)
	}
}

// testCellsExpiry: a cell is live until now+ttl; then it reads as absent
// and only version 0 swaps it. The version that swap gives is after the
// expired one, not 1 again: a writer still holding the expired version
// must not find it current by chance. (A store may forget an expired
// cell's version once it drops the cell; nothing here drops it: Redis
// keeps the key ttl plus a margin of real time, memstore until a sweep.)
func testCellsExpiry(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	x.run(t, []cellStep{
		{name: "create", at: 0, op: "swap", key: "k", version: 0, value: "x", ttl: 20 * time.Second, wantOK: true, wantVer: 1},
		{name: "renew", at: 1000, op: "swap", key: "k", version: 1, value: "x", ttl: 20 * time.Second, wantOK: true, wantVer: 2},
		{name: "live", at: 20_999, op: "load", key: "k", wantVal: []byte("x"), wantVer: 2},
		{name: "expired exactly at now+ttl", at: 21_000, op: "load", key: "k"},
		{name: "the expired version loses", at: 21_000, op: "swap", key: "k", version: 2, value: "y", ttl: time.Second, wantVer: 0},
		{name: "a reader behind still sees it", at: 20_000, op: "load", key: "k", wantVal: []byte("x"), wantVer: 2},
		{name: "version 0 wins, numbered after the expired", at: 21_000, op: "swap", key: "k", version: 0, value: "y", ttl: 1500*time.Millisecond + time.Microsecond, wantOK: true, wantVer: 3},
		// ttl rounds up to whole milliseconds: live until 22_501.
		{name: "rounded up", at: 22_500, op: "load", key: "k", wantVal: []byte("y"), wantVer: 3},
		{name: "rounded up, gone", at: 22_501, op: "load", key: "k"},
	})
}

func testCellsKeys(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	keys := []string{"k", "k:x", "{k}", "k}", "shed/gpt-4o"}
	for i, k := range keys {
		for v := range uint64(i + 1) {
			if ok, _ := x.swap(0, k, v, k, time.Minute); !ok {
				t.Fatalf("Swap(%q, %d) lost", k, v)
			}
		}
	}
	for i, k := range keys {
		if v, n := x.load(1, k); string(v) != k || n != uint64(i+1) {
			t.Errorf("Load(%q) = %q, %d; want %q, %d", k, v, n, k, i+1)
		}
	}
}

func testCellsBad(t *testing.T, c limit.Cells, e sharedEnv) {
	ctx := context.Background()
	now := e.at(0)
	good := e.scope("g")
	tests := []struct {
		name  string
		key   string
		value []byte
		ttl   time.Duration
	}{
		{name: "EmptyKey", key: "", value: []byte("x"), ttl: time.Second},
		{name: "LongKey", key: strings.Repeat("k", limit.MaxScopeBytes+1), value: []byte("x"), ttl: time.Second},
		{name: "LongValue", key: good, value: make([]byte, limit.MaxCellBytes+1), ttl: time.Second},
		{name: "ZeroTTL", key: good, value: []byte("x"), ttl: 0},
		{name: "SubMillisecondTTL", key: good, value: []byte("x"), ttl: time.Microsecond},
	}
	for _, tt := range tests {
		if _, _, err := c.Swap(ctx, now, tt.key, 0, tt.value, tt.ttl); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Swap %s: error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	for _, key := range []string{"", strings.Repeat("k", limit.MaxScopeBytes+1)} {
		if _, _, err := c.Load(ctx, now, key); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Load(%.20q): error = %v, want limit.ErrInvalid", key, err)
		}
	}
	x := cells{e, c}
	x.run(t, []cellStep{{name: "rejected swaps changed nothing", at: 0, op: "load", key: "g"}})
	big := strings.Repeat("v", limit.MaxCellBytes)
	x.run(t, []cellStep{
		{name: "the cap is allowed", at: 0, op: "swap", key: "g", value: big, ttl: time.Second, wantOK: true, wantVer: 1},
		{name: "read at the cap", at: 0, op: "load", key: "g", wantVal: []byte(big), wantVer: 1},
	})
}

// testCellsOneWinner: of N writers swapping the same version at once,
// exactly one wins, and every loser is told the winner's version.
func testCellsOneWinner(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	const writers = 16
	if ok, _ := x.swap(0, "k", 0, "start", time.Minute); !ok {
		t.Fatal("first Swap lost")
	}
	type result struct {
		ok  bool
		ver uint64
		val string
		err error
	}
	results := make([]result, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			<-start
			val := fmt.Sprint("w", w)
			ok, ver, err := c.Swap(context.Background(), e.at(1), e.scope("k"), 1, []byte(val), time.Minute)
			results[w] = result{ok, ver, val, err}
		})
	}
	close(start)
	wg.Wait()
	var winner string
	for _, r := range results {
		switch {
		case r.err != nil:
			t.Fatal(r.err)
		case r.ver != 2:
			t.Errorf("%s: Swap = %v, %d; want version 2", r.val, r.ok, r.ver)
		case r.ok && winner != "":
			t.Errorf("%s and %s both won", winner, r.val)
		case r.ok:
			winner = r.val
		}
	}
	if winner == "" {
		t.Fatal("no writer won")
	}
	x.run(t, []cellStep{{name: "the winner's value", at: 2, op: "load", key: "k", wantVal: []byte(winner), wantVer: 2}})
}

// testCellsCounter: writers increment a counter by load and swap,
// retrying on a lost swap; no increment is lost.
func testCellsCounter(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	const writers, incs = 8, 15
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			ctx, key, now := context.Background(), e.scope("n"), e.at(0)
			for range incs {
				// Bounded: each lost swap means another writer won.
				for try := 0; ; try++ {
					if try == writers*incs {
						errs <- errors.New("an increment lost every swap")
						return
					}
					v, ver, err := c.Load(ctx, now, key)
					if err != nil {
						errs <- err
						return
					}
					var n int
					if v != nil {
						if _, err := fmt.Sscan(string(v), &n); err != nil {
							errs <- err
							return
						}
					}
					ok, _, err := c.Swap(ctx, now, key, ver, []byte(fmt.Sprint(n+1)), time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	x.run(t, []cellStep{{name: "every increment", at: 0, op: "load", key: "n", wantVal: []byte(fmt.Sprint(writers * incs)), wantVer: writers * incs}})
}
