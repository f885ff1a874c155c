package pressure

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

const stepInterval = time.Second

// settable is a Signal the test sets.
type settable struct{ bits atomic.Uint64 }

func (s *settable) set(v float64)           { s.bits.Store(math.Float64bits(v)) }
func (s *settable) Score(time.Time) float64 { return math.Float64frombits(s.bits.Load()) }

// stepCluster is replicas' Combiners on one Board and one store of Cells
// (or none), stepped on one fake clock.
type stepCluster struct {
	clock  *storetest.FakeClock
	board  limit.Board
	s      *sharedStores
	shared bool
	sig    []*settable
	cs     []*Combiner
	errs   atomic.Int64
}

func newStepCluster(tb testing.TB, n int, shared bool) *stepCluster {
	tb.Helper()
	cl := &stepCluster{clock: storetest.NewFakeClock(t0), board: memstore.NewBoard(), s: newShared(), shared: shared}
	for range n {
		cl.add(tb)
	}
	return cl
}

// add starts another replica, at pressure 0.
func (cl *stepCluster) add(tb testing.TB) *Combiner {
	tb.Helper()
	e, err := NewEvaluator(designPolicy(), cl.clock)
	if err != nil {
		tb.Fatal(err)
	}
	sig := &settable{}
	cfg := CombinerConfig{
		Board: cl.board, Replica: fmt.Sprintf("r%d", len(cl.cs)), TTL: 3 * stepInterval, Clock: cl.clock,
		Scopes:  []Scope{{Name: "global", Local: sig, Evaluator: e}},
		OnError: func(string, error) { cl.errs.Add(1) },
	}
	if cl.shared {
		cfg.Cells, cfg.Domain, cfg.Interval = cl.s, "inference", stepInterval
	}
	c, err := NewCombiner(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	cl.sig = append(cl.sig, sig)
	cl.cs = append(cl.cs, c)
	return c
}

// round ticks every replica once, a millisecond apart starting with
// replica first, and moves the clock to the next interval. The first to
// tick finds the last state an interval old, so it computes and the
// others adopt; rotating first makes each replica compute in turn.
func (cl *stepCluster) round(ctx context.Context, first int) {
	n := len(cl.cs)
	for k := range n {
		cl.cs[(first+k)%n].Tick(ctx)
		cl.clock.Advance(time.Millisecond)
	}
	cl.clock.Advance(stepInterval - time.Duration(n)*time.Millisecond)
}

// step is what replica i holds: its step state and outcome level.
func (cl *stepCluster) step(i int) (StepState, int) {
	s := cl.cs[i].Snapshot()[0]
	return s.Step, s.Outcome.Level
}

// disagree reports how the replicas' steps differ, "" when they agree
// on the step and its hold.
func (cl *stepCluster) disagree() string {
	want, wantLevel := cl.step(0)
	var out []string
	for i := 1; i < len(cl.cs); i++ {
		got, level := cl.step(i)
		if got.Level != want.Level || !got.Since.Equal(want.Since) || level != wantLevel {
			out = append(out, fmt.Sprintf("r%d at level %d since %v, r0 at %d since %v", i, got.Level, got.Since.Sub(t0), want.Level, want.Since.Sub(t0)))
		}
	}
	return strings.Join(out, "; ")
}

// TestStepsReplicasAgree drives three replicas with noisy local scores
// through a spike: with Cells they hold one step and one hold at the end
// of every round; each replica evaluating alone (no Cells) disagrees,
// which shows the check can see it.
func TestStepsReplicasAgree(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      bool // shared through Cells
		wantAgree bool
	}{
		{name: "Shared", give: true, wantAgree: true},
		{name: "PerReplica", give: false, wantAgree: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cl := newStepCluster(t, 3, tt.give)
			rng := rand.New(rand.NewPCG(13, 13))
			disagreed, changes := 0, 0
			by := map[string]bool{}
			prevLevel := -1
			for r := range 120 {
				base := 0.5
				if r >= 20 && r < 70 {
					base = 0.85 // the spike: around the 0.8 and 0.9 steps
				}
				for _, s := range cl.sig {
					s.set(base + 0.12*(rng.Float64()-0.5))
				}
				cl.round(ctx, r%3)
				if d := cl.disagree(); d != "" {
					disagreed++
					if tt.wantAgree {
						t.Errorf("round %d: %s", r, d)
					}
				}
				st, level := cl.step(0)
				by[st.By] = true
				if level != prevLevel {
					changes++
					prevLevel = level
				}
			}
			if changes < 2 {
				t.Errorf("the level changed %d times: the spike did not exercise the steps", changes)
			}
			if !tt.wantAgree {
				if disagreed == 0 {
					t.Error("replicas evaluating alone never disagreed: the scenario cannot tell sharing from not")
				}
				return
			}
			if len(by) != 3 {
				t.Errorf("states computed by %v, want each of the 3 replicas in turn", by)
			}
			for i, c := range cl.cs {
				if n := c.cfg.Scopes[0].Evaluator.Fallbacks(); n != 0 {
					t.Errorf("r%d fell back %d times with the store up", i, n)
				}
			}
			if n := cl.errs.Load(); n != 0 {
				t.Errorf("%d store errors with the store up", n)
			}
		})
	}
}

// TestStepsLateReplicaAdoptsHold: a replica that starts while the
// cluster holds a step takes that step and the hold's start, and leaves
// it with the others, whether it ticks first (computes from the cell) or
// last (adopts the record).
func TestStepsLateReplicaAdoptsHold(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give int // the late replica's place in the round
	}{
		{name: "TicksFirst", give: 0},
		{name: "TicksLast", give: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cl := newStepCluster(t, 2, true)
			hold := designPolicy().Hold
			for _, s := range cl.sig {
				s.set(0.95)
			}
			cl.round(ctx, 0)
			entered, _ := cl.step(0)
			if entered.Level != 2 {
				t.Fatalf("at 0.95: level %d, want 2", entered.Level)
			}
			for range 4 {
				cl.round(ctx, 0)
			}
			late := cl.add(t) // 5s into the hold, at pressure 0
			late.cfg.Scopes[0].Local.(*settable).set(0.95)
			// first is the replica that ticks first: the late one (r2) at
			// place 0, else r0, leaving r2 last.
			first := 0
			if tt.give == 0 {
				first = 2
			}
			cl.round(ctx, first)
			got, level := cl.step(2)
			if got.Level != 2 || level != 2 || !got.Since.Equal(entered.Since) {
				t.Fatalf("late replica: level %d (outcome %d) since %v, want the cluster's 2 since %v",
					got.Level, level, got.Since.Sub(t0), entered.Since.Sub(t0))
			}
			if d := cl.disagree(); d != "" {
				t.Fatalf("after the late replica's first round: %s", d)
			}
			// The score falls below every step: all leave together when
			// the cluster's hold ends, not the late replica's own.
			for _, s := range cl.sig {
				s.set(0.5)
			}
			for cl.clock.Now().Before(entered.Since.Add(hold)) {
				cl.round(ctx, first)
				if _, level := cl.step(2); level != 2 {
					t.Fatalf("at %v, within the hold, the late replica is at level %d", cl.clock.Now().Sub(t0), level)
				}
			}
			cl.round(ctx, first)
			for i := range cl.cs {
				if _, level := cl.step(i); level != -1 {
					t.Errorf("r%d at level %d once the hold from %v ended (now %v), want -1", i, level, entered.Since.Sub(t0), cl.clock.Now().Sub(t0))
				}
			}
		})
	}
}

// TestStepsStoreDown: with the cells out of reach each replica steps on
// its own (it still sheds) and counts it; once they answer the replicas
// agree again within a round.
func TestStepsStoreDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := newStepCluster(t, 3, true)
	for _, s := range cl.sig {
		s.set(0.75)
	}
	for r := range 3 {
		cl.round(ctx, r%3)
	}
	if st, _ := cl.step(0); st.Level != 0 {
		t.Fatalf("at 0.75 with the store up: level %d, want 0", st.Level)
	}
	cl.s.down.Store(true)
	for _, s := range cl.sig {
		s.set(0.95)
	}
	for r := range 3 {
		cl.round(ctx, r%3)
	}
	for i, c := range cl.cs {
		s := c.Snapshot()[0]
		if s.Outcome.Level != 2 || !s.StepsLocal {
			t.Errorf("r%d with the cells down at 0.95: level %d, local %v; want 2 evaluated alone", i, s.Outcome.Level, s.StepsLocal)
		}
		if n := c.cfg.Scopes[0].Evaluator.Fallbacks(); n != 3 {
			t.Errorf("r%d counted %d fallbacks in 3 rounds down, want 3", i, n)
		}
	}
	if n := cl.errs.Load(); n != 9 {
		t.Errorf("%d errors told in 3 rounds of 3 replicas, want 9", n)
	}
	// Replicas that stepped alone hold holds a few milliseconds apart.
	if d := cl.disagree(); d == "" {
		t.Error("replicas that stepped alone agree to the millisecond: the fallback did not evaluate alone")
	}
	cl.s.down.Store(false)
	for _, s := range cl.sig {
		s.set(0.5)
	}
	cl.round(ctx, 1)
	if d := cl.disagree(); d != "" {
		t.Errorf("a round after the store came back: %s", d)
	}
	for i, c := range cl.cs {
		if s := c.Snapshot()[0]; s.StepsLocal || s.Step.By != "r1" || s.Outcome.Level != 2 {
			t.Errorf("r%d after recovery: local %v, by %q, level %d; want r1's shared level 2 (held)", i, s.StepsLocal, s.Step.By, s.Outcome.Level)
		}
	}
}

// TestStepsBoardDown: a replica that could not read the board has only
// its own score, which it acts on alone and never writes for all.
func TestStepsBoardDown(t *testing.T) {
	t.Parallel()
	clock := storetest.NewFakeClock(t0)
	cells := memstore.NewCells()
	e, err := NewEvaluator(designPolicy(), clock)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCombiner(CombinerConfig{
		Board: failingBoard{}, Replica: "r", TTL: time.Second, Clock: clock, Cells: cells, Domain: "d", Interval: stepInterval,
		Scopes: []Scope{{Name: "global", Local: fixed(0.75), Evaluator: e}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Tick(context.Background())
	s := c.Snapshot()[0]
	if !s.Stale || !s.StepsLocal || s.Outcome.Level != 0 || e.Fallbacks() != 1 {
		t.Errorf("board down: stale %v, local %v, level %d, %d fallbacks; want a stale reading stepped alone to 0, 1 fallback",
			s.Stale, s.StepsLocal, s.Outcome.Level, e.Fallbacks())
	}
	val, ver, err := cells.Load(context.Background(), clock.Now(), c.keys[0])
	if err != nil || val != nil || ver != 0 {
		t.Errorf("the cell holds %q (version %d, %v) after a stale reading, want nothing", val, ver, err)
	}
}

// TestStepsBadRecord: a record that is not this policy's state is never
// adopted; the replica computes afresh and writes over it.
func TestStepsBadRecord(t *testing.T) {
	t.Parallel()
	at := t0.Format(time.RFC3339Nano)
	tests := []struct {
		name string
		give string
	}{
		{name: "NotJSON", give: "{level"},
		{name: "LevelTooHigh", give: `{"level":3,"since":"` + at + `","pressure":0.95,"at":"` + at + `"}`},
		{name: "LevelTooLow", give: `{"level":-2,"since":"` + at + `","pressure":0.1,"at":"` + at + `"}`},
		{name: "Pressure", give: `{"level":2,"since":"` + at + `","pressure":1.5,"at":"` + at + `"}`},
		{name: "SinceAfterAt", give: `{"level":2,"since":"` + t0.Add(time.Hour).Format(time.RFC3339Nano) + `","pressure":0.95,"at":"` + at + `"}`},
		{name: "NoAt", give: `{"level":2,"since":"` + at + `","pressure":0.95}`},
		{name: "NoSince", give: `{"level":2,"pressure":0.95,"at":"` + at + `"}`},
		{name: "Null", give: "null"},
		{name: "Array", give: "[1,2]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cl := newStepCluster(t, 1, true)
			cl.sig[0].set(0.75)
			key := cl.cs[0].keys[0]
			if ok, _, err := cl.s.Swap(ctx, t0, key, 0, []byte(tt.give), time.Minute); !ok || err != nil {
				t.Fatalf("planting the record: %v %v", ok, err)
			}
			cl.round(ctx, 0)
			if s := cl.cs[0].Snapshot()[0]; s.Outcome.Level != 0 || s.Step.By != "r0" || s.StepsLocal {
				t.Errorf("over %s: level %d by %q (local %v), want 0 computed and shared by r0", tt.give, s.Outcome.Level, s.Step.By, s.StepsLocal)
			}
			val, _, err := cl.s.Load(ctx, cl.clock.Now(), key)
			if _, ok := decodeStep(val, cl.cs[0].cfg.Scopes[0].Evaluator); err != nil || !ok {
				t.Errorf("the cell holds %q (%v) after the tick, want a valid record", val, err)
			}
		})
	}
}

// TestStepsConcurrentTicks: replicas ticking at once race on the cell;
// one computes, the others adopt (the losers of the swap reload), so
// they agree after every round. Run with -race.
func TestStepsConcurrentTicks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := newStepCluster(t, 3, true)
	rng := rand.New(rand.NewPCG(5, 8))
	for r := range 40 {
		for _, s := range cl.sig {
			s.set(0.6 + 0.4*rng.Float64())
		}
		var wg sync.WaitGroup
		for _, c := range cl.cs {
			wg.Go(func() { c.Tick(ctx) })
		}
		wg.Wait()
		if d := cl.disagree(); d != "" {
			t.Fatalf("round %d: %s", r, d)
		}
		cl.clock.Advance(stepInterval)
	}
}

func TestStepKey(t *testing.T) {
	t.Parallel()
	p := designPolicy()
	longer := designPolicy()
	longer.Hold = 20 * time.Second
	moved := designPolicy()
	moved.Steps[0].Above = 0.6
	base := stepKey("inference", "global", p)
	tests := []struct {
		name     string
		give     string
		wantSame bool
	}{
		{name: "SamePolicy", give: stepKey("inference", "global", designPolicy()), wantSame: true},
		{name: "OtherHold", give: stepKey("inference", "global", longer)},
		{name: "OtherStep", give: stepKey("inference", "global", moved)},
		{name: "OtherScope", give: stepKey("inference", "m", p)},
		{name: "OtherDomain", give: stepKey("chat", "global", p)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if (tt.give == base) != tt.wantSame {
				t.Errorf("key %q against %q: same %v, want %v", tt.give, base, tt.give == base, tt.wantSame)
			}
		})
	}
	if !strings.HasPrefix(base, "steps|inference|global|") {
		t.Errorf("key %q does not name its domain and scope", base)
	}
	long := stepKey("inference", strings.Repeat("m", 200), p)
	if err := limit.CheckScope("cell key", long); err != nil || long == stepKey("inference", strings.Repeat("m", 201), p) {
		t.Errorf("long scope: key %q (%v), want a valid key of its own", long, err)
	}
}

func TestNewCombinerStepsInterval(t *testing.T) {
	t.Parallel()
	e, _ := NewEvaluator(&Policy{}, limit.SystemClock{})
	_, err := NewCombiner(CombinerConfig{
		Board: memstore.NewBoard(), Replica: "r", TTL: time.Second, Cells: memstore.NewCells(),
		Scopes: []Scope{{Name: "g", Evaluator: e}},
	})
	if err == nil || !strings.Contains(err.Error(), "interval 0s is under 1ms") {
		t.Errorf("NewCombiner with Cells and no interval: %v", err)
	}
}

// racedCells lets another writer swap in winner just before each Swap,
// and then fails Loads when failReload is set.
type racedCells struct {
	limit.Cells
	winner     []byte
	failReload atomic.Bool
	raced      atomic.Bool
}

func (c *racedCells) Load(ctx context.Context, now time.Time, key string) ([]byte, uint64, error) {
	if c.raced.Load() && c.failReload.Load() {
		return nil, 0, errDown
	}
	return c.Cells.Load(ctx, now, key)
}

func (c *racedCells) Swap(ctx context.Context, now time.Time, key string, version uint64, value []byte, ttl time.Duration) (bool, uint64, error) {
	if ok, _, err := c.Cells.Swap(ctx, now, key, version, c.winner, ttl); !ok || err != nil {
		return false, 0, fmt.Errorf("the other writer's swap: %v %w", ok, err)
	}
	c.raced.Store(true)
	return c.Cells.Swap(ctx, now, key, version, value, ttl)
}

// TestStepsLostSwap: a replica whose swap loses adopts the winner's
// state; if it cannot read it, its own stands, counted as a fallback.
func TestStepsLostSwap(t *testing.T) {
	t.Parallel()
	winner := encodeStep(StepState{Level: 2, Since: t0, Pressure: 0.95, At: t0, By: "winner"})
	tests := []struct {
		name          string
		give          bool // the reload fails
		wantLevel     int
		wantBy        string
		wantFallbacks uint64
	}{
		{name: "AdoptsWinner", wantLevel: 2, wantBy: "winner"},
		{name: "ReloadFails", give: true, wantLevel: 0, wantBy: "r", wantFallbacks: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewFakeClock(t0)
			cells := &racedCells{Cells: memstore.NewCells(), winner: winner}
			cells.failReload.Store(tt.give)
			e, err := NewEvaluator(designPolicy(), clock)
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewCombiner(CombinerConfig{
				Board: memstore.NewBoard(), Replica: "r", TTL: time.Second, Clock: clock, Cells: cells, Domain: "d", Interval: stepInterval,
				Scopes: []Scope{{Name: "global", Local: fixed(0.75), Evaluator: e}},
			})
			if err != nil {
				t.Fatal(err)
			}
			c.Tick(context.Background())
			s := c.Snapshot()[0]
			if s.Outcome.Level != tt.wantLevel || s.Step.By != tt.wantBy || e.Fallbacks() != tt.wantFallbacks {
				t.Errorf("after a lost swap: level %d by %q, %d fallbacks; want %d by %q, %d",
					s.Outcome.Level, s.Step.By, e.Fallbacks(), tt.wantLevel, tt.wantBy, tt.wantFallbacks)
			}
		})
	}
}

// ctxCells fails calls whose context has ended, as Redis calls do.
type ctxCells struct{ limit.Cells }

func (c ctxCells) Load(ctx context.Context, now time.Time, key string) ([]byte, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return c.Cells.Load(ctx, now, key)
}

// TestStepsStopping: a tick whose context ends (a reload stops the
// Combiner) is not the store failing: no fallback, no error, no change.
func TestStepsStopping(t *testing.T) {
	t.Parallel()
	clock := storetest.NewFakeClock(t0)
	e, err := NewEvaluator(designPolicy(), clock)
	if err != nil {
		t.Fatal(err)
	}
	var errs atomic.Int64
	c, err := NewCombiner(CombinerConfig{
		Board: memstore.NewBoard(), Replica: "r", TTL: time.Second, Clock: clock, Cells: ctxCells{memstore.NewCells()}, Domain: "d", Interval: stepInterval,
		Scopes: []Scope{{Name: "global", Local: fixed(0.75), Evaluator: e}},
		OnError: func(_ string, err error) {
			if strings.Contains(err.Error(), "step cell") { // the board's are told as before
				errs.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.Tick(ctx)
	if s := c.Snapshot()[0]; s.StepsLocal || e.Fallbacks() != 0 || errs.Load() != 0 || s.Outcome.Level != -1 {
		t.Errorf("a stopped tick: local %v, %d fallbacks, %d errors, level %d; want none and -1", s.StepsLocal, e.Fallbacks(), errs.Load(), s.Outcome.Level)
	}
}
