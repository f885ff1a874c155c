package closedloop

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

// t0 is the synthetic runs' start.
var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// runBuilder makes synthetic runs: phases, records and scrapes at chosen
// times, so each law can be checked against a hand-computed value.
type runBuilder struct{ run *Run }

func newRun(end float64, phases ...any) *runBuilder {
	r := &Run{Start: t0, End: at(end)}
	for i := 0; i < len(phases); i += 2 {
		r.Phases = append(r.Phases, PhaseMark{Name: phases[i].(string), At: at(phases[i+1].(float64))})
	}
	return &runBuilder{run: r}
}

// good adds n 2xx answers of tier spread over [from, to), each taking lat.
func (b *runBuilder) good(tier string, from, to float64, n int, lat time.Duration) *runBuilder {
	for i := range n {
		sent := at(from + (to-from)*float64(i)/float64(n))
		b.run.Records = append(b.run.Records, Record{Sent: sent.Add(-lat), Tier: tier, Tenant: tier + "-0",
			Result: Result{Status: 200, Source: SourceUpstream, Latency: lat, Attempts: 1}})
	}
	return b
}

func (b *runBuilder) rec(r Record) *runBuilder {
	b.run.Records = append(b.run.Records, r)
	return b
}

// up adds an upstream sample with cumulative overloads.
func (b *runBuilder) up(sec float64, queueFull uint64) *runBuilder {
	b.run.Up = append(b.run.Up, UpSample{At: at(sec), UpstreamStats: UpstreamStats{QueueFull: queueFull}})
	return b
}

// scrape adds replica rep's sample at sec.
func (b *runBuilder) scrape(rep int, sec float64, values map[string]float64) *runBuilder {
	for len(b.run.Reps) <= rep {
		b.run.Reps = append(b.run.Reps, nil)
	}
	b.run.Reps[rep] = append(b.run.Reps[rep], RepSample{At: at(sec), Values: values})
	return b
}

const lvl = "tollgate_pressure_level{domain=inference,scope=global}"
const brk = "tollgate_breaker_state{breaker=model,domain=inference,key=gpt-4o}"

func findLaw(t *testing.T, laws []Law, prefix string) Law {
	t.Helper()
	for _, l := range laws {
		if strings.HasPrefix(l.Name, prefix) {
			return l
		}
	}
	t.Fatalf("no law %q in %v", prefix, laws)
	return Law{}
}

func TestSpikeLaws(t *testing.T) {
	t.Parallel()
	// steady [0,20), spike [20,40), after [40,60); warm-up 5s.
	base := func() *runBuilder {
		return newRun(60, PhaseSteady, 0.0, PhaseSpike, 20.0, PhaseAfter, 40.0).
			good("premium", 5, 20, 150, 100*time.Millisecond).
			good("standard", 5, 20, 150, 100*time.Millisecond)
	}
	tests := []struct {
		name     string
		give     *Run
		law      string
		want     float64
		wantPass bool
	}{
		{"premium kept 96%", base().good("premium", 20, 40, 192, 100*time.Millisecond).run, "premium goodput", 0.96, true},
		{"premium kept 90%", base().good("premium", 20, 40, 180, 100*time.Millisecond).run, "premium goodput", 0.90, false},
		{"standard kept 80%", base().good("standard", 20, 40, 160, 100*time.Millisecond).run, "standard goodput", 0.80, true},
		{"premium p99 2.5x", base().good("premium", 20, 40, 200, 250*time.Millisecond).run, "premium p99", 2.5, false},
		{"overloads in the first 5s only", base().up(20, 0).up(24, 7).up(25, 7).up(60, 7).run, "upstream overloads 0 after", 0, true},
		{"overloads at 30s", base().up(20, 0).up(25, 7).up(30, 9).up(60, 9).run, "upstream overloads 0 after", 2, false},
		{"second wave", base().up(40, 3).up(50, 5).run, "no second overload wave", 2, false},
		{"five changes in a minute", base().
			scrape(0, 1, map[string]float64{lvl: -1}).scrape(0, 2, map[string]float64{lvl: 0}).
			scrape(0, 3, map[string]float64{lvl: 1}).scrape(0, 4, map[string]float64{lvl: 0}).
			scrape(0, 5, map[string]float64{lvl: 1}).scrape(0, 6, map[string]float64{lvl: -1}).
			scrape(0, 70, map[string]float64{lvl: 0}).run, "shedding changes", 5, false},
		{"replica 1 follows after 3s", base().
			scrape(0, 20, map[string]float64{lvl: -1}).scrape(1, 20, map[string]float64{lvl: -1}).
			scrape(0, 21, map[string]float64{lvl: 0}).scrape(1, 21, map[string]float64{lvl: -1}).
			scrape(0, 24, map[string]float64{lvl: 0}).scrape(1, 24, map[string]float64{lvl: 0}).run, "replicas agree", 3, false},
		{"idle 12s after the spike", base().
			scrape(0, 30, map[string]float64{lvl: 0}).scrape(0, 45, map[string]float64{lvl: 0}).
			scrape(0, 52, map[string]float64{lvl: -1}).scrape(0, 59, map[string]float64{lvl: -1}).run, "full admission", 12, true},
		{"a shed denial at 45s", base().rec(Record{Sent: at(45), Tier: "free", Result: Result{Status: 503, Source: SourceTollgate, Reason: "shed"}}).run,
			"full admission", 5, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := findLaw(t, SpikeLaws(tt.give, LawParams{Warmup: 5 * time.Second}), tt.law)
			if math.Abs(l.Measured-tt.want) > 1e-9 || l.Pass != tt.wantPass {
				t.Errorf("%s: measured %v pass %v, want %v pass %v (%s)", l.Name, l.Measured, l.Pass, tt.want, tt.wantPass, l.Definition)
			}
		})
	}
}

func TestOutageLaws(t *testing.T) {
	t.Parallel()
	// steady [0,10), outage [10,40), recovered [40,60).
	b := newRun(60, PhaseSteady, 0.0, PhaseOutage, 10.0, PhaseRecover, 40.0)
	for _, s := range []struct {
		sec    float64
		r0, r1 float64
	}{{9, 0, 0}, {10.5, 2, 0}, {11.5, 2, 2}, {40, 1, 2}, {41, 0, 1}, {43, 0, 0}} {
		b.scrape(0, s.sec, map[string]float64{brk: s.r0}).scrape(1, s.sec, map[string]float64{brk: s.r1})
	}
	// In the span [10.5, 43): one probe, and a retried request.
	b.rec(Record{Sent: at(40.2), Tier: "premium", Result: Result{Status: 200, Source: SourceUpstream, Attempts: 1}})
	b.rec(Record{Sent: at(41.2), Tier: "premium", Result: Result{Status: 200, Source: SourceUpstream, Attempts: 2}})
	laws := OutageLaws(b.run, LawParams{})
	tests := []struct {
		law      string
		want     float64
		wantPass bool
	}{
		{"breaker opens", 1.5, false},
		{"one probe", 1, false}, // two requests against one open
		{"retries 0", 1, false},
		{"closes within", 3, false},
	}
	for _, tt := range tests {
		l := findLaw(t, laws, tt.law)
		if math.Abs(l.Measured-tt.want) > 1e-9 || l.Pass != tt.wantPass {
			t.Errorf("%s: measured %v pass %v, want %v pass %v", l.Name, l.Measured, l.Pass, tt.want, tt.wantPass)
		}
	}
}

// TestOutageProbesByTransitions: the open intervals of a span come from
// the transition counters (a probe that fails at once is half-open for
// milliseconds no scrape sees), and requests sent after the breaker
// closed (between the closing replica's last two scrapes) are not probes.
func TestOutageProbesByTransitions(t *testing.T) {
	t.Parallel()
	const (
		toOpen   = "tollgate_breaker_transitions_total{from=half_open,to=open}"
		toClosed = "tollgate_breaker_transitions_total{from=half_open,to=closed}"
	)
	for _, tt := range []struct {
		name  string
		extra []float64 // sends besides one probe a second in [11, 15]
		want  float64
	}{
		{"a probe per open interval", nil, 0},
		{"after the close", []float64{40.5, 40.8}, 0},
		{"a second request while open", []float64{20}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newRun(60, PhaseSteady, 0.0, PhaseOutage, 10.0, PhaseRecover, 40.0)
			// Replica 0 makes every transition: the first opening and
			// four reopenings by failed probes (5 opens), then the close
			// after its scrape at 40. Its scrapes never see half-open.
			for _, s := range []struct{ sec, state, opens, closes float64 }{
				{9, 0, 0, 0}, {10.5, 2, 1, 0}, {16, 2, 5, 0}, {40, 2, 5, 0}, {41, 0, 5, 1}, {43, 0, 5, 1},
			} {
				b.scrape(0, s.sec, map[string]float64{brk: s.state, toOpen: s.opens, toClosed: s.closes})
				b.scrape(1, s.sec, map[string]float64{brk: s.state})
			}
			for _, sec := range append([]float64{11, 12, 13, 14, 15}, tt.extra...) {
				b.rec(Record{Sent: at(sec), Tier: "premium", Result: Result{Status: 500, Source: SourceUpstream, Attempts: 1}})
			}
			l := findLaw(t, OutageLaws(b.run, LawParams{}), "one probe")
			if l.Measured != tt.want {
				t.Errorf("measured %v, want %v (%s)", l.Measured, tt.want, l.Definition)
			}
		})
	}
}

func TestRedisAndBudgetLaws(t *testing.T) {
	t.Parallel()
	b := newRun(60, PhaseSteady, 0.0, PhaseRedisOff, 10.0, PhaseRedisOn, 30.0)
	for i := range 120 {
		// hot-0 admitted every 0.5s: 120 in [0,60), so the most in any 60s is 120.
		b.rec(Record{Sent: at(float64(i) / 2), Tenant: "hot-0", Tier: "free", Result: Result{Status: 200, Source: SourceUpstream, Attempts: 1}})
	}
	b.rec(Record{Sent: at(12), Tier: "free", Result: Result{Status: 403, Source: SourceEnvoy}})
	const circ = "tollgate_store_circuit_state"
	b.scrape(0, 29, map[string]float64{circ: 2}).scrape(1, 29, map[string]float64{circ: 2}).
		scrape(0, 30.5, map[string]float64{circ: 0}).scrape(1, 30.5, map[string]float64{circ: 2}).
		scrape(0, 31.25, map[string]float64{circ: 0}).scrape(1, 31.25, map[string]float64{circ: 0})
	laws := RedisLaws(b.run, LawParams{HotTenant: "hot-0", HotLimit: 100})
	for _, w := range []struct {
		law  string
		want float64
		pass bool
	}{{"every call", 1, false}, {"limits hold", 1.2, false}, {"recovery", 1.25, false}} {
		l := findLaw(t, laws, w.law)
		if math.Abs(l.Measured-w.want) > 1e-9 || l.Pass != w.pass {
			t.Errorf("%s: measured %v pass %v, want %v pass %v", l.Name, l.Measured, l.Pass, w.want, w.pass)
		}
	}

}

// TestBudgetLaws: the budget law compares every tenant that sent a
// request, whatever the upstream accounted, and is not measured when it
// would compare none. The last e2e printed "0 x ()": a law that only
// looped over the upstream's usage passed on an empty map.
func TestBudgetLaws(t *testing.T) {
	t.Parallel()
	served := func(tenant string, estimate, prompt, completion int64) Record {
		return Record{Tenant: tenant, Estimate: estimate,
			Result: Result{Status: 200, Source: SourceUpstream, Attempts: 1, PromptTokens: prompt, CompletionTokens: completion}}
	}
	// a's estimate error is 100 at most (500 - 400), b's 20.
	sent := []Record{served("a", 500, 100, 300), served("a", 420, 100, 300), served("b", 120, 50, 50)}
	denied := Record{Tenant: "c", Estimate: 300, Result: Result{Status: 429, Source: SourceTollgate, Reason: "rate_limited"}}
	dropped := Record{Tenant: "d", Estimate: 300, Dropped: true}
	tests := []struct {
		name         string
		give         []Record
		spend, usage map[string]int64
		want         float64 // NaN: not measured
		wantWho      string
	}{
		{"within one estimate error", sent, map[string]int64{"a": 860, "b": 100}, map[string]int64{"a": 800, "b": 100}, 0.6, "a: spend 860"},
		{"exact", sent, map[string]int64{"a": 800, "b": 100}, map[string]int64{"a": 800, "b": 100}, 0, "a: spend 800"},
		{"over one estimate error", sent, map[string]int64{"a": 800, "b": 150}, map[string]int64{"a": 800, "b": 100}, 2.5, "b: spend 150"},
		{"the upstream accounted no tenant", sent, map[string]int64{"a": 800, "b": 100}, map[string]int64{}, 8, "a: spend 800"},
		{"a denied tenant's reservation kept", append([]Record{denied}, sent...), map[string]int64{"a": 800, "b": 100, "c": 300}, map[string]int64{"a": 800, "b": 100}, 300, "c: spend 300"},
		{"a denied tenant's reservation returned", append([]Record{denied}, sent...), map[string]int64{"a": 800, "b": 100, "c": 0}, map[string]int64{"a": 800, "b": 100}, 0, ""},
		{"a drop sent nothing", append([]Record{dropped}, sent...), map[string]int64{"a": 800, "b": 100}, map[string]int64{"a": 800, "b": 100}, 0, ""},
		{"usage billed to no sender", sent, map[string]int64{"a": 800, "b": 100, "(other)": 0}, map[string]int64{"a": 800, "b": 100, "(other)": 70}, 70, "(other): spend 0"},
		{"a spend not read", sent, map[string]int64{"a": 800}, map[string]int64{"a": 800, "b": 100}, math.NaN(), ""},
		{"no tenant", nil, map[string]int64{}, map[string]int64{}, math.NaN(), ""},
		{"only drops", []Record{dropped}, map[string]int64{}, map[string]int64{}, math.NaN(), ""},
		{"spend not read at all", sent, nil, map[string]int64{"a": 800}, math.NaN(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newRun(10, PhaseSteady, 0.0)
			for _, r := range tt.give {
				b.rec(r)
			}
			l := BudgetLaws(b.run, LawParams{Spend: tt.spend, Usage: tt.usage})[0]
			if math.IsNaN(tt.want) {
				if !math.IsNaN(l.Measured) || l.Pass || l.Note == "" {
					t.Errorf("law = %+v, want not measured, with a note, and not passed", l)
				}
				return
			}
			if math.Abs(l.Measured-tt.want) > 1e-9 || l.Pass != (tt.want <= 1) {
				t.Errorf("measured %v pass %v, want %v", l.Measured, l.Pass, tt.want)
			}
			if !strings.Contains(l.Definition, "the most: "+tt.wantWho) {
				t.Errorf("definition %q does not name %q", l.Definition, tt.wantWho)
			}
		})
	}
}

func TestSteadyLaws(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []Record
		want float64
	}{
		{"a limit denial is configured", []Record{{Sent: at(8), Result: Result{Status: 429, Source: SourceTollgate, Reason: "limit"}}}, 0},
		{"shed and breaker are not", []Record{
			{Sent: at(8), Result: Result{Status: 503, Source: SourceTollgate, Reason: "shed"}},
			{Sent: at(9), Result: Result{Status: 503, Source: SourceTollgate, Reason: "breaker"}},
		}, 2},
		{"in the warm-up", []Record{{Sent: at(2), Result: Result{Status: 503, Source: SourceTollgate, Reason: "shed"}}}, 0},
		{"Envoy's own answer", []Record{{Sent: at(8), Result: Result{Status: 403, Source: SourceEnvoy}}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newRun(20, PhaseSteady, 0.0)
			for _, r := range tt.give {
				b.rec(r)
			}
			l := SteadyLaws(b.run, LawParams{Warmup: 5 * time.Second})[0]
			if l.Measured != tt.want || l.Pass != (tt.want == 0) {
				t.Errorf("measured %v pass %v, want %v", l.Measured, l.Pass, tt.want)
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	laws := []Law{
		newLaw("a | b", "x | y", "<=", 1, 0.5, "s"),
		newLaw("n/a", "", ">=", 1, math.NaN(), "x").noted("not exported"),
	}
	laws[0].Scenario = "spike"
	if err := WriteTable(&buf, laws); err != nil {
		t.Fatal(err)
	}
	want := "| scenario | law | threshold | measured | pass | how it is measured |\n|---|---|---|---|---|---|\n" +
		"| spike | a \\| b | <= 1 s | 0.5 s | pass | x \\| y |\n" +
		"|  | n/a | >= 1 x | n/a (not exported) | FAIL |  |\n"
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}
