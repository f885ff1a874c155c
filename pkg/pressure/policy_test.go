package pressure

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

var t0 = time.UnixMilli(1_700_000_000_000)

// designPolicy is the design's example policy, with hysteresis and a hold.
func designPolicy() *Policy {
	return &Policy{
		Steps: []Step{
			{Above: 0.7, Shed: []string{"free"}},
			{Above: 0.8, LimitFactor: 0.7, NoBurst: true},
			{Above: 0.9, AdmitOnly: []string{"premium"}},
		},
		Hysteresis: 0.05,
		Hold:       10 * time.Second,
	}
}

var tiers = []string{"premium", "standard", "free"}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give Policy
		want string // substring of the error; "" for none
	}{
		{name: "Design", give: *designPolicy()},
		{name: "Empty", give: Policy{}},
		{name: "Continuous", give: Policy{Steps: []Step{{Above: 0.5, Continuous: true}}, MinFactor: 0.1}},
		{name: "AboveRange", give: Policy{Steps: []Step{{Above: 1.5, Shed: []string{"free"}}}}, want: "steps[0].above: 1.5 is not in [0,1]"},
		{name: "AboveNaN", give: Policy{Steps: []Step{{Above: math.NaN(), Shed: []string{"free"}}}}, want: "steps[0].above: NaN"},
		{name: "NotAscending", give: Policy{Steps: []Step{{Above: 0.7, Shed: []string{"free"}}, {Above: 0.7, NoBurst: true}}}, want: "steps[1].above: 0.7 is not above steps[0].above 0.7"},
		{name: "Factor", give: Policy{Steps: []Step{{Above: 0.7, LimitFactor: 1.2}}}, want: "steps[0].limit_factor: 1.2"},
		{name: "NegativeFactor", give: Policy{Steps: []Step{{Above: 0.7, LimitFactor: -0.5}}}, want: "steps[0].limit_factor: -0.5"},
		{name: "EmptyTier", give: Policy{Steps: []Step{{Above: 0.7, Shed: []string{""}}}}, want: "steps[0].shed[0]: empty tier"},
		{name: "DuplicateTier", give: Policy{Steps: []Step{{Above: 0.7, AdmitOnly: []string{"a", "a"}}}}, want: `steps[0].admit_only[1]: tier "a" listed twice`},
		{name: "NoOp", give: Policy{Steps: []Step{{Above: 0.7, LimitFactor: 1}}}, want: "steps[0]: the step changes nothing"},
		{name: "Hysteresis", give: Policy{Hysteresis: 1}, want: "hysteresis: 1 is not in [0,1)"},
		{name: "Hold", give: Policy{Hold: -time.Second}, want: "hold: -1s is negative"},
		{name: "MinFactorNeeded", give: Policy{Steps: []Step{{Above: 0.5, Continuous: true}}}, want: "min_factor: 0 is not in (0,1]"},
		{name: "MinFactorRange", give: Policy{MinFactor: 2}, want: "min_factor: 2 is not in [0,1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.give.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := NewEvaluator(&Policy{Hold: -1}, storetest.NewFakeClock(t0)); err == nil {
		t.Error("NewEvaluator accepted an invalid policy")
	}
}

func newEval(t testing.TB, p *Policy) (*Evaluator, *storetest.FakeClock) {
	t.Helper()
	clock := storetest.NewFakeClock(t0)
	e, err := NewEvaluator(p, clock)
	if err != nil {
		t.Fatal(err)
	}
	return e, clock
}

func admitted(o Outcome) []string {
	var out []string
	for _, t := range tiers {
		if o.Admits(t) {
			out = append(out, t)
		}
	}
	return out
}

// TestRamp walks the example policy up and down with the clock.
func TestRamp(t *testing.T) {
	t.Parallel()
	e, clock := newEval(t, designPolicy())
	steps := []struct {
		advance  time.Duration
		pressure float64
		level    int
		admitted string
		factor   float64
		noBurst  bool
	}{
		{0, 0, -1, "premium,standard,free", 1, false},
		{time.Second, 0.75, 0, "premium,standard", 1, false},
		{time.Second, 0.85, 1, "premium,standard", 0.7, true},
		{time.Second, 0.95, 2, "premium", 0.7, true},
		{time.Second, 0.5, 2, "premium", 0.7, true},     // held
		{8 * time.Second, 0.5, 2, "premium", 0.7, true}, // 9s after entering
		{time.Second, 0.5, -1, "premium,standard,free", 1, false},
		{time.Second, 0.72, 0, "premium,standard", 1, false},
		{20 * time.Second, 0.66, 0, "premium,standard", 1, false}, // hysteresis: 0.66 >= 0.65
		{time.Second, 0.64, -1, "premium,standard,free", 1, false},
		{time.Second, 0.86, 1, "premium,standard", 0.7, true},
		{20 * time.Second, 0.72, 0, "premium,standard", 1, false}, // 0.72 < 0.75: leave step 1, keep step 0
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		e.Update(s.pressure)
		o := e.Outcome()
		got := strings.Join(admitted(o), ",")
		if o.Level != s.level || got != s.admitted || o.Factor != s.factor || o.NoBurst != s.noBurst || o.Pressure != s.pressure {
			t.Errorf("step %d (p=%v): level %d admits %s factor %v noBurst %v pressure %v; want %d %s %v %v",
				i, s.pressure, o.Level, got, o.Factor, o.NoBurst, o.Pressure, s.level, s.admitted, s.factor, s.noBurst)
		}
	}
}

func TestContinuousAndShadow(t *testing.T) {
	t.Parallel()
	p := &Policy{
		Steps: []Step{
			{Above: 0.5, LimitFactor: 0.8, Continuous: true},
			{Above: 0.9, LimitFactor: 0.9, Shed: []string{"free"}},
		},
		MinFactor: 0.1,
	}
	e, _ := newEval(t, p)
	tests := []struct {
		give float64
		want float64
	}{
		{0.4, 1}, {0.5, 0.4}, {0.75, 0.2}, {0.9, 0.08 + 0.02}, {1, 0.1},
	}
	for _, tt := range tests {
		e.Update(tt.give)
		if got := e.Outcome().Factor; math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Factor at %v = %v, want %v", tt.give, got, tt.want)
		}
	}
	p.Shadow = true
	s, _ := newEval(t, p)
	s.Update(0.95)
	o := s.Outcome()
	if !o.Admits("free") || !o.Sheds("free") || o.Sheds("premium") || o.Level != 1 {
		t.Errorf("shadow at 0.95: Admits(free)=%v Sheds(free)=%v Sheds(premium)=%v level %d; want true true false 1",
			o.Admits("free"), o.Sheds("free"), o.Sheds("premium"), o.Level)
	}
	if f, nb := o.Applied(); f != 1 || nb {
		t.Errorf("shadow Applied() = %v, %v; want 1, false", f, nb)
	}
	if o.Factor != 0.1 {
		t.Errorf("shadow Factor = %v, want 0.1 (what would apply)", o.Factor)
	}
}

func TestUpdateClampsAndIgnoresNaN(t *testing.T) {
	t.Parallel()
	e, _ := newEval(t, designPolicy())
	e.Update(7)
	if o := e.Outcome(); o.Level != 2 || o.Pressure != 1 {
		t.Errorf("Update(7): level %d pressure %v, want 2 1", o.Level, o.Pressure)
	}
	e.Update(math.NaN())
	if o := e.Outcome(); o.Pressure != 1 {
		t.Errorf("Update(NaN) changed pressure to %v", o.Pressure)
	}
}

func TestAdmitOnlyIntersects(t *testing.T) {
	t.Parallel()
	e, _ := newEval(t, &Policy{Steps: []Step{
		{Above: 0.5, AdmitOnly: []string{"premium", "standard"}},
		{Above: 0.6, AdmitOnly: []string{"premium", "free"}},
		{Above: 0.7, AdmitOnly: []string{"free"}},
	}})
	for _, tt := range []struct {
		give float64
		want string
	}{{0.55, "premium,standard"}, {0.65, "premium"}, {0.75, ""}} {
		e.Update(tt.give)
		if got := strings.Join(admitted(e.Outcome()), ","); got != tt.want {
			t.Errorf("at %v admits %q, want %q", tt.give, got, tt.want)
		}
	}
}

func randomPolicy(r *rand.Rand) *Policy {
	p := &Policy{Hysteresis: r.Float64() * 0.2, Hold: time.Duration(r.IntN(20)) * time.Second}
	above := 0.0
	for range 1 + r.IntN(4) {
		above += 0.05 + r.Float64()*0.2
		if above > 1 {
			break
		}
		s := Step{Above: above, NoBurst: r.IntN(2) == 0}
		if r.IntN(2) == 0 {
			s.Shed = []string{tiers[2-r.IntN(2)]}
		}
		if r.IntN(4) == 0 {
			s.AdmitOnly = []string{"premium"}
		}
		if r.IntN(2) == 0 {
			s.LimitFactor = 0.1 + 0.9*r.Float64()
		}
		if len(s.Shed) == 0 && len(s.AdmitOnly) == 0 && s.LimitFactor == 0 {
			s.NoBurst = true
		}
		p.Steps = append(p.Steps, s)
	}
	return p
}

// TestProperties feeds random pressure sequences at random intervals to
// random policies and checks, at every reading:
//   - a lower step is entered no sooner than Hold after the last change
//     (the admitted tiers loosen at most once per Hold);
//   - hysteresis: a step is left only below its Above - Hysteresis;
//   - a step is entered as soon as pressure reaches it;
//   - monotone: more pressure never admits a tier less pressure sheds, nor
//     gives a larger factor, at steady state (fresh evaluators);
//   - shadow reports exactly what the enforcing policy sheds.
func TestProperties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		p := randomPolicy(r)
		if err := p.Validate(); err != nil {
			t.Fatalf("random policy %+v: %v", p, err)
		}
		e, clock := newEval(t, p)
		sp := *p
		sp.Shadow = true
		s, _ := newEval(t, &sp)
		s.clock = clock
		last := -1
		lastChange := t0
		downs := 0
		center := r.Float64()
		for range 500 {
			clock.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
			pr := min(max(center+(r.Float64()-0.5)*0.3, 0), 1)
			e.Update(pr)
			s.Update(pr)
			o := e.Outcome()
			now := clock.Now()
			if o.Level != last {
				if o.Level < last {
					downs++
					if gap := now.Sub(lastChange); gap < p.Hold {
						t.Fatalf("iter %d: left step %d for %d after %v < hold %v", iter, last, o.Level, gap, p.Hold)
					}
					if pr >= p.Steps[last].Above-p.Hysteresis {
						t.Fatalf("iter %d: left step %d at %v, within hysteresis of %v", iter, last, pr, p.Steps[last].Above)
					}
				}
				last, lastChange = o.Level, now
			}
			for i, st := range p.Steps {
				if pr >= st.Above && o.Level < i {
					t.Fatalf("iter %d: pressure %v reached step %d but level is %d", iter, pr, i, o.Level)
				}
			}
			so := s.Outcome()
			if so.Level != o.Level {
				t.Fatalf("iter %d: shadow level %d, enforcing %d", iter, so.Level, o.Level)
			}
			for _, tier := range tiers {
				if !so.Admits(tier) || so.Sheds(tier) != o.Sheds(tier) {
					t.Fatalf("iter %d: shadow Admits(%s)=%v Sheds=%v, enforcing Sheds=%v", iter, tier, so.Admits(tier), so.Sheds(tier), o.Sheds(tier))
				}
			}
			if p.Hold > 0 && downs > int(now.Sub(t0)/p.Hold) {
				t.Fatalf("iter %d: loosened %d times in %v with hold %v", iter, downs, now.Sub(t0), p.Hold)
			}
		}
		// Monotone at steady state.
		a, b := r.Float64(), r.Float64()
		if a > b {
			a, b = b, a
		}
		lo, _ := newEval(t, p)
		hi, _ := newEval(t, p)
		lo.Update(a)
		hi.Update(b)
		ol, oh := lo.Outcome(), hi.Outcome()
		for _, tier := range tiers {
			if oh.Admits(tier) && !ol.Admits(tier) {
				t.Fatalf("iter %d: %v admits %s but %v does not", iter, b, tier, a)
			}
		}
		if oh.Factor > ol.Factor || (ol.NoBurst && !oh.NoBurst) {
			t.Fatalf("iter %d: factor/noBurst at %v = %v/%v, at %v = %v/%v", iter, b, oh.Factor, oh.NoBurst, a, ol.Factor, ol.NoBurst)
		}
	}
}

// TestFlapping oscillates pressure around a threshold every 100ms: the
// admitted tiers loosen at most once per hold.
func TestFlapping(t *testing.T) {
	t.Parallel()
	p := designPolicy()
	e, clock := newEval(t, p)
	loosened := 0
	prev := len(admitted(e.Outcome()))
	const run = 5 * time.Minute
	for i := range int(run / (100 * time.Millisecond)) {
		clock.Advance(100 * time.Millisecond)
		if i%2 == 0 {
			e.Update(0.71)
		} else {
			e.Update(0.6)
		}
		if n := len(admitted(e.Outcome())); n > prev {
			loosened++
			prev = n
		} else {
			prev = n
		}
	}
	if max := int(run / p.Hold); loosened > max {
		t.Errorf("admitted tiers loosened %d times in %v, want at most %d (hold %v)", loosened, run, max, p.Hold)
	}
	if loosened == 0 {
		t.Error("never loosened: pressure 0.6 is below the hysteresis band and should leave the step")
	}
}

func BenchmarkOutcomeAdmits(b *testing.B) {
	e, _ := newEval(b, designPolicy())
	e.Update(0.85)
	for b.Loop() {
		o := e.Outcome()
		if o.Admits("free") {
			b.Fatal("free admitted at 0.85")
		}
	}
}
