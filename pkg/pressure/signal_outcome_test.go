package pressure

import (
	"strings"
	"sync"
	"testing"
	"time"
)

const testSLA = 100 * time.Millisecond

// newTestOutcomes returns a recorder of a 10s interval (tenths of 1s) and a
// 100ms SLA; t0 starts a tenth.
func newTestOutcomes(t testing.TB, cfg OutcomeConfig) *Outcomes {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.SLA == 0 {
		cfg.SLA = testSLA
	}
	o, err := NewOutcomes(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// outcomeObs is n outcomes of kind at t0+at.
type outcomeObs struct {
	at   time.Duration
	kind Kind
	dur  time.Duration
	n    int
}

func TestOutcomeScores(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		give         []outcomeObs
		readAt       time.Duration
		wantLatency  float64
		wantErrors   float64
		wantOverload float64
		wantCount    uint64
	}{
		{name: "Empty"},
		{name: "UnderMinSamplesDamped", give: []outcomeObs{{kind: Failed, dur: 10 * testSLA, n: 19}}, wantLatency: 0.95, wantErrors: 1, wantCount: 19},
		{name: "FewFailuresDamped", give: []outcomeObs{{kind: Failed, n: 2}, {n: 3}}, wantErrors: 0.5, wantCount: 5}, // 2 / max(5, 20) / 0.2
		{name: "AtMinSamples", give: []outcomeObs{{kind: Failed, dur: 10 * testSLA, n: 20}}, wantLatency: 1, wantErrors: 1, wantCount: 20},
		{name: "AtSLA", give: []outcomeObs{{dur: testSLA, n: 100}}, wantCount: 100},
		{name: "JustOverSLA", give: []outcomeObs{{dur: testSLA + testSLA/32, n: 100}}, wantLatency: 1.0 / 32, wantCount: 100},
		{name: "HalfWay", give: []outcomeObs{{dur: 150 * time.Millisecond, n: 100}}, wantLatency: 0.5, wantCount: 100},
		{name: "RoundsDown", give: []outcomeObs{{dur: 151 * time.Millisecond, n: 100}}, wantLatency: 0.5, wantCount: 100},
		{name: "TwiceSLA", give: []outcomeObs{{dur: 2 * testSLA, n: 100}}, wantLatency: 1, wantCount: 100},
		{name: "FarOver", give: []outcomeObs{{dur: time.Hour, n: 100}}, wantLatency: 1, wantCount: 100},
		{name: "NegativeDuration", give: []outcomeObs{{dur: -time.Second, n: 100}}, wantCount: 100},
		{
			name:      "P95UnderSlowTail",
			give:      []outcomeObs{{dur: testSLA / 2, n: 95}, {dur: 10 * testSLA, n: 5}},
			wantCount: 100,
		},
		{
			name:        "P95InSlowTail",
			give:        []outcomeObs{{dur: testSLA / 2, n: 94}, {dur: 175 * time.Millisecond, n: 6}},
			wantLatency: 0.75, wantCount: 100,
		},
		{
			name:       "ErrorRateHalfOfMax",
			give:       []outcomeObs{{n: 90}, {kind: Failed, n: 10}},
			wantErrors: 0.5, wantCount: 100,
		},
		{
			name:         "OverloadsAreNotErrors",
			give:         []outcomeObs{{n: 95}, {kind: Overloaded, n: 5}},
			wantOverload: 0.5, wantCount: 100,
		},
		{
			name:         "OverloadRateOverMax",
			give:         []outcomeObs{{n: 50}, {kind: Overloaded, n: 50}},
			wantOverload: 1, wantCount: 100,
		},
		{
			name:       "ErrorRateOverMax",
			give:       []outcomeObs{{n: 50}, {kind: Failed, n: 50}},
			wantErrors: 1, wantCount: 100,
		},
		{
			name:        "SpreadOverTheInterval",
			give:        []outcomeObs{{at: 0, kind: Failed, dur: 2 * testSLA, n: 10}, {at: 9 * time.Second, dur: 2 * testSLA, n: 10}},
			readAt:      9*time.Second + 999*time.Millisecond,
			wantLatency: 1, wantErrors: 1, wantCount: 20, // 50% errors over a max of 20%
		},
		{
			name:        "OldestTenthExpires",
			give:        []outcomeObs{{at: 0, kind: Failed, dur: 2 * testSLA, n: 10}, {at: 9 * time.Second, dur: 2 * testSLA, n: 10}},
			readAt:      10 * time.Second,
			wantLatency: 0.5, wantCount: 10, // half MinSamples: half the score
		},
		{
			name:      "RecycledSlot",
			give:      []outcomeObs{{at: 0, kind: Failed, dur: 2 * testSLA, n: 30}, {at: 10 * time.Second, n: 30}},
			readAt:    10 * time.Second,
			wantCount: 30,
		},
		{
			name:      "TooOldIsDropped",
			give:      []outcomeObs{{at: 10 * time.Second, n: 30}, {at: 0, kind: Failed, dur: 2 * testSLA, n: 30}},
			readAt:    10 * time.Second,
			wantCount: 30,
		},
		{
			name:   "ReadBeforeTheOutcomes",
			give:   []outcomeObs{{at: 5 * time.Second, kind: Failed, n: 30}},
			readAt: 4 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := newTestOutcomes(t, OutcomeConfig{})
			for _, g := range tt.give {
				for range g.n {
					o.Observe(t0.Add(g.at), g.kind, g.dur, "")
				}
			}
			now := t0.Add(tt.readAt)
			w := o.Global()
			if got := w.Latency().Score(now); got != tt.wantLatency {
				t.Errorf("Latency = %v, want %v", got, tt.wantLatency)
			}
			if got := w.ErrorRate().Score(now); got != tt.wantErrors {
				t.Errorf("ErrorRate = %v, want %v", got, tt.wantErrors)
			}
			if got := w.OverloadRate().Score(now); got != tt.wantOverload {
				t.Errorf("OverloadRate = %v, want %v", got, tt.wantOverload)
			}
			if got := w.Stats(now).Count; got != tt.wantCount {
				t.Errorf("Count = %d, want %d", got, tt.wantCount)
			}
			if got, want := w.Signals().Score(now), max(tt.wantLatency, tt.wantErrors, tt.wantOverload); got != want {
				t.Errorf("Signals = %v, want %v", got, want)
			}
		})
	}
}

// TestOutcomeScoreSamplesCollapse: shedding cuts the traffic a scope
// sees, so an interval of many samples is followed by one of few. The
// score of the few must not be higher than the score of the many: with
// a plain ratio 2 failures of 5 requests would score 1 after 20 of 200
// scored 0.5, and shed more as shedding works.
func TestOutcomeScoreSamplesCollapse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		before []outcomeObs
		after  []outcomeObs
		signal func(*OutcomeWindow) Signal
	}{
		{
			name:   "errors",
			before: []outcomeObs{{n: 180}, {kind: Failed, n: 20}},
			after:  []outcomeObs{{n: 3}, {kind: Failed, n: 2}},
			signal: (*OutcomeWindow).ErrorRate,
		},
		{
			name:   "overloads",
			before: []outcomeObs{{n: 190}, {kind: Overloaded, n: 10}},
			after:  []outcomeObs{{n: 4}, {kind: Overloaded, n: 1}},
			signal: (*OutcomeWindow).OverloadRate,
		},
		{
			name: "latency",
			// p95 1.5 x SLA (0.5), then 2 slow requests of 5 at 2 x SLA,
			// which undamped would score 1.
			before: []outcomeObs{{dur: testSLA / 2, n: 188}, {dur: 3 * testSLA / 2, n: 12}},
			after:  []outcomeObs{{dur: testSLA / 2, n: 3}, {dur: 2 * testSLA, n: 2}},
			signal: (*OutcomeWindow).Latency,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := newTestOutcomes(t, OutcomeConfig{})
			observe := func(at time.Duration, obs []outcomeObs) {
				for _, g := range obs {
					for range g.n {
						o.Observe(t0.Add(at), g.kind, g.dur, "")
					}
				}
			}
			observe(0, tt.before)
			many := tt.signal(o.Global()).Score(t0)
			// A whole interval later, only the few are in it.
			observe(10*time.Second, tt.after)
			few := tt.signal(o.Global()).Score(t0.Add(10 * time.Second))
			if st := o.Global().Stats(t0.Add(10 * time.Second)); st.Count != 5 {
				t.Fatalf("the interval holds %d outcomes, want the 5 after", st.Count)
			}
			if few > many {
				t.Errorf("score %v with 5 samples, above %v with 200", few, many)
			}
			if many == 0 {
				t.Errorf("score 0 with 200 samples: the case shows nothing")
			}
		})
	}
}

func TestOutcomeStats(t *testing.T) {
	t.Parallel()
	o := newTestOutcomes(t, OutcomeConfig{})
	for range 10 {
		o.Observe(t0, Served, 50*time.Millisecond, "")
	}
	o.Observe(t0, Failed, 3*time.Second, "")
	o.Observe(t0, Overloaded, time.Millisecond, "")
	want := OutcomeStats{Count: 12, Errors: 1, Overloads: 1, P95: 2 * testSLA}
	if got := o.Global().Stats(t0); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

func TestOutcomeModels(t *testing.T) {
	t.Parallel()
	o := newTestOutcomes(t, OutcomeConfig{MaxModels: 2, MinSamples: 1})
	a, err := o.Model("llama")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := o.Model("llama"); err != nil || again != a {
		t.Errorf("Model(llama) again = %p, %v; want %p", again, err, a)
	}
	b, err := o.Model("mistral")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Model("gpt"); err == nil || !strings.Contains(err.Error(), "max models 2") {
		t.Errorf("Model(gpt) past the cap: err = %v", err)
	}
	if _, err := o.Model(""); err == nil {
		t.Error("Model(\"\"): no error")
	}
	o.Observe(t0, Failed, 2*testSLA, "llama")
	o.Observe(t0, Served, testSLA, "mistral")
	o.Observe(t0, Served, testSLA, "gpt") // not registered: global only
	o.Observe(t0, Served, testSLA, "")
	tests := []struct {
		name                string
		give                *OutcomeWindow
		wantCount           uint64
		wantLatency, wantEr float64
	}{
		{name: "Global", give: o.Global(), wantCount: 4, wantLatency: 1, wantEr: 1}, // the p95 of 4 is the slowest
		{name: "Llama", give: a, wantCount: 1, wantLatency: 1, wantEr: 1},
		{name: "Mistral", give: b, wantCount: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.give.Stats(t0).Count; got != tt.wantCount {
				t.Errorf("Count = %d, want %d", got, tt.wantCount)
			}
			if got := tt.give.Latency().Score(t0); got != tt.wantLatency {
				t.Errorf("Latency = %v, want %v", got, tt.wantLatency)
			}
			if got := tt.give.ErrorRate().Score(t0); got != tt.wantEr {
				t.Errorf("ErrorRate = %v, want %v", got, tt.wantEr) // 1 of 4 over 0.2
			}
		})
	}
}

func TestNewOutcomesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give OutcomeConfig
		want string // substring of the error; "" for none
	}{
		{name: "Defaults", give: OutcomeConfig{SLA: time.Second}},
		{name: "NoSLA", give: OutcomeConfig{}, want: "sla 0s is under 1ms"},
		{name: "ShortInterval", give: OutcomeConfig{SLA: time.Second, Interval: time.Millisecond}, want: "interval 1ms is under 10ms"},
		{name: "ErrorRateOverOne", give: OutcomeConfig{SLA: time.Second, MaxErrorRate: 1.5}, want: "max error rate 1.5 is not in (0,1]"},
		{name: "OverloadRateNegative", give: OutcomeConfig{SLA: time.Second, MaxOverloadRate: -0.1}, want: "max overload rate -0.1 is not in (0,1]"},
		{name: "NegativeModels", give: OutcomeConfig{SLA: time.Second, MaxModels: -1}, want: "max models -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewOutcomes(tt.give)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("err = %v, want none", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestOutcomeConcurrent races observers over five tenths (so every slot
// is taken once, with no outcome expired) with readers; run with -race.
func TestOutcomeConcurrent(t *testing.T) {
	t.Parallel()
	o := newTestOutcomes(t, OutcomeConfig{})
	m, err := o.Model("llama")
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 2000
	end := t0.Add(5 * time.Second)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range each {
				at := t0.Add(time.Duration(i%5) * time.Second)
				kind := Served
				if i%10 == 0 {
					kind = Failed
				}
				o.Observe(at, kind, time.Duration(g+i)*time.Millisecond, "llama")
			}
		})
		wg.Go(func() {
			for range each / 10 {
				if s := m.Signals().Score(end); s < 0 || s > 1 {
					t.Errorf("Score = %v, not in [0,1]", s)
				}
				_, _ = o.Model("llama")
			}
		})
	}
	wg.Wait()
	for _, w := range []*OutcomeWindow{o.Global(), m} {
		st := w.Stats(end)
		if st.Count != workers*each || st.Errors != workers*each/10 {
			t.Errorf("%q: Stats = %+v, want %d outcomes and %d errors", w.Model(), st, workers*each, workers*each/10)
		}
		if got := w.ErrorRate().Score(end); got != 0.5 {
			t.Errorf("%q: ErrorRate = %v, want 0.5", w.Model(), got)
		}
	}
}

func TestOutcomeObserveAllocs(t *testing.T) {
	o := newTestOutcomes(t, OutcomeConfig{})
	if _, err := o.Model("llama"); err != nil {
		t.Fatal(err)
	}
	now := t0
	if n := testing.AllocsPerRun(1000, func() {
		now = now.Add(7 * time.Millisecond)
		o.Observe(now, Served, 120*time.Millisecond, "llama")
	}); n != 0 {
		t.Errorf("Observe allocates %v times per call, want 0", n)
	}
}

// BenchmarkOutcomeObserve measures the access log's cost per entry.
func BenchmarkOutcomeObserve(b *testing.B) {
	o := newTestOutcomes(b, OutcomeConfig{})
	if _, err := o.Model("llama"); err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		name  string
		model string
	}{{"Global", ""}, {"Model", "llama"}, {"UnknownModel", "gpt"}} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			now := time.Now()
			for i := 0; b.Loop(); i++ {
				o.Observe(now.Add(time.Duration(i)*time.Microsecond), Served, 80*time.Millisecond, bb.model)
			}
		})
		b.Run(bb.name+"Parallel", func(b *testing.B) {
			b.ReportAllocs()
			now := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					o.Observe(now.Add(time.Duration(i)*time.Microsecond), Served, 80*time.Millisecond, bb.model)
				}
			})
		})
	}
}

// BenchmarkOutcomeScore measures one reading, once per scope per tick.
func BenchmarkOutcomeScore(b *testing.B) {
	o := newTestOutcomes(b, OutcomeConfig{})
	now := time.Now()
	for i := range 10_000 {
		o.Observe(now.Add(time.Duration(i)*time.Millisecond), Served, time.Duration(i%300)*time.Millisecond, "")
	}
	s := o.Global().Signals()
	b.ReportAllocs()
	for b.Loop() {
		s.Score(now.Add(10 * time.Second))
	}
}
