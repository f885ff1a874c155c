package limit

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// The configuration of admission's shedding and breaker stages (see
// pkg/admission, which runs them): plain data, so pkg/config fills it
// and a Domain holds it. The state they read (pressure scores, breaker
// state) is reached through admission's Shedder and Breakers, which
// pkg/pressure and pkg/breaker implement.

// Scopes a Shedding policy may read pressure from.
const (
	// ScopeGlobal is the one pressure score of the whole pool.
	ScopeGlobal = "global"
	// ScopeModel reads the score of the request's model (ModelKey), and
	// the global score for a request without a model or for a model the
	// Shedder keeps no score of.
	ScopeModel = "model"
)

// ModelKey is the descriptor entry that names a request's model, for
// ScopeModel. Request.Model, when set, wins over it.
const ModelKey = "model"

// DefaultShedRetryAfter is a shed request's Retry-After when the policy
// has no Hold.
const DefaultShedRetryAfter = time.Second

// ShedStep is one shedding threshold. Steps are cumulative: while step i
// is active every step below it applies too, so a step names only what
// it adds (a step at 0.8 that shrinks limits keeps the free tier shed by the one below).
type ShedStep struct {
	// Above is the pressure at which the step starts to apply (Required),
	// in [0,1].
	Above float64
	// Shed are the tiers refused while the step is active (Optional).
	Shed []string
	// AdmitOnly, when set, are the only tiers admitted while the step is
	// active (Optional). Several active steps admit their intersection.
	AdmitOnly []string
	// LimitFactor scales every limit, in (0,1]; 0 means unchanged
	// (Optional). Several active steps give the smallest.
	LimitFactor float64
	// NoBurst turns token bucket bursts down (burst: false): while it is
	// set every token bucket's burst shrinks to the policy's BurstFloor
	// of its rate (Optional).
	NoBurst bool
	// Continuous scales the step's factor by (1 - pressure), floored at
	// Shedding.MinFactor: limit x LimitFactor x (1 - pressure) (Optional).
	Continuous bool
}

// Shedding is a domain's tier shedding policy (the rules file's
// shedding:), evaluated by pkg/pressure.
type Shedding struct {
	// Steps, in ascending order of Above (Optional; none: never shed).
	Steps []ShedStep
	// Hysteresis: an active step is left only once pressure falls below
	// its Above - Hysteresis (Optional, default 0), in [0,1).
	Hysteresis float64
	// Hold: a step is entered as soon as pressure reaches it, and left no
	// sooner than Hold after the last change of step (Optional, default
	// 0). It is also a shed request's Retry-After (DefaultShedRetryAfter
	// when 0): the admitted tiers cannot loosen sooner.
	Hold time.Duration
	// Shadow reports what the policy would shed and applies nothing
	// (Optional, default false).
	Shadow bool
	// MinFactor floors a Continuous step's factor (Required with a
	// Continuous step), in (0,1].
	MinFactor float64
	// Scope is the pressure a request reads: ScopeGlobal or ScopeModel
	// (Optional, default ScopeGlobal).
	Scope string
	// BurstFloor is what a step with NoBurst leaves of a token bucket's
	// burst: what the bucket refills in BurstFloor, at least 1 and never
	// more than its burst (Optional, default DefaultBurstFloor, at least
	// 1ms). A burst of 1 refuses a steady stream at the bucket's rate
	// whenever two requests come closer than 1/rate, which any real
	// stream does: a shared bucket then refuses the tiers it should
	// serve (issue 13: 2-3% of premium got 429).
	BurstFloor time.Duration
	// Control, when set, sheds fractions of tiers toward an in-flight
	// target per upstream, besides the steps (Optional).
	Control *Control
}

// DefaultBurstFloor is Shedding.BurstFloor's default: one second of the
// bucket's rate.
const DefaultBurstFloor = time.Second

// EffectiveBurstFloor is BurstFloor, or DefaultBurstFloor when unset.
func (s *Shedding) EffectiveBurstFloor() time.Duration {
	if s.BurstFloor == 0 {
		return DefaultBurstFloor
	}
	return s.BurstFloor
}

// FieldError is one invalid field of a configuration value; Path names it
// as the rules file does ("steps[1].above").
type FieldError struct {
	Path, Msg string
}

func (e FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

func joinFields(prefix string, fs []FieldError) error {
	if len(fs) == 0 {
		return nil
	}
	errs := make([]error, len(fs))
	for i, f := range fs {
		errs[i] = f
	}
	if prefix != "" {
		return fmt.Errorf("%s: %w", prefix, errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// Validate checks the policy; its errors name the field, as in
// `steps[1].above: 0.6 is not above steps[0].above 0.7`.
func (s *Shedding) Validate() error { return joinFields("", s.Check()) }

// RetryAfter is what a request this policy shed is told to wait: Hold,
// or DefaultShedRetryAfter without one.
func (s *Shedding) RetryAfter() time.Duration {
	if s.Hold > 0 {
		return s.Hold
	}
	return DefaultShedRetryAfter
}

// Check lists the policy's invalid fields; Validate joins them.
func (s *Shedding) Check() []FieldError {
	var out []FieldError
	bad := func(path, format string, a ...any) { out = append(out, FieldError{path, fmt.Sprintf(format, a...)}) }
	in01 := func(v float64) bool { return !math.IsNaN(v) && v >= 0 && v <= 1 }
	continuous := false
	for i, st := range s.Steps {
		p := fmt.Sprintf("steps[%d]", i)
		switch {
		case !in01(st.Above):
			bad(p+".above", "%v is not in [0,1]", st.Above)
		case i > 0 && st.Above <= s.Steps[i-1].Above:
			bad(p+".above", "%v is not above steps[%d].above %v", st.Above, i-1, s.Steps[i-1].Above)
		}
		if !in01(st.LimitFactor) {
			bad(p+".limit_factor", "%v is not in (0,1] (0: unchanged)", st.LimitFactor)
		}
		checkTiers := func(field string, tiers []string) {
			for j, t := range tiers {
				if t == "" {
					bad(fmt.Sprintf("%s.%s[%d]", p, field, j), "empty tier")
				} else if slices.Index(tiers, t) < j {
					bad(fmt.Sprintf("%s.%s[%d]", p, field, j), "tier %q listed twice", t)
				}
			}
		}
		checkTiers("shed", st.Shed)
		checkTiers("admit_only", st.AdmitOnly)
		if len(st.Shed) == 0 && len(st.AdmitOnly) == 0 && (st.LimitFactor == 0 || st.LimitFactor == 1) && !st.NoBurst && !st.Continuous {
			bad(p, "the step changes nothing (set shed, admit_only, limit_factor, burst or continuous)")
		}
		continuous = continuous || st.Continuous
	}
	if math.IsNaN(s.Hysteresis) || s.Hysteresis < 0 || s.Hysteresis >= 1 {
		bad("hysteresis", "%v is not in [0,1)", s.Hysteresis)
	}
	if s.Hold < 0 {
		bad("hold", "%v is negative", s.Hold)
	}
	switch {
	case continuous && (math.IsNaN(s.MinFactor) || s.MinFactor <= 0 || s.MinFactor > 1):
		bad("min_factor", "%v is not in (0,1], as a continuous step needs", s.MinFactor)
	case !in01(s.MinFactor):
		bad("min_factor", "%v is not in [0,1]", s.MinFactor)
	}
	switch s.Scope {
	case "", ScopeGlobal, ScopeModel:
	default:
		bad("scope", "%q is not one of global|model", s.Scope)
	}
	if s.BurstFloor != 0 && s.BurstFloor < time.Millisecond {
		bad("burst_floor", "%v is not at least 1ms", s.BurstFloor)
	}
	if c := s.Control; c != nil {
		for _, f := range c.Check() {
			f.Path = "control." + f.Path
			out = append(out, f)
		}
		// The Limiter hands the Gate one scope: the upstream's, which the
		// steps read too when they are per model.
		if s.Scope == ScopeModel && c.Key != "" && c.Key != ModelKey {
			bad("control.key", "%q must be %q when scope is model", c.Key, ModelKey)
		}
	}
	return out
}

// DefaultProbeLease is how long a half-open probe holds its slot without
// an outcome when a breaker sets no ProbeLease.
const DefaultProbeLease = time.Minute

// DefaultBreakerCache and MaxBreakerCache bound BreakerConfig.Cache.
const (
	DefaultBreakerCache = 100 * time.Millisecond
	MaxBreakerCache     = 10 * time.Second
)

// BreakerConfig is one circuit breaker declaration (the rules file's
// breakers:), run by pkg/breaker: one breaker per value of Key.
//
// A failure is the upstream failing: a 5xx or 429 it sent, a connection
// it refused, dropped or reset, or Envoy's timeout waiting for it. A
// success is a clean 2xx or 3xx from the upstream. Everything else (the
// client going away, a 408 or another 4xx, a reply by Envoy or a filter)
// counts as neither; docs/outcome-classes.md has the whole table.
type BreakerConfig struct {
	// Key is the descriptor key whose value names the breaker, usually
	// "model" (Required).
	Key string
	// FailureThreshold is how many failures within Window open the
	// breaker (Required, >= 1); with FailureRate or MinRequests, the
	// fewest failures that may open it.
	FailureThreshold uint64
	// FailureRate, when set, also requires failures / (failures +
	// successes) within Window to reach it (Optional, in (0,1]; 0: off).
	FailureRate float64
	// MinRequests, when set, also requires failures + successes within
	// Window to reach it (Optional, >= 1; 0: off). With either of
	// FailureRate and MinRequests the store counts successes too, in
	// buckets of Window/10 (a failure counts for between 0.9 and 1
	// Window), and replicas send them in batches. docs/breaker.md.
	MinRequests uint64
	// Window is how long a failure counts (Required, >= 1ms).
	Window time.Duration
	// OpenFor is how long the breaker stays open before it goes half-open
	// (Required, >= 1ms).
	OpenFor time.Duration
	// HalfOpenProbes is how many probes may be in flight cluster-wide
	// while half-open (Optional; default 1).
	HalfOpenProbes uint64
	// CloseAfter is how many probe successes close it (Optional; default
	// HalfOpenProbes).
	CloseAfter uint64
	// ProbeLease is how long a probe holds its slot without an outcome
	// (Optional; default DefaultProbeLease). Set it above the route's
	// timeout.
	ProbeLease time.Duration
	// Timeout makes a request the client gave up on a failure when the
	// upstream had had the whole request for at least this long without
	// sending a byte back (Optional; default 0: never). A status 0 alone
	// only says the client left, which any client can do. Envoy's own
	// route and per-try timeouts (flag UT) are failures without it.
	Timeout time.Duration
	// Cache is how long a replica answers from the closed state it last
	// read from the store, with no store call (Optional; default
	// DefaultBreakerCache, at most MaxBreakerCache). A breaker opened
	// elsewhere is seen by this replica within Cache. An open breaker is
	// answered locally until its open period ends, however long that is
	// (nothing but time moves it); a half-open one asks the store on
	// every decision.
	Cache time.Duration
}

// WithDefaults returns c with its optional fields filled, or the error of
// Validate.
func (c BreakerConfig) WithDefaults() (BreakerConfig, error) {
	if c.HalfOpenProbes == 0 {
		c.HalfOpenProbes = 1
	}
	if c.CloseAfter == 0 {
		c.CloseAfter = c.HalfOpenProbes
	}
	if c.ProbeLease == 0 {
		c.ProbeLease = DefaultProbeLease
	}
	if c.Cache == 0 {
		c.Cache = DefaultBreakerCache
	}
	return c, c.Validate()
}

// Validate checks c, its optional fields as given (0 is their default).
func (c BreakerConfig) Validate() error {
	return joinFields(fmt.Sprintf("breaker %q", c.Key), c.Check())
}

// Check lists c's invalid fields; Validate joins them.
func (c BreakerConfig) Check() []FieldError {
	var out []FieldError
	if c.Key == "" {
		out = append(out, FieldError{"key", "key is required"})
	}
	if c.FailureThreshold == 0 {
		out = append(out, FieldError{"failure_threshold", "failure_threshold must be at least 1"})
	}
	if math.IsNaN(c.FailureRate) || c.FailureRate < 0 || c.FailureRate > 1 {
		out = append(out, FieldError{"failure_rate", fmt.Sprintf("failure_rate must be in (0,1], not %v", c.FailureRate)})
	}
	for _, d := range []struct {
		name     string
		v        time.Duration
		optional bool
	}{{"window", c.Window, false}, {"open_for", c.OpenFor, false}, {"probe_lease", c.ProbeLease, true}} {
		if d.v < time.Millisecond && !(d.optional && d.v == 0) {
			out = append(out, FieldError{d.name, fmt.Sprintf("%s must be at least 1ms, not %v", d.name, d.v)})
		}
	}
	if c.Timeout < 0 {
		out = append(out, FieldError{"timeout", fmt.Sprintf("timeout must not be negative, not %v", c.Timeout)})
	}
	if c.Cache != 0 && (c.Cache < time.Millisecond || c.Cache > MaxBreakerCache) {
		out = append(out, FieldError{"cache", fmt.Sprintf("cache must be between 1ms and %v, not %v", MaxBreakerCache, c.Cache)})
	}
	return out
}

// checkAdmission checks a domain's shedding and breakers against its
// tiers, for NewRuleSet.
func (d *Domain) checkAdmission() error {
	if d.Shedding != nil {
		if err := d.Shedding.Validate(); err != nil {
			return fmt.Errorf("shedding: %w", err)
		}
		if fs := d.Shedding.CheckTiers(d.Tiers); len(fs) > 0 {
			return fmt.Errorf("shedding: %w", fs[0])
		}
	}
	for i, b := range d.Breakers {
		if err := b.Validate(); err != nil {
			return fmt.Errorf("breakers[%d]: %w", i, err)
		}
		if j := slices.IndexFunc(d.Breakers, func(o BreakerConfig) bool { return o.Key == b.Key }); j < i {
			return fmt.Errorf("breakers[%d]: key %q has a breaker already (breakers[%d])", i, b.Key, j)
		}
		if d.Tiers != nil && b.Key == d.Tiers.Key {
			return fmt.Errorf("breakers[%d]: key %q is the tiers key, whose entries are removed before matching", i, b.Key)
		}
	}
	return nil
}
