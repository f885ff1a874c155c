package pressure

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// sharedStores is one cluster's shared state, with a switch that makes
// every call fail.
type sharedStores struct {
	flights *memstore.Flights
	meters  *memstore.Meters
	cells   *memstore.Cells
	down    atomic.Bool
}

var errDown = errors.New("store down")

func newShared() *sharedStores {
	return &sharedStores{flights: memstore.NewFlights(), meters: memstore.NewMeters(), cells: memstore.NewCells()}
}

func (s *sharedStores) Begin(ctx context.Context, now time.Time, scope string, ids []string, lease time.Duration) (int64, error) {
	if s.down.Load() {
		return 0, errDown
	}
	return s.flights.Begin(ctx, now, scope, ids, lease)
}

func (s *sharedStores) End(ctx context.Context, now time.Time, scope string, ids []string) (int64, error) {
	if s.down.Load() {
		return 0, errDown
	}
	return s.flights.End(ctx, now, scope, ids)
}

func (s *sharedStores) Count(ctx context.Context, now time.Time, scopes []string) ([]int64, error) {
	if s.down.Load() {
		return nil, errDown
	}
	return s.flights.Count(ctx, now, scopes)
}

func (s *sharedStores) Add(ctx context.Context, now time.Time, scope string, bucket, keep time.Duration, counts map[string]int64) error {
	if s.down.Load() {
		return errDown
	}
	return s.meters.Add(ctx, now, scope, bucket, keep, counts)
}

func (s *sharedStores) Sum(ctx context.Context, now time.Time, scope string, bucket time.Duration, n int, partial bool) (map[string]int64, error) {
	if s.down.Load() {
		return nil, errDown
	}
	return s.meters.Sum(ctx, now, scope, bucket, n, partial)
}

func (s *sharedStores) Load(ctx context.Context, now time.Time, key string) ([]byte, uint64, error) {
	if s.down.Load() {
		return nil, 0, errDown
	}
	return s.cells.Load(ctx, now, key)
}

func (s *sharedStores) Swap(ctx context.Context, now time.Time, key string, version uint64, value []byte, ttl time.Duration) (bool, uint64, error) {
	if s.down.Load() {
		return false, 0, errDown
	}
	return s.cells.Swap(ctx, now, key, version, value, ttl)
}

var (
	_ limit.Flights = (*sharedStores)(nil)
	_ limit.Meters  = (*sharedStores)(nil)
	_ limit.Cells   = (*sharedStores)(nil)
)

var testControl = limit.Control{Sheddable: []string{"free", "standard"}, Capacity: map[string]int64{"m": 32}}

func newTestController(tb testing.TB, s *sharedStores, clock limit.Clock, replica string) *Controller {
	tb.Helper()
	c, err := NewController(ControllerConfig{Flights: s, Meters: s, Cells: s, Replica: replica, Clock: clock, QueueSize: 1 << 12})
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Set(ControlDomain{Name: "inference", Control: testControl, Tiers: []string{"free", "premium", "standard"}, Upstreams: map[string]int64{"m": 32}}); err != nil {
		tb.Fatal(err)
	}
	return c
}

func TestControllerFlights(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storetest.NewFakeClock(t0)
	s := newShared()
	c := newTestController(t, s, clock, "a")
	count := func() int64 {
		t.Helper()
		n, err := s.Count(ctx, clock.Now(), []string{"inference|m"})
		if err != nil {
			t.Fatal(err)
		}
		return n[0]
	}
	tests := []struct {
		name string
		do   func()
		want int64
	}{
		{name: "admitted requests begin flights", want: 3, do: func() {
			for _, id := range []string{"r1", "r2", ""} {
				if got := c.Decided("inference", "m", "free", true, id); got == "" || (id != "" && got != id) {
					t.Errorf("Decided(%q) = %q", id, got)
				}
			}
		}},
		{name: "refused, unknown domain or upstream begin none", want: 3, do: func() {
			for _, d := range []struct{ dom, up string }{{"inference", "m"}, {"other", "m"}, {"inference", "made-up"}} {
				c.Decided(d.dom, d.up, "free", d.dom == "inference" && d.up == "made-up", "x")
			}
			if got := c.Decided("inference", "m", "free", false, "r9"); got != "" {
				t.Errorf("a refused request got flight %q", got)
			}
		}},
		{name: "completions end them, twice is once", want: 1, do: func() {
			for _, id := range []string{"r1", "r2", "r2"} {
				c.Completed(&limit.Request{Domain: "inference", ID: id, Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "model", Value: "m"}}}}})
			}
		}},
		{name: "hostile completions end nothing", want: 1, do: func() {
			c.Completed(nil)
			c.Completed(&limit.Request{Domain: "inference", ID: "r3"}) // no model
			c.Completed(&limit.Request{Domain: "nope", ID: "r3", Model: "m"})
			c.Completed(&limit.Request{Domain: "inference", Model: "m"})
		}},
		{name: "a flight begun and ended in one batch is never sent", want: 1, do: func() {
			id := c.Decided("inference", "m", "premium", true, "r4")
			c.Completed(&limit.Request{Domain: "inference", ID: id, Model: "m"})
		}},
		{name: "a lost completion ends with the lease", want: 0, do: func() {
			clock.Advance(limit.DefaultControlLease + time.Second)
		}},
	}
	for _, tt := range tests {
		tt.do()
		c.Flush(ctx)
		if got := count(); got != tt.want {
			t.Errorf("%s: %d in flight, want %d", tt.name, got, tt.want)
		}
	}
}

func TestControllerQueueFull(t *testing.T) {
	t.Parallel()
	s := newShared()
	c, err := NewController(ControllerConfig{Flights: s, Meters: s, Cells: s, Clock: storetest.NewFakeClock(t0), QueueSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ControlDomain{Name: "d", Control: testControl, Upstreams: map[string]int64{"m": 4}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if id := c.Decided("d", "m", "free", true, fmt.Sprint(i)); id == "" {
			t.Fatalf("request %d got no flight ID", i)
		}
	}
	if got := c.Dropped(); got != 3 {
		t.Errorf("Dropped() = %d, want 3", got)
	}
}

// cluster is three replicas' Controllers on one shared store, each with
// its own Gate, stepped on one fake clock.
type cluster struct {
	clock *storetest.FakeClock
	s     *sharedStores
	ctl   []*Controller
}

func newCluster(tb testing.TB, n int) *cluster {
	cl := &cluster{clock: storetest.NewFakeClock(t0), s: newShared()}
	for i := range n {
		cl.ctl = append(cl.ctl, newTestController(tb, cl.s, cl.clock, fmt.Sprintf("r%d", i)))
	}
	return cl
}

// offer sends rate requests/s of tier to replica i for one interval,
// admitting what its controller's fractions admit (with rng), and ends
// the flights admitted service ago.
func (cl *cluster) offer(rng *rand.Rand, tier string, perTick int) {
	for range perTick {
		c := cl.ctl[rng.IntN(len(cl.ctl))]
		f := c.Fraction("inference", "m", tier)
		c.Decided("inference", "m", tier, !(f > 0 && rng.Float64() < f), "")
	}
}

func (cl *cluster) tick(ctx context.Context) {
	for _, c := range cl.ctl {
		c.Flush(ctx)
	}
	// The replicas tick a few milliseconds apart, in turn.
	for _, c := range cl.ctl {
		c.Tick(ctx)
		cl.clock.Advance(time.Millisecond)
	}
	cl.clock.Advance(limit.DefaultControlInterval - time.Duration(len(cl.ctl))*time.Millisecond)
}

func TestControllerReplicasAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := newCluster(t, 3)
	rng := rand.New(rand.NewPCG(7, 7))
	// Flights never end: in-flight climbs past capacity, so the
	// controller must shed, and every replica must shed alike.
	for tick := range 40 {
		cl.offer(rng, "premium", 7)
		cl.offer(rng, "standard", 7)
		cl.offer(rng, "free", 60)
		cl.tick(ctx)
		var by string
		want := cl.ctl[0].Snapshot()[0]
		for i, c := range cl.ctl {
			got := c.Snapshot()[0]
			if diff := cmp.Diff(want.Shed, got.Shed); diff != "" {
				t.Fatalf("tick %d: replica %d sheds differently from replica 0 (-0 +%d):\n%s", tick, i, i, diff)
			}
			if !got.At.Equal(want.At) {
				t.Errorf("tick %d: replica %d holds a state of %v, replica 0 of %v", tick, i, got.At, want.At)
			}
			by = got.By
		}
		if by == "" {
			t.Fatalf("tick %d: no replica wrote the state", tick)
		}
	}
	last := cl.ctl[0].Snapshot()[0]
	if last.Shed["free"] == 0 {
		t.Errorf("in-flight %d over capacity 32 and free is not shed: %+v", last.InFlight, last)
	}
	for i, c := range cl.ctl {
		if got := c.Snapshot()[0].Changes; got != last.Changes {
			t.Errorf("replica %d counted %d changes, replica 0 %d", i, got, last.Changes)
		}
	}
	if !cl.ctl[0].Busy("inference", "m") || cl.ctl[0].Busy("inference", "other") {
		t.Errorf("Busy: in flight %d of 32", last.InFlight)
	}
}

// TestControllerEndsAfterOutage: completions that came while the store
// was down end their flights once it is back, so a store that kept its
// data does not come back counting them (and the law shedding for them)
// until their leases end; ends older than the lease are dropped.
func TestControllerEndsAfterOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storetest.NewFakeClock(t0)
	s := newShared()
	c := newTestController(t, s, clock, "a")
	count := func() int64 {
		t.Helper()
		n, err := s.Count(ctx, clock.Now(), []string{"inference|m"})
		if err != nil {
			t.Fatal(err)
		}
		return n[0]
	}
	end := func(id string) {
		c.Completed(&limit.Request{Domain: "inference", ID: id, Model: "m"})
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		c.Decided("inference", "m", "free", true, id)
	}
	c.Flush(ctx)
	if got := count(); got != 3 {
		t.Fatalf("%d in flight before the outage, want 3", got)
	}
	s.down.Store(true)
	end("r1")
	end("r2")
	c.Flush(ctx)
	clock.Advance(time.Second)
	c.Flush(ctx) // a flush with nothing new tries the kept ends again, and fails
	s.down.Store(false)
	clock.Advance(resendBackoff)
	c.Flush(ctx)
	if got := count(); got != 1 {
		t.Errorf("%d in flight after the store came back, want 1 (r3)", got)
	}

	// Ends kept past the lease are dropped, not sent: their flights are
	// gone by then.
	s.down.Store(true)
	end("r3")
	c.Flush(ctx)
	clock.Advance(limit.DefaultControlLease)
	s.down.Store(false)
	c.Flush(ctx)
	if len(c.retry) != 0 || c.retryCount != 0 {
		t.Errorf("kept ends past the lease: %d groups, %d ids", len(c.retry), c.retryCount)
	}
}

func TestControllerStoreDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := newCluster(t, 1)
	c := cl.ctl[0]
	rng := rand.New(rand.NewPCG(1, 2))
	for range 40 {
		cl.offer(rng, "free", 60)
		cl.offer(rng, "premium", 10)
		cl.tick(ctx)
	}
	shed := c.Fraction("inference", "m", "free")
	if shed == 0 {
		t.Fatal("free is not shed before the store goes down")
	}
	cl.s.down.Store(true)
	grace := limit.DefaultControlGrace
	for cl.clock.Now().Sub(t0.Add(40*limit.DefaultControlInterval)) < grace-limit.DefaultControlInterval {
		cl.offer(rng, "free", 60)
		cl.tick(ctx)
		if got := c.Fraction("inference", "m", "free"); got != shed {
			t.Fatalf("at %v within the grace, free is shed by %v, want the last %v", cl.clock.Now(), got, shed)
		}
	}
	for range 8 {
		cl.tick(ctx)
	}
	if got := c.Fraction("inference", "m", "free"); got != 0 {
		t.Errorf("past the grace, free is shed by %v, want 0", got)
	}
	if c.Busy("inference", "m") {
		t.Error("Busy while the store is down past the grace")
	}
	errs := c.StoreErrors()
	if errs[OpLoad] == 0 || errs[OpAdd] == 0 {
		t.Errorf("store errors not counted: %v", errs)
	}
	cl.s.down.Store(false)
	cl.offer(rng, "free", 60)
	cl.tick(ctx)
	if snap := c.Snapshot()[0]; snap.Stale {
		t.Errorf("still stale once the store answers: %+v", snap)
	}
}

func TestGateControllerFraction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name string
		give float64 // the fraction of free put in force
		tier string
		// steps: the steps' policy sheds free at any pressure.
		steps bool
		want  float64
	}{
		{name: "no fraction", give: 0, tier: "free", want: 0},
		{name: "a third", give: 0.3, tier: "free", want: 0.3},
		{name: "all", give: 1, tier: "free", want: 1},
		{name: "premium is never sheddable", give: 0.5, tier: "premium", want: 0},
		{name: "a tier the steps shed stays shed", give: 0.3, tier: "free", steps: true, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newShared()
			c := newTestController(t, s, storetest.NewFakeClock(t0), "a")
			st := ControlState{Fractions: []float64{tt.give, 0}, At: t0, Since: t0}
			if _, _, err := s.Swap(ctx, t0, "ctl|inference|m", 0, encodeState(st), time.Minute); err != nil {
				t.Fatal(err)
			}
			c.Tick(ctx) // adopts the state written within the interval
			rng := rand.New(rand.NewPCG(3, 4))
			g := NewGateRand(rng.Float64)
			g.SetController(c)
			if tt.steps {
				ev, err := NewEvaluator(&Policy{Steps: []Step{{Above: 0, Shed: []string{"free"}}}}, storetest.NewFakeClock(t0))
				if err != nil {
					t.Fatal(err)
				}
				ev.Update(0.5)
				g.Set(GateEntry{Domain: "inference", Scope: limit.ScopeGlobal, Evaluator: ev})
			}
			const n = 20000
			shed := 0
			for range n {
				if g.Shed("inference", "m", tt.tier).Shed {
					shed++
				}
			}
			// 4 standard deviations of a binomial of n draws: a correct
			// Gate fails this once in 15,000 seeds, and this seed is fixed.
			got := float64(shed) / n
			if tol := 4 * math.Sqrt(tt.want*(1-tt.want)/n); got < tt.want-tol || got > tt.want+tol {
				t.Errorf("shed %.4f of %s, want %.2f +- %.4f", got, tt.tier, tt.want, tol)
			}
			if g.Shed("inference", "other-model", tt.tier).Shed && !tt.steps {
				t.Error("an upstream the controller does not control is shed")
			}
		})
	}
}

// BenchmarkGateShed is the decision path's cost of shedding: the steps
// alone, and with the controller's fraction and draw.
func BenchmarkGateShed(b *testing.B) {
	ev, err := NewEvaluator(&Policy{Steps: []Step{{Above: 0.9, Shed: []string{"free"}}}}, storetest.NewFakeClock(t0))
	if err != nil {
		b.Fatal(err)
	}
	s := newShared()
	c := newTestController(b, s, storetest.NewFakeClock(t0), "a")
	st := ControlState{Fractions: []float64{0.5, 0}, At: t0, Since: t0}
	if _, _, err := s.Swap(context.Background(), t0, "ctl|inference|m", 0, encodeState(st), time.Minute); err != nil {
		b.Fatal(err)
	}
	c.Tick(context.Background())
	for _, bc := range []struct {
		name string
		ctl  *Controller
	}{{"steps", nil}, {"controlled", c}} {
		b.Run(bc.name, func(b *testing.B) {
			g := NewGate()
			g.Set(GateEntry{Domain: "inference", Scope: limit.ScopeGlobal, Evaluator: ev})
			g.SetController(bc.ctl)
			b.ReportAllocs()
			for b.Loop() {
				g.Shed("inference", "m", "free")
			}
		})
	}
}

// BenchmarkDecided is the decision path's cost of counting a decision
// and queueing its flight (the queue drained as the flusher would).
func BenchmarkDecided(b *testing.B) {
	s := newShared()
	c := newTestController(b, s, storetest.NewFakeClock(t0), "a")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Decided("inference", "m", "free", true, "")
		if i++; i%1024 == 0 {
			for len(c.queue) > 0 {
				<-c.queue
			}
		}
	}
}
