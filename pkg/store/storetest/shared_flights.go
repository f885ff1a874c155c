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

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

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
