// Package breakertest is the conformance suite every breaker.Store passes.
//
// The suite passes time explicitly (a fake instant per subtest), so it runs
// unchanged against a store whose state lives elsewhere, such as Redis.
// Every subtest uses its own breaker key, and "replicas": several Store
// values on one backend (for Redis, each with its own client), which must
// see each other's writes at once.
package breakertest

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
)

// base is the suite's time origin.
var base = time.UnixMilli(1_700_000_000_000)

// params: 3 failures within 10s open it for 5s; 2 probes, 2 successes to
// close, leases of 4s.
var params = breaker.Params{
	FailureThreshold: 3,
	Window:           10 * time.Second,
	OpenFor:          5 * time.Second,
	HalfOpenProbes:   2,
	CloseAfter:       2,
	ProbeLease:       4 * time.Second,
}

// Open returns n replicas sharing one fresh backend.
type Open func(tb testing.TB, n int) []breaker.Store

// Run runs the suite against the backends open makes.
func Run(t *testing.T, open Open) {
	t.Run("Transitions", func(t *testing.T) { t.Parallel(); testTransitions(t, open) })
	t.Run("WindowAgesOut", func(t *testing.T) { t.Parallel(); testWindow(t, open) })
	t.Run("ProbeFailureReopens", func(t *testing.T) { t.Parallel(); testProbeFailure(t, open) })
	t.Run("LostProbeFreesSlot", func(t *testing.T) { t.Parallel(); testLostProbe(t, open) })
	t.Run("ReleaseFreesSlot", func(t *testing.T) { t.Parallel(); testRelease(t, open) })
	t.Run("IgnoredOutcomes", func(t *testing.T) { t.Parallel(); testIgnored(t, open) })
	t.Run("ConcurrentProbes", func(t *testing.T) { t.Parallel(); testConcurrentProbes(t, open) })
	t.Run("OnlySlotHolders", func(t *testing.T) { t.Parallel(); testOnlySlotHolders(t, open) })
	t.Run("BadProbeID", func(t *testing.T) { t.Parallel(); testBadProbeID(t, open) })
	t.Run("FailureCountsOnce", func(t *testing.T) { t.Parallel(); testOnce(t, open) })
	t.Run("Expiry", func(t *testing.T) { t.Parallel(); testExpiry(t, open) })
	t.Run("RatedVolume", func(t *testing.T) { t.Parallel(); testRatedVolume(t, open) })
	t.Run("RatedRate", func(t *testing.T) { t.Parallel(); testRatedRate(t, open) })
	t.Run("RatedWindow", func(t *testing.T) { t.Parallel(); testRatedWindow(t, open) })
	t.Run("BatchOutsideClosed", func(t *testing.T) { t.Parallel(); testBatchOutsideClosed(t, open) })
	t.Run("BadBatch", func(t *testing.T) { t.Parallel(); testBadBatch(t, open) })
}

type env struct {
	tb  testing.TB
	rs  []breaker.Store
	key string
	p   breaker.Params
}

func newEnv(tb testing.TB, open Open, n int) *env {
	tb.Helper()
	return &env{tb: tb, rs: open(tb, n), key: breaker.StoreKey("model", tb.Name()), p: params}
}

func at(ms int64) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }

// allow asks replica r at t, with a fresh probe ID, which a probe's
// verdict must carry.
func (e *env) allow(r int, t int64) (breaker.Verdict, breaker.Transition) {
	e.tb.Helper()
	id := breaker.NewProbeID()
	v, tr, err := e.rs[r].Allow(context.Background(), at(t), e.key, e.p, id)
	if err != nil {
		e.tb.Fatalf("Allow at %d: %v", t, err)
	}
	if v.Probe && v.ProbeID != id {
		e.tb.Errorf("Allow at %d: probe ID %q, want the caller's %q", t, v.ProbeID, id)
	}
	if !v.Probe && v.ProbeID != "" {
		e.tb.Errorf("Allow at %d: probe ID %q without a probe", t, v.ProbeID)
	}
	return v, tr
}

func (e *env) record(r int, t int64, success bool, id string) breaker.Transition {
	e.tb.Helper()
	tr, err := e.rs[r].Record(context.Background(), at(t), e.key, e.p, breaker.Report{Success: success, ProbeID: id})
	if err != nil {
		e.tb.Fatalf("Record at %d: %v", t, err)
	}
	return tr
}

func (e *env) state(r int, t int64) breaker.Status {
	e.tb.Helper()
	st, err := e.rs[r].State(context.Background(), at(t), e.key, e.p)
	if err != nil {
		e.tb.Fatalf("State at %d: %v", t, err)
	}
	return st
}

func tr(from, to breaker.State) breaker.Transition { return breaker.Transition{From: from, To: to} }

func (e *env) wantVerdict(what string, got breaker.Verdict, want breaker.Verdict) {
	e.tb.Helper()
	if want.Probe && got.ProbeID == "" {
		e.tb.Errorf("%s: probe without an ID", what)
	}
	got.ProbeID, want.ProbeID = "", ""
	if got != want {
		e.tb.Errorf("%s = %+v, want %+v", what, got, want)
	}
}

func (e *env) wantTransition(what string, got, want breaker.Transition) {
	e.tb.Helper()
	if got != want {
		e.tb.Errorf("%s: transition %v -> %v, want %v -> %v", what, got.From, got.To, want.From, want.To)
	}
}

func (e *env) wantStatus(what string, got, want breaker.Status) {
	e.tb.Helper()
	if !got.OpenUntil.Equal(want.OpenUntil) || got.State != want.State || got.Failures != want.Failures ||
		got.Probes != want.Probes || got.Successes != want.Successes || got.Volume != want.Volume {
		e.tb.Errorf("%s = %+v, want %+v", what, got, want)
	}
}

const (
	closed = breaker.Closed
	half   = breaker.HalfOpen
	opn    = breaker.Open
)

// testTransitions walks closed -> open -> half-open -> closed, each step
// taken on one replica and seen by the others at once.
func testTransitions(t *testing.T, open Open) {
	e := newEnv(t, open, 3)
	v, trn := e.allow(0, 0)
	e.wantVerdict("fresh allow", v, breaker.Verdict{Allowed: true, State: closed})
	e.wantTransition("fresh allow", trn, tr(closed, closed))
	e.wantStatus("fresh state", e.state(1, 0), breaker.Status{State: closed})

	e.wantTransition("failure 1", e.record(0, 1000, false, ""), tr(closed, closed))
	e.wantTransition("success", e.record(1, 1500, true, ""), tr(closed, closed))
	e.wantTransition("failure 2", e.record(1, 2000, false, ""), tr(closed, closed))
	e.wantStatus("two failures", e.state(2, 2000), breaker.Status{State: closed, Failures: 2})
	v, _ = e.allow(2, 2500)
	e.wantVerdict("allow after two failures", v, breaker.Verdict{Allowed: true, State: closed})

	e.wantTransition("failure 3", e.record(2, 3000, false, ""), tr(closed, opn))
	// Replicas 0 and 1 see it open at their next decision.
	v, trn = e.allow(0, 3000)
	e.wantVerdict("allow on A when open", v, breaker.Verdict{State: opn, RetryAfter: 5 * time.Second})
	e.wantTransition("allow on A when open", trn, tr(opn, opn))
	v, _ = e.allow(1, 7999)
	e.wantVerdict("allow on B just before half-open", v, breaker.Verdict{State: opn, RetryAfter: time.Millisecond})
	e.wantStatus("open state", e.state(2, 4000), breaker.Status{State: opn, OpenUntil: at(8000)})
	e.wantStatus("state after the open period, before any allow", e.state(2, 8000), breaker.Status{State: half})

	// Half-open: two probes cluster-wide, the third is told when the first
	// lease ends.
	p1, trn := e.allow(1, 8000)
	e.wantVerdict("probe 1", p1, breaker.Verdict{Allowed: true, Probe: true, State: half})
	e.wantTransition("probe 1", trn, tr(opn, half))
	p2, trn := e.allow(2, 8500)
	e.wantVerdict("probe 2", p2, breaker.Verdict{Allowed: true, Probe: true, State: half})
	e.wantTransition("probe 2", trn, tr(half, half))
	if p1.ProbeID == p2.ProbeID {
		t.Errorf("probes share the ID %q", p1.ProbeID)
	}
	v, _ = e.allow(0, 9000)
	e.wantVerdict("third request while half-open", v, breaker.Verdict{State: half, RetryAfter: 3 * time.Second})
	e.wantStatus("half-open state", e.state(0, 9000), breaker.Status{State: half, Probes: 2})

	e.wantTransition("probe 1 succeeds", e.record(0, 9100, true, p1.ProbeID), tr(half, half))
	e.wantTransition("probe 1 reported twice", e.record(1, 9150, true, p1.ProbeID), tr(half, half))
	e.wantStatus("one success", e.state(0, 9200), breaker.Status{State: half, Probes: 1, Successes: 1})
	// The success freed its slot.
	p3, _ := e.allow(0, 9300)
	e.wantVerdict("probe 3", p3, breaker.Verdict{Allowed: true, Probe: true, State: half})
	e.wantTransition("probe 2 succeeds", e.record(2, 9400, true, p2.ProbeID), tr(half, closed))
	e.wantStatus("closed again", e.state(1, 9400), breaker.Status{State: closed})
	v, _ = e.allow(1, 9500)
	e.wantVerdict("allow after closing", v, breaker.Verdict{Allowed: true, State: closed})
	// The failures before opening are forgotten; a probe's late failure
	// counts as any failure.
	e.wantTransition("late probe failure", e.record(0, 9600, false, p3.ProbeID), tr(closed, closed))
	e.wantStatus("one failure", e.state(1, 9600), breaker.Status{State: closed, Failures: 1})
}

// testWindow: a failure counts while now - t < Window.
func testWindow(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	e.record(0, 0, false, "")
	e.record(1, 5000, false, "")
	e.wantTransition("third failure as the first leaves the window", e.record(0, 10000, false, ""), tr(closed, closed))
	e.wantStatus("two counted", e.state(1, 10000), breaker.Status{State: closed, Failures: 2})
	e.wantStatus("one counted", e.state(1, 15000), breaker.Status{State: closed, Failures: 1})
	e.wantTransition("third failure within the window", e.record(1, 14999, false, ""), tr(closed, opn))
}

func (e *env) openAt(t int64) {
	e.tb.Helper()
	for i := range e.p.FailureThreshold {
		e.record(int(i)%len(e.rs), t, false, "")
	}
	if st := e.state(0, t); st.State != opn {
		e.tb.Fatalf("after %d failures: %+v", e.p.FailureThreshold, st)
	}
}

// testProbeFailure: any probe failure opens it again for OpenFor; the old
// period's probes then move nothing.
func testProbeFailure(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	e.openAt(0)
	p1, _ := e.allow(0, 5000)
	p2, _ := e.allow(1, 5000)
	e.record(0, 5500, true, p1.ProbeID)
	e.wantTransition("probe 2 fails", e.record(1, 6000, false, p2.ProbeID), tr(half, opn))
	v, _ := e.allow(0, 6000)
	e.wantVerdict("allow after reopening", v, breaker.Verdict{State: opn, RetryAfter: 5 * time.Second})
	e.wantTransition("old probe failure while open", e.record(0, 6100, false, p1.ProbeID), tr(opn, opn))
	q1, trn := e.allow(1, 11000)
	e.wantTransition("half-open again", trn, tr(opn, half))
	if q1.ProbeID == p1.ProbeID || q1.ProbeID == p2.ProbeID {
		t.Errorf("a new period reused probe ID %q", q1.ProbeID)
	}
	e.wantTransition("old probe failure while half-open", e.record(0, 11100, false, p2.ProbeID), tr(half, half))
	e.wantTransition("old probe success while half-open", e.record(0, 11100, true, p1.ProbeID), tr(half, half))
	e.wantStatus("unmoved", e.state(0, 11100), breaker.Status{State: half, Probes: 1})
}

// testLostProbe: a probe without an outcome holds its slot for its lease.
func testLostProbe(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	e.p.HalfOpenProbes, e.p.CloseAfter = 1, 1
	e.openAt(0)
	p1, _ := e.allow(0, 5000)
	v, _ := e.allow(1, 8999)
	e.wantVerdict("slot held", v, breaker.Verdict{State: half, RetryAfter: time.Millisecond})
	p2, _ := e.allow(1, 9000)
	e.wantVerdict("slot freed by the lease", p2, breaker.Verdict{Allowed: true, Probe: true, State: half})
	e.wantTransition("the lost probe's late success", e.record(0, 9100, true, p1.ProbeID), tr(half, half))
	e.wantTransition("the new probe's success", e.record(1, 9200, true, p2.ProbeID), tr(half, closed))

	// A lost probe's late failure does not reopen either: its slot is
	// gone, and nothing tells it from a forged report of an old ID.
	e.openAt(20000)
	q1, _ := e.allow(0, 25000)
	e.wantTransition("the lost probe's failure as its lease ends", e.record(1, 29000, false, q1.ProbeID), tr(half, half))
	q2, _ := e.allow(0, 29000)
	if !q2.Probe {
		t.Fatalf("no probe after the lease: %+v", q2)
	}
	e.wantTransition("the lost probe's late failure", e.record(1, 29500, false, q1.ProbeID), tr(half, half))
	e.wantStatus("unmoved by the lost probe", e.state(0, 29500), breaker.Status{State: half, Probes: 1})
	e.wantTransition("the live probe's failure", e.record(1, 29600, false, q2.ProbeID), tr(half, opn))
}

// testRelease: a released probe frees its slot at once on every replica
// and counts no outcome; a release of an unknown probe, or while closed
// or open, changes nothing.
func testRelease(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	e.p.HalfOpenProbes, e.p.CloseAfter = 1, 1
	e.release(0, 10, breaker.NewProbeID())
	e.wantStatus("closed, released", e.state(0, 20), breaker.Status{State: closed})
	e.openAt(0)
	e.release(0, 100, breaker.NewProbeID())
	e.wantStatus("open, released", e.state(0, 200), breaker.Status{State: opn, OpenUntil: at(5000)})
	p1, _ := e.allow(0, 5000)
	e.wantVerdict("probe", p1, breaker.Verdict{Allowed: true, Probe: true, State: half})
	e.release(1, 5100, breaker.NewProbeID())
	e.release(1, 5100, "")
	v, _ := e.allow(1, 5200)
	e.wantVerdict("slot still held", v, breaker.Verdict{State: half, RetryAfter: 3800 * time.Millisecond})
	e.release(1, 5300, p1.ProbeID)
	e.wantStatus("released: no probe, no success", e.state(0, 5400), breaker.Status{State: half})
	p2, _ := e.allow(1, 5500)
	e.wantVerdict("slot free again", p2, breaker.Verdict{Allowed: true, Probe: true, State: half})
	e.wantTransition("the released probe's success counts nothing", e.record(0, 5600, true, p1.ProbeID), tr(half, half))
	e.wantTransition("the new probe's success closes", e.record(0, 5700, true, p2.ProbeID), tr(half, closed))
}

func (e *env) release(r int, t int64, id string) {
	e.tb.Helper()
	if err := e.rs[r].Release(context.Background(), at(t), e.key, e.p, id); err != nil {
		e.tb.Fatalf("replica %d: release at %d: %v", r, t, err)
	}
}

// testIgnored: outcomes without a probe ID while half-open, and every
// outcome while open, move nothing; successes do not reset the count.
func testIgnored(t *testing.T, open Open) {
	e := newEnv(t, open, 1)
	e.record(0, 0, false, "")
	e.record(0, 10, true, "")
	e.wantStatus("a success keeps failures", e.state(0, 20), breaker.Status{State: closed, Failures: 1})
	e.openAt(100)
	e.wantTransition("failure while open", e.record(0, 200, false, ""), tr(opn, opn))
	e.wantTransition("failure after the open period, before any allow", e.record(0, 5100, false, ""), tr(opn, opn))
	e.allow(0, 5100)
	e.wantTransition("failure without a probe ID", e.record(0, 5200, false, ""), tr(half, half))
	e.wantTransition("failure with a bad probe ID", e.record(0, 5200, false, "x"), tr(half, half))
	e.wantStatus("still half-open", e.state(0, 5300), breaker.Status{State: half, Probes: 1})
}

// testConcurrentProbes: replicas racing for probes get exactly
// HalfOpenProbes of them.
func testConcurrentProbes(t *testing.T, open Open) {
	const replicas, each = 8, 10
	e := newEnv(t, open, replicas)
	e.p.HalfOpenProbes, e.p.CloseAfter = 3, 3
	e.openAt(0)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[string]bool{}
		bad []breaker.Verdict
	)
	for r := range replicas {
		wg.Go(func() {
			for range each {
				v, _, err := e.rs[r].Allow(context.Background(), at(6000), e.key, e.p, breaker.NewProbeID())
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				mu.Lock()
				switch {
				case v.Allowed && v.Probe && !ids[v.ProbeID]:
					ids[v.ProbeID] = true
				case v.Allowed:
					bad = append(bad, v)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(ids) != 3 || len(bad) > 0 {
		t.Fatalf("%d distinct probes admitted (want 3), %d bad verdicts: %+v", len(ids), len(bad), bad)
	}
	n := 0
	for id := range ids {
		n++
		want := tr(half, half)
		if n == 3 {
			want = tr(half, closed)
		}
		e.wantTransition("probe success", e.record(n%replicas, 6500, true, id), want)
	}
}

// testOnlySlotHolders: while half-open, reports whose probe ID holds no
// slot (none, guessed in the old "<opened-at>.<n>" form or at random, or
// the right ID with another case) neither close, reopen nor free
// anything, on any replica; the slot holders' reports still work.
func testOnlySlotHolders(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	e.openAt(0)
	p1, _ := e.allow(0, 5000)
	p2, _ := e.allow(1, 5000)
	opened := strconv.FormatInt(at(0).UnixMilli(), 10)
	guesses := []string{"", "x", opened + ".1", opened + ".2", opened + ".3", "0.1", breaker.NewProbeID(), strings.ToUpper(p1.ProbeID), p1.ProbeID + "0"}
	for _, g := range guesses {
		for r := range e.rs {
			e.wantTransition("guessed success "+g, e.record(r, 5100, true, g), tr(half, half))
			e.wantTransition("guessed failure "+g, e.record(r, 5100, false, g), tr(half, half))
			e.release(r, 5100, g)
		}
	}
	e.wantStatus("both slots held, no success", e.state(0, 5200), breaker.Status{State: half, Probes: 2})
	v, _ := e.allow(0, 5200)
	e.wantVerdict("third request", v, breaker.Verdict{State: half, RetryAfter: 3800 * time.Millisecond})
	e.wantTransition("probe 1 succeeds on the other replica", e.record(1, 5300, true, p1.ProbeID), tr(half, half))
	e.wantTransition("probe 2 succeeds", e.record(0, 5400, true, p2.ProbeID), tr(half, closed))
}

// testBadProbeID: Allow refuses a probe ID a store could not keep.
func testBadProbeID(t *testing.T, open Open) {
	e := newEnv(t, open, 1)
	e.openAt(0)
	for _, id := range []string{"", "a=1", "a,b", "zz", strings.Repeat("a", breaker.MaxProbeIDBytes+1)} {
		if _, _, err := e.rs[0].Allow(context.Background(), at(5000), e.key, e.p, id); err == nil {
			t.Errorf("Allow with probe ID %q: no error", id)
		}
	}
	e.wantStatus("no slot taken", e.state(0, 5000), breaker.Status{State: half})
}

func (e *env) report(r int, t int64, rep breaker.Report) breaker.Transition {
	e.tb.Helper()
	tr, err := e.rs[r].Record(context.Background(), at(t), e.key, e.p, rep)
	if err != nil {
		e.tb.Fatalf("Record %+v at %d: %v", rep, t, err)
	}
	return tr
}

// testOnce: a failure with a once ID counts once per breaker on every
// replica, whatever the state it first arrives in, for OnceTTL;
// failures without one, or with another, count as before; successes are
// not guarded; a marker is per breaker.
func testOnce(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	fail := func(once string) breaker.Report { return breaker.Report{Once: once} }
	e.wantTransition("t1", e.report(0, 0, fail("t1")), tr(closed, closed))
	e.wantTransition("t1 again", e.report(0, 10, fail("t1")), tr(closed, closed))
	e.wantTransition("t1 on another replica", e.report(1, 20, fail("t1")), tr(closed, closed))
	e.wantStatus("t1 counted once", e.state(0, 30), breaker.Status{State: closed, Failures: 1})
	e.wantTransition("t1 as a success", e.report(1, 40, breaker.Report{Success: true, Once: "t1"}), tr(closed, closed))
	e.wantTransition("no once", e.report(1, 50, breaker.Report{}), tr(closed, closed))
	e.wantStatus("without once", e.state(0, 60), breaker.Status{State: closed, Failures: 2})

	other := &env{tb: e.tb, rs: e.rs, key: breaker.StoreKey("model", t.Name()+"/other"), p: e.p}
	other.wantTransition("t1 on another breaker", other.report(0, 70, fail("t1")), tr(closed, closed))
	other.wantStatus("counted there", other.state(0, 70), breaker.Status{State: closed, Failures: 1})

	e.wantTransition("t2 opens", e.report(0, 100, fail("t2")), tr(closed, opn))
	e.wantTransition("t3 while open", e.report(1, 200, fail("t3")), tr(opn, opn))
	p1, _ := e.allow(0, 5100)
	e.wantTransition("probe closes", e.report(1, 5200, breaker.Report{Success: true, ProbeID: p1.ProbeID}), tr(half, half))
	p2, _ := e.allow(0, 5300)
	e.wantTransition("probe closes", e.report(1, 5400, breaker.Report{Success: true, ProbeID: p2.ProbeID}), tr(half, closed))
	for _, id := range []string{"t1", "t2", "t3"} {
		e.wantTransition(id+" replayed once closed", e.report(0, 5500, fail(id)), tr(closed, closed))
	}
	e.wantStatus("replays counted nothing", e.state(0, 5600), breaker.Status{State: closed})

	// A probe's failure with a once ID: the first reopens, a replay in
	// the next half-open period moves nothing (its slot is gone too).
	e.openAt(6000)
	q, _ := e.allow(1, 11000)
	e.wantTransition("probe fails", e.report(0, 11100, breaker.Report{ProbeID: q.ProbeID, Once: "t4"}), tr(half, opn))
	e.allow(1, 16100)
	e.wantTransition("probe failure replayed", e.report(0, 16200, breaker.Report{ProbeID: q.ProbeID, Once: "t4"}), tr(half, half))

	// Markers last OnceTTL: past it, a delivery counts again (by then
	// the ticket it came with has expired).
	ttl := breaker.OnceTTL(e.p).Milliseconds()
	late := &env{tb: e.tb, rs: e.rs, key: breaker.StoreKey("model", t.Name()+"/late"), p: e.p}
	late.report(0, 0, fail("t5"))
	late.wantTransition("t5 just before its TTL", late.report(1, ttl-1, fail("t5")), tr(closed, closed))
	late.wantStatus("not counted", late.state(0, ttl-1), breaker.Status{State: closed})
	late.wantTransition("t5 past its TTL", late.report(1, ttl+2000, fail("t5")), tr(closed, closed))
	late.wantStatus("counted again", late.state(0, ttl+2000), breaker.Status{State: closed, Failures: 1})

	if _, err := e.rs[0].Record(context.Background(), at(20000), e.key, e.p,
		breaker.Report{Once: strings.Repeat("x", breaker.MaxOnceBytes+1)}); err == nil {
		t.Error("a once ID over MaxOnceBytes was taken")
	}
}

// testExpiry: state lives as long as it matters, and a quiet open
// breaker is forgotten Retain after its period.
func testExpiry(t *testing.T, open Open) {
	e := newEnv(t, open, 1)
	e.record(0, 0, false, "")
	e.wantStatus("failure counted", e.state(0, 9999), breaker.Status{State: closed, Failures: 1})
	e.wantStatus("failure aged out", e.state(0, 10000), breaker.Status{State: closed})
	e.openAt(20000)
	r := breaker.Retain.Milliseconds()
	e.wantStatus("kept through Retain", e.state(0, 25000+r-1), breaker.Status{State: half})
	e.allow(0, 25000+r-1)
	// The allow wrote a probe with a lease: Retain counts from its end.
	e.wantStatus("kept past the probe's lease", e.state(0, 29000+r-1), breaker.Status{State: half})
}

// rated: 3 failures at least, half of the outcomes at least, and 10
// outcomes at least within 10s (buckets of 1s) open it.
func rated(e *env) {
	e.p.FailureRate, e.p.MinRequests = 0.5, 10
}

// batch reports n successes at t on replica r.
func (e *env) batch(r int, t int64, n uint64) breaker.Transition {
	e.tb.Helper()
	return e.report(r, t, breaker.Report{Successes: n})
}

// testRatedVolume: failures alone, however many and however high their
// rate, do not open a rated breaker under MinRequests outcomes; successes
// from batches on any replica make up the volume, and the failure that
// brings all three conditions opens it (a rate exactly at FailureRate
// counts).
func testRatedVolume(t *testing.T, open Open) {
	e := newEnv(t, open, 3)
	rated(e)
	for i := range int64(5) {
		e.wantTransition("failure under the volume", e.record(int(i)%3, i*100, false, ""), tr(closed, closed))
	}
	e.wantStatus("5 failures, volume 5", e.state(0, 500), breaker.Status{State: closed, Failures: 5, Volume: 5})
	e.wantTransition("a batch of 4", e.batch(1, 600, 4), tr(closed, closed))
	e.wantTransition("a batch of 1", e.batch(2, 700, 1), tr(closed, closed))
	e.wantStatus("volume 10 after the batches", e.state(0, 800), breaker.Status{State: closed, Failures: 5, Volume: 10})
	// 5 failures of 10 already meet every condition, but only a failure
	// opens: a batch never does.
	e.wantTransition("a success", e.record(0, 900, true, ""), tr(closed, closed))
	e.wantTransition("failure 6 of 12: rate exactly 0.5", e.record(1, 1000, false, ""), tr(closed, opn))
	v, _ := e.allow(2, 1000)
	e.wantVerdict("open for every replica", v, breaker.Verdict{State: opn, RetryAfter: 5 * time.Second})
}

// testRatedRate: a busy upstream with a few failures among many
// successes stays closed however many failures pass the threshold; the
// rate, not the count, decides.
func testRatedRate(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	rated(e)
	e.batch(0, 0, 100)
	for i := range int64(20) {
		e.wantTransition("failure among many successes", e.record(int(i)%2, 100+i, false, ""), tr(closed, closed))
	}
	e.wantStatus("20 of 120", e.state(1, 200), breaker.Status{State: closed, Failures: 20, Volume: 120})
	// Without a rate, the same 20 failures would have opened it at 3.
	plain := &env{tb: e.tb, rs: e.rs, key: breaker.StoreKey("model", t.Name()+"/plain"), p: params}
	plain.batch(0, 0, 100)
	plain.record(0, 100, false, "")
	plain.record(1, 101, false, "")
	plain.wantTransition("the third failure, unrated", plain.record(0, 102, false, ""), tr(closed, opn))
	// Successes stop; failures keep coming: at 100 of 200 it opens.
	for i := range int64(79) {
		e.record(int(i)%2, 300+i, false, "")
	}
	e.wantStatus("99 of 199", e.state(0, 500), breaker.Status{State: closed, Failures: 99, Volume: 199})
	e.wantTransition("100 of 200", e.record(0, 600, false, ""), tr(closed, opn))
}

// testRatedWindow: a rated breaker's outcomes count while their bucket
// (Window/10 wide) is one of the last ten: a failure at 0 counts until
// 10000, and one at 999 (the same bucket) also until 10000.
func testRatedWindow(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	rated(e)
	e.record(0, 0, false, "")
	e.record(1, 999, false, "")
	e.batch(0, 1000, 5)
	e.wantStatus("all counted", e.state(0, 9999), breaker.Status{State: closed, Failures: 2, Volume: 7})
	e.wantStatus("the first bucket aged out", e.state(1, 10000), breaker.Status{State: closed, Volume: 5})
	e.wantStatus("all aged out", e.state(1, 11000), breaker.Status{State: closed})
	// Fresh counts after the window: old failures do not help open it.
	for i := range int64(4) {
		e.record(int(i)%2, 20000+i, false, "")
	}
	e.batch(1, 20010, 5)
	e.wantStatus("new counts only", e.state(0, 20020), breaker.Status{State: closed, Failures: 4, Volume: 9})
	e.wantTransition("the tenth outcome opens", e.record(0, 20030, false, ""), tr(closed, opn))
}

// testBatchOutsideClosed: a batch of successes while open or half-open,
// or on an unrated breaker, changes nothing: only probes move a
// half-open breaker, and only a rated one counts successes.
func testBatchOutsideClosed(t *testing.T, open Open) {
	e := newEnv(t, open, 2)
	rated(e)
	for i := range int64(10) {
		e.record(int(i)%2, i, false, "")
	}
	e.wantStatus("opened by 10 failures", e.state(0, 10), breaker.Status{State: opn, OpenUntil: at(5009)})
	e.wantTransition("batch while open", e.batch(1, 100, 1000), tr(opn, opn))
	p1, _ := e.allow(0, 5009)
	e.wantTransition("batch while half-open", e.batch(1, 5100, 1000), tr(half, half))
	e.wantStatus("unmoved", e.state(0, 5200), breaker.Status{State: half, Probes: 1})
	e.record(0, 5300, true, p1.ProbeID)
	p2, _ := e.allow(0, 5400)
	e.wantTransition("the second probe closes", e.record(1, 5500, true, p2.ProbeID), tr(half, closed))
	e.wantStatus("closed, counts forgotten", e.state(0, 5500), breaker.Status{State: closed})

	plain := &env{tb: e.tb, rs: e.rs, key: breaker.StoreKey("model", t.Name()+"/plain"), p: params}
	plain.wantTransition("batch, unrated", plain.batch(0, 0, 1000), tr(closed, closed))
	plain.wantStatus("nothing counted", plain.state(1, 0), breaker.Status{State: closed})
}

// testBadBatch: a batch that also carries an outcome, a probe or a once
// ID is refused.
func testBadBatch(t *testing.T, open Open) {
	e := newEnv(t, open, 1)
	rated(e)
	for _, r := range []breaker.Report{
		{Successes: 1, Success: true},
		{Successes: 1, ProbeID: breaker.NewProbeID()},
		{Successes: 1, Once: "t1"},
		{Successes: breaker.MaxBatch + 1},
	} {
		if _, err := e.rs[0].Record(context.Background(), at(0), e.key, e.p, r); err == nil {
			t.Errorf("Record(%+v): no error", r)
		}
	}
	e.wantStatus("nothing counted", e.state(0, 0), breaker.Status{State: closed})
}
