package limit

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fairTenant is one fairness key in a simulation: its weight and how
// many requests it sends per tick while active.
type fairTenant struct {
	name   string
	weight float64
	// every sends one request each every ticks (1: every tick); 0 means
	// never.
	every int64
	// from and until bound the ticks it sends in (until 0: to the end).
	from, until int64
}

// fairRun is a simulation's outcome.
type fairRun struct {
	// admitted[tenant][window] is the cost admitted in each window.
	admitted map[string][]int64
	// asked[tenant][window] is the cost asked in each window.
	asked map[string][]int64
	// times are every admission's Unix ms, in order.
	times []int64
}

// simulateFair runs tenants against one shared sliding-window limit of
// amount per window, gated by the fair state, with a fake clock ticking
// every tick ms for windows windows. Each tick the tenants that send
// ask in an order shuffled by seed, one decision each, as a Store would
// run them: the gate, then the shared counter, then Record. A nil p runs
// the shared counter alone, for the baseline.
func simulateFair(tb testing.TB, p *FairPolicy, amount uint64, window time.Duration, tick int64, windows int, tenants []fairTenant, seed uint64) fairRun {
	tb.Helper()
	ch := Charge{Algorithm: SlidingWindow, Amount: amount, Window: window, Buckets: 20, Cost: 1}
	var (
		st  FairState
		ctr Counter
		rnd = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		out = fairRun{admitted: map[string][]int64{}, asked: map[string][]int64{}}
	)
	for _, tn := range tenants {
		out.admitted[tn.name] = make([]int64, windows)
		out.asked[tn.name] = make([]int64, windows)
	}
	// Start on a window boundary well past the epoch, as a real clock is.
	w := window.Milliseconds()
	start := (1_800_000_000_000 / w) * w
	ticks := int64(windows) * w / tick
	order := make([]int, len(tenants))
	for i := range order {
		order[i] = i
	}
	for n := range ticks {
		now := start + n*tick
		win := int((now - start) / w)
		rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			tn := tenants[i]
			if tn.every == 0 || n < tn.from || (tn.until > 0 && n >= tn.until) || (n-tn.from)%tn.every != 0 {
				continue
			}
			out.asked[tn.name][win]++
			if p == nil {
				if fits, _ := ctr.Step(&ch, now); fits {
					out.admitted[tn.name][win]++
					out.times = append(out.times, now)
				}
				continue
			}
			room, _ := ctr.Report(&ch, now)
			if !st.Gate(p, now, tn.name, tn.weight, 1, int64(room)) {
				ctr.Touch(&ch, now)
				st.Record(p, now, tn.name, tn.weight, 1, FairDenied)
				continue
			}
			if fits, _ := ctr.Step(&ch, now); !fits {
				st.Record(p, now, tn.name, tn.weight, 1, FairDenied)
				continue
			}
			st.Record(p, now, tn.name, tn.weight, 1, FairAdmitted)
			out.admitted[tn.name][win]++
			out.times = append(out.times, now)
		}
	}
	return out
}

func (r *fairRun) total(name string, from, to int) int64 {
	var s int64
	for _, n := range r.admitted[name][from:to] {
		s += n
	}
	return s
}

// spread is (max-min)/mean of the tenants' admitted cost over weight in
// windows [from, to).
func (r *fairRun) spread(tenants []fairTenant, from, to int) float64 {
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	for _, tn := range tenants {
		x := float64(r.total(tn.name, from, to)) / tn.weight
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	return (hi - lo) / (sum / float64(len(tenants)))
}

func defaultFairPolicy() *FairPolicy {
	return &FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 5}
}

// fairWarmup is the windows a run needs before the shares settle: the
// first window nobody contends (every ask fits until the limit fills),
// and the next few echo its burst as the sliding window frees it.
const fairWarmup = 5

// TestFairProportional: all keys backlogged, the admitted cost over
// weight is equal within 0.002 over a long run.
func TestFairProportional(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		amount  uint64
		windows int
		give    []fairTenant
	}{
		{name: "plans 1 2 4", amount: 600, give: []fairTenant{{name: "free", weight: 1, every: 1}, {name: "std", weight: 2, every: 1}, {name: "prem", weight: 4, every: 1}}},
		// Premium's share (4/7 of 120 a second) is below what it asks
		// (1000/6 a second), so it stays backlogged.
		{name: "free sends 6x premium", amount: 120, give: []fairTenant{{name: "free", weight: 1, every: 1}, {name: "std", weight: 2, every: 3}, {name: "prem", weight: 4, every: 6}}},
		{name: "explicit weights", amount: 600, give: []fairTenant{{name: "acme", weight: 3, every: 1}, {name: "beta", weight: 1, every: 2}, {name: "corp", weight: 0.5, every: 1}, {name: "dev", weight: 1.5, every: 1}}},
		{name: "equal weights", amount: 600, give: []fairTenant{{name: "a", weight: 1, every: 1}, {name: "b", weight: 1, every: 1}}},
		// Enough capacity that one request is well under 0.002 of a key's
		// admissions.
		{name: "many keys", amount: 4000, windows: 30, give: manyTenants(20)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			windows := cmp.Or(tt.windows, 100)
			for seed := range uint64(3) {
				r := simulateFair(t, defaultFairPolicy(), tt.amount, time.Second, 1, windows, tt.give, seed)
				if got := r.spread(tt.give, fairWarmup, windows); got > 0.002 {
					t.Errorf("seed %d: spread of admitted/weight = %.5f, want <= 0.002 (%v)", seed, got, totals(&r, tt.give, fairWarmup, windows))
				}
			}
		})
	}
}

// manyTenants are n tenants of weights 1..4 that all send every tick.
func manyTenants(n int) []fairTenant {
	ts := make([]fairTenant, n)
	for i := range ts {
		ts[i] = fairTenant{name: fmt.Sprintf("t%02d", i), weight: float64(1 + i%4), every: 1}
	}
	return ts
}

func totals(r *fairRun, tenants []fairTenant, from, to int) string {
	s := ""
	for _, tn := range tenants {
		s += fmt.Sprintf("%s=%d ", tn.name, r.total(tn.name, from, to))
	}
	return s
}

// all is the cost admitted to every tenant in windows [from, to).
func (r *fairRun) all(from, to int) int64 {
	var s int64
	for name := range r.admitted {
		s += r.total(name, from, to)
	}
	return s
}

// window is the cost admitted to every tenant in window i.
func (r *fairRun) window(i int) int64 { return r.all(i, i+1) }

// TestFairWorkConserving: when a tenant goes idle or joins mid run, the
// gate uses at least 95% of what the shared limit alone admits under the
// same demand, and from the window after the change every window uses at
// least 95% of the limit's sustained rate: the idle tenant's share goes
// to the others within one window. A light tenant (asking below its share)
// leaves the rest to the others and still gets most of what it asks.
func TestFairWorkConserving(t *testing.T) {
	t.Parallel()
	const windows = 40
	tests := []struct {
		name string
		give []fairTenant
		// from is the first window checked.
		from int
		// light asks below its share: it must get at least 70% of what
		// it asks, and more than the limit alone gives it.
		light string
	}{
		{
			// Premium asks 50 a second; its share would be 343.
			name:  "light premium",
			give:  []fairTenant{{name: "free", weight: 1, every: 1}, {name: "std", weight: 2, every: 1}, {name: "prem", weight: 4, every: 20}},
			from:  fairWarmup,
			light: "prem",
		},
		{
			name:  "light free among heavy",
			give:  []fairTenant{{name: "free", weight: 1, every: 50}, {name: "a", weight: 2, every: 1}, {name: "b", weight: 2, every: 1}},
			from:  fairWarmup,
			light: "free",
		},
		{
			// Premium stops at 20.5 s.
			name: "premium goes idle",
			give: []fairTenant{{name: "free", weight: 1, every: 1}, {name: "std", weight: 2, every: 2}, {name: "prem", weight: 4, every: 1, until: 20_500}},
			from: 21,
		},
		{
			name: "free goes idle",
			give: []fairTenant{{name: "free", weight: 1, every: 1, until: 20_500}, {name: "prem", weight: 4, every: 1}},
			from: 21,
		},
		{
			name: "tenant joins late",
			give: []fairTenant{{name: "free", weight: 1, every: 1}, {name: "prem", weight: 4, every: 1, from: 20_500}},
			from: fairWarmup,
		},
	}
	// A sliding window of 20 buckets counts 21 of them, so backlogged it
	// admits 600 per 1.05 s.
	const sustained = 600.0 * 20 / 21
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base := simulateFair(t, nil, 600, time.Second, 1, windows, tt.give, 1)
			r := simulateFair(t, defaultFairPolicy(), 600, time.Second, 1, windows, tt.give, 1)
			if got, want := r.all(tt.from, windows), base.all(tt.from, windows); float64(got) < 0.95*float64(want) {
				t.Errorf("windows %d-%d: admitted %d, want >= 95%% of the limit alone's %d", tt.from, windows-1, got, want)
			}
			if tt.light != "" {
				var asked int64
				for _, n := range r.asked[tt.light][tt.from:windows] {
					asked += n
				}
				got, alone := r.total(tt.light, tt.from, windows), base.total(tt.light, tt.from, windows)
				t.Logf("%s admitted %d of %d asked (%d by the limit alone); all %d of %d", tt.light, got, asked, alone, r.all(tt.from, windows), base.all(tt.from, windows))
				if float64(got) < 0.7*float64(asked) || got <= alone {
					t.Errorf("light %s admitted %d of %d asked (the limit alone: %d), want >= 70%% and more than alone", tt.light, got, asked, alone)
				}
				return
			}
			// Every two windows after the first: the sliding window frees
			// room a bucket at a time, and where those lumps fall moves up
			// to a bucket's worth between neighbouring windows. The limit
			// alone dips to 525 (92% of sustained) in single windows of
			// "premium goes idle", whose pairs the gate keeps above 95%.
			for w := tt.from + 1; w+1 < windows; w++ {
				if got := r.window(w) + r.window(w+1); float64(got) < 0.95*2*sustained {
					t.Errorf("windows %d-%d: admitted %d, want >= 95%% of %.0f", w, w+1, got, 2*sustained)
				}
			}
		})
	}
}

// TestFairMinShare: every key with demand gets at least its minimum share
// of each window's admissions (to a quantum), where its weight alone would
// give it less.
func TestFairMinShare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		minShare float64
		give     []fairTenant
		// want is the share each key gets at least, in every window.
		want map[string]float64
	}{
		// Free's weight gives it 1/21: the floor lifts it to 10%, and
		// the others keep their ratio in the rest.
		{name: "floor binds", minShare: 0.1, give: []fairTenant{{name: "free", weight: 1, every: 1}, {name: "ent", weight: 20, every: 1}}, want: map[string]float64{"free": 0.1, "ent": 0.85}},
		{name: "two under the floor", minShare: 0.15, give: []fairTenant{{name: "a", weight: 1, every: 1}, {name: "b", weight: 1, every: 1}, {name: "ent", weight: 40, every: 1}}, want: map[string]float64{"a": 0.15, "b": 0.15, "ent": 0.65}},
		// Four keys at a floor of 0.3 cannot all have it: equal shares.
		{name: "floor too high", minShare: 0.3, give: []fairTenant{{name: "a", weight: 1, every: 1}, {name: "b", weight: 2, every: 1}, {name: "c", weight: 4, every: 1}, {name: "d", weight: 8, every: 1}}, want: map[string]float64{"a": 0.24, "b": 0.24, "c": 0.24, "d": 0.24}},
		{name: "floor does not bind", minShare: 0.05, give: []fairTenant{{name: "free", weight: 1, every: 1}, {name: "prem", weight: 4, every: 1}}, want: map[string]float64{"free": 0.19, "prem": 0.79}},
	}
	const windows = 30
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := defaultFairPolicy()
			p.MinShare = tt.minShare
			r := simulateFair(t, p, 600, time.Second, 1, windows, tt.give, 2)
			for w := fairWarmup; w < windows; w++ {
				all := float64(r.window(w))
				for name, share := range tt.want {
					// Within the quantum: a key at its share may be the
					// one a request behind when a window closes.
					if got := float64(r.admitted[name][w]); got < math.Floor(share*all)-p.Quantum {
						t.Errorf("window %d: %s admitted %.0f of %.0f, want >= %v of it", w, name, got, all, share)
					}
				}
			}
		})
	}
}

// TestFairHardCap: whatever the weights, costs, floors and order of
// requests, the cost admitted in any interval of a window's length never
// passes the shared limit: the gate only ever denies more.
func TestFairHardCap(t *testing.T) {
	t.Parallel()
	for seed := range uint64(40) {
		rnd := rand.New(rand.NewPCG(seed, 7))
		algo := []Algorithm{SlidingWindow, FixedWindow}[seed%2]
		ch := Charge{Algorithm: algo, Amount: uint64(1 + rnd.IntN(500)), Window: time.Duration(100+rnd.IntN(2000)) * time.Millisecond, Buckets: uint16(1 + rnd.IntN(30))}
		p := &FairPolicy{Backlog: time.Duration(1+rnd.IntN(3000)) * time.Millisecond, Quantum: float64(rnd.IntN(5)), Credit: float64(rnd.IntN(100)), MinShare: rnd.Float64() * 0.5, MaxKeys: 1 + rnd.IntN(8)}
		var (
			st    FairState
			ctr   Counter
			now   = int64(1_800_000_000_000 + rnd.IntN(100_000))
			times []int64
			costs []int64
		)
		for range 20_000 {
			now += int64(rnd.IntN(3))
			key := fmt.Sprintf("k%d", rnd.IntN(12))
			w := []float64{0, -1, math.NaN(), 0.001, 1, 2.5, 1e9}[rnd.IntN(7)]
			c := ch
			c.Cost = int64(1 + rnd.IntN(20))
			room, _ := ctr.Report(&c, now)
			if !st.Gate(p, now, key, w, c.Cost, int64(room)) {
				ctr.Touch(&c, now)
				st.Record(p, now, key, w, c.Cost, FairDenied)
				continue
			}
			if fits, _ := ctr.Step(&c, now); !fits {
				st.Record(p, now, key, w, c.Cost, FairDenied)
				continue
			}
			if rnd.IntN(10) == 0 {
				// Another charge of the decision denied it: the store
				// keeps nothing and tells the gate so.
				refund := c
				refund.Cost = -c.Cost
				ctr.Step(&refund, now)
				st.Record(p, now, key, w, c.Cost, FairElsewhere)
				continue
			}
			st.Record(p, now, key, w, c.Cost, FairAdmitted)
			times, costs = append(times, now), append(costs, c.Cost)
			if len(st.Keys) > p.MaxKeys+1 {
				t.Fatalf("seed %d: %d keys kept, want at most MaxKeys %d and the overflow key", seed, len(st.Keys), p.MaxKeys)
			}
		}
		if peak := peakCost(times, costs, ch.Window.Milliseconds(), algo == FixedWindow); peak > int64(ch.Amount) {
			t.Errorf("seed %d (%v %d per %v): %d admitted in one window", seed, algo, ch.Amount, ch.Window, peak)
		}
	}
}

// peakCost is the most cost admitted in any interval [t, t+w) (fixed: in
// any epoch-aligned window).
func peakCost(times, costs []int64, w int64, fixed bool) int64 {
	var peak, sum int64
	lo := 0
	for hi := range times {
		sum += costs[hi]
		for times[lo] <= times[hi]-w || (fixed && times[lo]/w != times[hi]/w) {
			sum -= costs[lo]
			lo++
		}
		peak = max(peak, sum)
	}
	return peak
}

func TestFairWeight(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give float64
		want float64
	}{
		{name: "plain", give: 2.5, want: 2.5},
		{name: "zero", give: 0, want: 1e-6},
		{name: "negative", give: -3, want: 1e-6},
		{name: "nan", give: math.NaN(), want: 1},
		{name: "huge", give: math.Inf(1), want: MaxMultiplier},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := FairWeight(tt.give); got != tt.want {
				t.Errorf("FairWeight(%v) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
}

func TestFairFloor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		share float64
		give  []float64
		want  []float64
	}{
		{name: "no floor", share: 0, give: []float64{1, 0, 20}, want: []float64{1, 0, 20}},
		// 1 of 21 < 0.1: raised to 0.1*20/0.9, so it has 10% exactly.
		{name: "one raised", share: 0.1, give: []float64{1, 0, 20}, want: []float64{20.0 / 9, 0, 20}},
		{name: "none raised", share: 0.1, give: []float64{1, 4}, want: []float64{1, 4}},
		{name: "all equal", share: 0.5, give: []float64{1, 2, 3}, want: []float64{2, 2, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := slices.Clone(tt.give)
			fairFloor(tt.share, got)
			for i := range got {
				if math.Abs(got[i]-tt.want[i]) > 1e-12 {
					t.Fatalf("fairFloor(%v, %v) = %v, want %v", tt.share, tt.give, got, tt.want)
				}
			}
		})
	}
}

// BenchmarkFairDecision is the gate's CPU per decision: Gate and Record
// for one key of n that all have state and demand (each call reads every
// key).
func BenchmarkFairDecision(b *testing.B) {
	for _, n := range []int{4, 64, 512} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			p := &FairPolicy{Backlog: time.Hour, Quantum: 1, Credit: 5, MinShare: 0.01}
			var st FairState
			now := int64(1_800_000_000_000)
			for i := range n {
				st.Record(p, now, fmt.Sprintf("tenant-%04d", i), float64(1+i%4), 1, FairDenied)
			}
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("tenant-%04d", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := keys[i%n]
				now++
				if st.Gate(p, now, k, 2, 1, 10) {
					st.Record(p, now, k, 2, 1, FairAdmitted)
				} else {
					st.Record(p, now, k, 2, 1, FairDenied)
				}
			}
		})
	}
}

// FuzzFairState drives the gate with hostile input (any key, weight, cost,
// room and clock steps, even backwards) and checks the state stays sane:
// keys sorted and unique, at most MaxKeys and the overflow key, and no
// NaN or infinity in the Clock or any Finish, which would stall or open
// the gate for good.
func FuzzFairState(f *testing.F) {
	f.Add([]byte("a\x01b\x02c"), 1.0, int64(1), int64(10), 0.1, uint8(2))
	f.Add([]byte{0, 0xff, 0x80, 7}, math.NaN(), int64(-5), int64(-1), 0.9, uint8(0))
	f.Add([]byte("tenant"), 1e300, int64(math.MaxInt64), int64(math.MaxInt64), 2.0, uint8(255))
	f.Fuzz(func(t *testing.T, script []byte, weight float64, cost, room int64, minShare float64, maxKeys uint8) {
		p := &FairPolicy{Backlog: 50 * time.Millisecond, Quantum: 1, Credit: 5, MinShare: min(max(minShare, 0), 0.99), MaxKeys: int(maxKeys)}
		var st FairState
		now := int64(1_800_000_000_000)
		for i, b := range script {
			now += int64(b%7) - 1
			key := string(script[i:min(len(script), i+1+int(b%3))])
			w := weight * float64(1+b%4)
			if st.Gate(p, now, key, w, cost, room) {
				st.Record(p, now, key, w, cost, FairOutcome(b%3))
			} else {
				st.Record(p, now, key, w, cost, FairDenied)
			}
			if math.IsNaN(st.Clock) || math.IsInf(st.Clock, 0) {
				t.Fatalf("step %d: Clock %v", i, st.Clock)
			}
			if len(st.Keys) > p.maxKeys()+1 {
				t.Fatalf("step %d: %d keys, MaxKeys %d", i, len(st.Keys), p.maxKeys())
			}
			for j, k := range st.Keys {
				if math.IsNaN(k.Finish) || math.IsInf(k.Finish, 0) {
					t.Fatalf("step %d: key %q Finish %v", i, k.Key, k.Finish)
				}
				if j > 0 && st.Keys[j-1].Key >= k.Key {
					t.Fatalf("step %d: keys out of order: %q then %q", i, st.Keys[j-1].Key, k.Key)
				}
			}
		}
	})
}

// TestFairGate: single decisions against a known state.
func TestFairGate(t *testing.T) {
	t.Parallel()
	const now = int64(1_800_000_000_000)
	p := &FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 100}
	// lead was admitted 10 of weight 1 while lag, waiting, was denied
	// all it asked: lag is owed 10, the reserve lead must leave.
	lead := func() *FairState {
		var st FairState
		for i := range int64(10) {
			st.Record(p, now+i, "lag", 1, 1, FairDenied)
			st.Record(p, now+i, "lead", 1, 1, FairAdmitted)
		}
		return &st
	}
	// As lead, but lag asked 2 once, at now: it is owed 10 and holds
	// only the 2 it asked, decayed to 2e^-0.02 = 1.96 by now+20.
	slow := func() *FairState {
		var st FairState
		st.Record(p, now, "lag", 1, 2, FairDenied)
		for i := range int64(10) {
			st.Record(p, now+i, "lead", 1, 1, FairAdmitted)
		}
		return &st
	}
	// lag and mid are denied 10 times each, mid also admitted 4 (still
	// waiting: 4 of 14 asked), while lead is admitted 10.
	pair := func() *FairState {
		var st FairState
		for i := range int64(10) {
			st.Record(p, now+i, "lag", 1, 1, FairDenied)
			st.Record(p, now+i, "mid", 1, 1, FairDenied)
			if i < 4 {
				st.Record(p, now+i, "mid", 1, 1, FairAdmitted)
			}
			st.Record(p, now+i, "lead", 1, 1, FairAdmitted)
		}
		if st.Clock != 2 {
			t.Fatalf("pair: Clock %v, want the waiting keys' mean 2 (%+v)", st.Clock, st)
		}
		return &st
	}
	tests := []struct {
		name string
		st   *FairState
		key  string
		cost int64
		room int64
		want bool
	}{
		{name: "empty state", st: &FairState{}, key: "a", cost: 1, room: 0, want: true},
		{name: "behind", st: lead(), key: "lag", cost: 1, room: 1, want: true},
		{name: "ahead and room short of the reserve", st: lead(), key: "lead", cost: 1, room: 5, want: false},
		{name: "ahead and room covers the reserve", st: lead(), key: "lead", cost: 1, room: 11, want: true},
		{name: "ahead of a slow key and room short of what it asked", st: slow(), key: "lead", cost: 1, room: 2, want: false},
		{name: "ahead of a slow key, which holds no more than it asked", st: slow(), key: "lead", cost: 1, room: 3, want: true},
		{name: "a hostile room cannot wrap", st: lead(), key: "lead", cost: 1, room: math.MinInt64, want: false},
		{name: "a hostile cost leaves no reserve", st: lead(), key: "lead", cost: math.MaxInt64, room: math.MaxInt64, want: false},
		// The Clock is held at the waiting keys' mean F (settle): lag's
		// 0, so a new key starts beside lag, owed as much as it.
		{name: "a new key starts among the waiting keys", st: lead(), key: "new", cost: 1, room: 1, want: true},
		// lag (F 0) and mid (F 4) wait: the Clock is their mean, 2. A
		// new key starts there, ahead of lag by 2, and leaves it that.
		{name: "a new key leaves the waiting key behind it its due", st: pair(), key: "new", cost: 1, room: 2, want: false},
		{name: "a new key takes room beyond it", st: pair(), key: "new", cost: 1, room: 3, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.st.Gate(p, now+20, tt.key, 1, tt.cost, tt.room); got != tt.want {
				t.Errorf("Gate(%q, cost %d, room %d) = %v, want %v (state %+v)", tt.key, tt.cost, tt.room, got, tt.want, *tt.st)
			}
		})
	}
}

// TestFairDecay: the hand-rolled e^-x that Lua repeats to the bit is
// within 1e-13 of math.Exp over the range the state uses.
func TestFairDecay(t *testing.T) {
	t.Parallel()
	for x := 0.0; x <= 64; x += 0.0137 {
		got, want := fairDecay(x), math.Exp(-x)
		if d := math.Abs(got-want) / want; d > 1e-13 {
			t.Fatalf("fairDecay(%v) = %v, math.Exp = %v: relative error %g", x, got, want, d)
		}
	}
	for _, tt := range []struct{ give, want float64 }{{0, 1}, {-1, 1}, {math.NaN(), 1}, {65, 0}, {math.Inf(1), 0}} {
		if got := fairDecay(tt.give); got != tt.want {
			t.Errorf("fairDecay(%v) = %v, want %v", tt.give, got, tt.want)
		}
	}
}

// TestFairLiftLevel: two waiting keys owed more than the credit stand at
// the same floor in virtual time whatever their weights, so neither is
// ahead of the other and the heavy one may take a unit of room the light
// one is not owed more of. With a floor of Credit/w (the same cost for
// each) the heavy key stood Credit x (1 - 1/w) ahead and was refused
// until the light ones caught up: premium starved for 8 s in the
// spike-queue simulation.
func TestFairLiftLevel(t *testing.T) {
	t.Parallel()
	p := &FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 2}
	const now = 10_000
	waiting := func(key string, w float64) FairKey {
		return FairKey{Key: key, Weight: w, Finish: 0, Asked: now - 1, Denied: now - 1, Asks: 10, Aged: now - 1}
	}
	s := &FairState{Clock: 10, Keys: []FairKey{waiting("free", 1), waiting("premium", 3)}}
	if !s.Gate(p, now, "premium", 3, 1, 1) {
		t.Error("premium, owed as much as free in virtual time, is refused the last unit of room")
	}
	if !s.Gate(p, now, "free", 1, 1, 1) {
		t.Error("free, owed as much as premium in virtual time, is refused the last unit of room")
	}
}
