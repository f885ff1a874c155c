package storetest

import (
	"testing"
	"time"
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
