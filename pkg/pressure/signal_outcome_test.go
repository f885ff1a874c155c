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

// outcomeObs is n outcomes at t0+at.
type outcomeObs struct {
	at     time.Duration
	status int
	dur    time.Duration
	n      int
}

func TestOutcomeScores(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		give        []outcomeObs
		readAt      time.Duration
		wantLatency float64
		wantErrors  float64
		wantCount   uint64
	}{
		{name: "Empty"},
		{name: "UnderMinSamples", give: []outcomeObs{{status: 503, dur: 10 * testSLA, n: 19}}, wantCount: 19},
		{name: "AtMinSamples", give: []outcomeObs{{status: 503, dur: 10 * testSLA, n: 20}}, wantLatency: 1, wantErrors: 1, wantCount: 20},
		{name: "AtSLA", give: []outcomeObs{{status: 200, dur: testSLA, n: 100}}, wantCount: 100},
		{name: "JustOverSLA", give: []outcomeObs{{status: 200, dur: testSLA + testSLA/32, n: 100}}, wantLatency: 1.0 / 32, wantCount: 100},
		{name: "HalfWay", give: []outcomeObs{{status: 200, dur: 150 * time.Millisecond, n: 100}}, wantLatency: 0.5, wantCount: 100},
		{name: "RoundsDown", give: []outcomeObs{{status: 200, dur: 151 * time.Millisecond, n: 100}}, wantLatency: 0.5, wantCount: 100},
		{name: "TwiceSLA", give: []outcomeObs{{status: 200, dur: 2 * testSLA, n: 100}}, wantLatency: 1, wantCount: 100},
		{name: "FarOver", give: []outcomeObs{{status: 200, dur: time.Hour, n: 100}}, wantLatency: 1, wantCount: 100},
		{name: "NegativeDuration", give: []outcomeObs{{status: 200, dur: -time.Second, n: 100}}, wantCount: 100},
		{
			name:      "P95UnderSlowTail",
			give:      []outcomeObs{{status: 200, dur: testSLA / 2, n: 95}, {status: 200, dur: 10 * testSLA, n: 5}},
			wantCount: 100,
		},
		{
			name:        "P95InSlowTail",
			give:        []outcomeObs{{status: 200, dur: testSLA / 2, n: 94}, {status: 200, dur: 175 * time.Millisecond, n: 6}},
			wantLatency: 0.75, wantCount: 100,
		},
		{
			name:       "ErrorRateHalfOfMax",
			give:       []outcomeObs{{status: 200, n: 90}, {status: 503, n: 5}, {status: 0, n: 5}},
			wantErrors: 0.5, wantCount: 100,
		},
		{
			name:      "ClientErrorsAreNotErrors",
			give:      []outcomeObs{{status: 404, n: 50}, {status: 429, n: 50}, {status: 499, n: 50}},
			wantCount: 150,
		},
		{
			name:       "ErrorRateOverMax",
			give:       []outcomeObs{{status: 200, n: 50}, {status: 500, n: 50}},
			wantErrors: 1, wantCount: 100,
		},
		{
			name:        "SpreadOverTheInterval",
			give:        []outcomeObs{{at: 0, status: 500, dur: 2 * testSLA, n: 10}, {at: 9 * time.Second, status: 200, dur: 2 * testSLA, n: 10}},
			readAt:      9*time.Second + 999*time.Millisecond,
			wantLatency: 1, wantErrors: 1, wantCount: 20, // 50% errors over a max of 20%
		},
		{
			name:   "OldestTenthExpires",
			give:   []outcomeObs{{at: 0, status: 500, dur: 2 * testSLA, n: 10}, {at: 9 * time.Second, status: 200, dur: 2 * testSLA, n: 10}},
			readAt: 10 * time.Second, wantCount: 10, // under MinSamples
		},
		{
			name:      "RecycledSlot",
			give:      []outcomeObs{{at: 0, status: 500, dur: 2 * testSLA, n: 30}, {at: 10 * time.Second, status: 200, n: 30}},
			readAt:    10 * time.Second,
			wantCount: 30,
		},
		{
			name:      "TooOldIsDropped",
			give:      []outcomeObs{{at: 10 * time.Second, status: 200, n: 30}, {at: 0, status: 500, dur: 2 * testSLA, n: 30}},
			readAt:    10 * time.Second,
			wantCount: 30,
		},
		{
			name:   "ReadBeforeTheOutcomes",
			give:   []outcomeObs{{at: 5 * time.Second, status: 500, n: 30}},
			readAt: 4 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := newTestOutcomes(t, OutcomeConfig{})
			for _, g := range tt.give {
				for range g.n {
					o.Observe(t0.Add(g.at), g.status, g.dur, "")
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
			if got := w.Stats(now).Count; got != tt.wantCount {
				t.Errorf("Count = %d, want %d", got, tt.wantCount)
			}
			if got, want := w.Signals().Score(now), max(tt.wantLatency, tt.wantErrors); got != want {
				t.Errorf("Signals = %v, want %v", got, want)
			}
		})
	}
}

func TestOutcomeStats(t *testing.T) {
	t.Parallel()
	o := newTestOutcomes(t, OutcomeConfig{})
	for range 10 {
		o.Observe(t0, 200, 50*time.Millisecond, "")
	}
	o.Observe(t0, 502, 3*time.Second, "")
	want := OutcomeStats{Count: 11, Errors: 1, P95: 2 * testSLA}
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
	o.Observe(t0, 503, 2*testSLA, "llama")
	o.Observe(t0, 200, testSLA, "mistral")
	o.Observe(t0, 200, testSLA, "gpt") // not registered: global only
	o.Observe(t0, 200, testSLA, "")
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
				status := 200
				if i%10 == 0 {
					status = 503
				}
				o.Observe(at, status, time.Duration(g+i)*time.Millisecond, "llama")
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
		o.Observe(now, 200, 120*time.Millisecond, "llama")
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
				o.Observe(now.Add(time.Duration(i)*time.Microsecond), 200, 80*time.Millisecond, bb.model)
			}
		})
		b.Run(bb.name+"Parallel", func(b *testing.B) {
			b.ReportAllocs()
			now := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					o.Observe(now.Add(time.Duration(i)*time.Microsecond), 200, 80*time.Millisecond, bb.model)
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
		o.Observe(now.Add(time.Duration(i)*time.Millisecond), 200, time.Duration(i%300)*time.Millisecond, "")
	}
	s := o.Global().Signals()
	b.ReportAllocs()
	for b.Loop() {
		s.Score(now.Add(10 * time.Second))
	}
}
