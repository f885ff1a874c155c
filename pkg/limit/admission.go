package limit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// The admission order (DESIGN.md §2), cheapest and most global first:
// tier shedding by pressure, then the circuit breakers, then the limits.
// A request refused by an earlier step is charged nothing by a later one.
// The pieces that hold state outside the rules (pressure scores, breaker
// state) are reached through the two small interfaces below, which
// pkg/pressure and pkg/breaker implement; the configuration they read is
// the plain data here, so pkg/config fills it and a Domain holds it.

// Reason says which admission step refused a request.
type Reason uint8

const (
	// ReasonNone: the request was admitted.
	ReasonNone Reason = iota
	// ReasonLimit: a rate limit, token budget or concurrency cap.
	ReasonLimit
	// ReasonShed: the request's tier is shed under the current pressure.
	ReasonShed
	// ReasonBreaker: the circuit breaker of the request's upstream is open
	// (or half-open with every probe slot taken).
	ReasonBreaker
)

func (r Reason) String() string {
	switch r {
	case ReasonLimit:
		return "limit"
	case ReasonShed:
		return "shed"
	case ReasonBreaker:
		return "breaker"
	}
	return "none"
}

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
// it adds (DESIGN.md's 0.8 step shrinks limits and keeps free shed).
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
		if c := d.Shedding.Control; c != nil && d.Tiers == nil {
			return errors.New("shedding: control: the domain has no tiers to shed")
		} else if c != nil {
			for j, t := range c.Sheddable {
				if _, ok := d.Tiers.Plans[t]; !ok {
					return fmt.Errorf("shedding: control.sheddable[%d]: %q is not a plan of tiers", j, t)
				}
			}
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

// ShedState is what pressure does to one request of a tier now.
type ShedState struct {
	// Shed: the tier is refused (in shadow mode: would be).
	Shed bool
	// Shadow: the policy reports and applies nothing; Factor and NoBurst
	// are then ignored.
	Shadow bool
	// Factor scales every limit, in (0,1]; 0 or 1: unchanged.
	Factor float64
	// NoBurst shrinks every token bucket's burst to the policy's
	// BurstFloor of its rate.
	NoBurst bool
}

// Shedder reports the shedding in force; pkg/pressure's Gate is one. It
// is read once per decision of a domain with a Shedding policy, so it
// must be cheap (an atomic load) and never block on a store.
type Shedder interface {
	// Shed is the state of domain's policy at the pressure of scope
	// (ScopeGlobal, or a model's name) for a request of tier. The zero
	// ShedState, for a domain or scope it knows nothing of, changes
	// nothing.
	Shed(domain, scope, tier string) ShedState
}

// BreakerVerdict is a breaker's answer to one request.
type BreakerVerdict struct {
	Allowed bool
	// ProbeID is set when the request was admitted as a half-open probe:
	// its outcome must come back with it (Decision.Probes).
	ProbeID string
	// RetryAfter is set when the request is refused.
	RetryAfter time.Duration
}

// Breakers are the circuit breakers of the domains' BreakerConfigs;
// pkg/breaker's Set is one.
type Breakers interface {
	// Allow asks domain's breaker on key whether the upstream name may be
	// called now. A half-open breaker admits a bounded number of probes.
	Allow(ctx context.Context, now time.Time, domain, key, name string) (BreakerVerdict, error)
	// Release frees a probe slot Allow gave to a request that then did
	// not go upstream (a limit refused it), without counting an outcome.
	Release(ctx context.Context, now time.Time, domain, key, name, probeID string) error
}

// Probe is a half-open breaker's probe that an admitted request holds:
// its outcome must be reported with ID (ext_authz puts it in the dynamic
// metadata, and the access log brings it back).
type Probe struct {
	// Key is the breaker's descriptor key, Name its value.
	Key, Name string
	ID        string
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithShedder makes the Limiter shed by pressure, for domains with a
// Shedding policy.
func WithShedder(s Shedder) Option { return func(l *Limiter) { l.shedder = s } }

// WithBreakers makes the Limiter consult circuit breakers, for domains
// with Breakers.
func WithBreakers(b Breakers) Option { return func(l *Limiter) { l.breakers = b } }

// Value is the value of the first entry named key in r's descriptors;
// for ModelKey, r.Model first: the name of r's breaker on key.
func (r *Request) Value(key string) string { return valueOf(r, key) }

// valueOf is the value of the first entry named key in req's
// descriptors; for ModelKey, Request.Model first.
func valueOf(req *Request, key string) string {
	if key == ModelKey && req.Model != "" {
		return req.Model
	}
	for i := range req.Descriptors {
		for _, e := range req.Descriptors[i].Entries {
			if e.Key == key {
				return e.Value
			}
		}
	}
	return ""
}

// maySettle says whether every descriptor of req is a refund or carries
// its own hits_addend: only such a request can be all refunds and cost
// reports (build tells, from the rules). It keeps shedding's refusal
// from matching rules for any other request.
func maySettle(req *Request) bool {
	for i := range req.Descriptors {
		if d := &req.Descriptors[i]; !d.Negative && !d.HitsSet {
			return false
		}
	}
	return true
}

// releaseTimeout bounds giving probes back, which runs even when the
// caller has given up.
const releaseTimeout = time.Second

// adjust is what pressure does to the limits of an admitted request.
type adjust struct {
	micro   uint64 // factor in millionths; MicroOne: unchanged
	noBurst bool
	floor   time.Duration // with noBurst: Shedding.EffectiveBurstFloor
}

var noAdjust = adjust{micro: MicroOne}

// apply returns l scaled by a, or l itself when a changes nothing.
func (a adjust) apply(l *Limit) *Limit {
	if l == nil || (a.micro == MicroOne && (!a.noBurst || l.Algorithm != TokenBucket)) {
		return l
	}
	c := *Scaled(l, a.micro)
	if c.Algorithm == TokenBucket && a.noBurst {
		c.Burst = burstFloor(&c, a.floor)
	}
	return &c
}

// burstFloor is the burst l keeps with bursts turned down: what it
// refills in floor (rounded up), at least 1, at most its burst.
func burstFloor(l *Limit, floor time.Duration) uint64 {
	b := l.EffectiveBurst()
	w := l.Window()
	if w <= 0 || floor <= 0 {
		return 1
	}
	// A float: Amount x floor can pass 2^64 ns; the rounding cannot
	// matter at the sizes where float64 rounds.
	f := math.Ceil(float64(l.Amount) * float64(floor) / float64(w))
	if f >= float64(b) {
		return b
	}
	return max(uint64(f), 1)
}

// shed runs the shedding step: it reports whether the request is
// refused, and otherwise how its limits change.
func (l *Limiter) shed(dom *Domain, req *Request, dec *Decision) (adjust, bool) {
	if l.shedder == nil || dom.Shedding == nil {
		return noAdjust, false
	}
	scope := ScopeGlobal
	if c := dom.Shedding.Control; c != nil {
		// The controller's fractions are per upstream; the Gate falls
		// back to the global steps for an upstream without its own.
		if u := valueOf(req, c.KeyName()); u != "" {
			scope = u
		}
	} else if dom.Shedding.Scope == ScopeModel {
		if m := valueOf(req, ModelKey); m != "" {
			scope = m
		}
	}
	tier, _ := dom.Plan(req)
	st := l.shedder.Shed(dom.Name, scope, tier)
	if st.Shadow {
		dec.ShadowShed = st.Shed
		return noAdjust, false
	}
	if st.Shed {
		return noAdjust, true
	}
	a := adjust{micro: MicroOne, noBurst: st.NoBurst, floor: dom.Shedding.EffectiveBurstFloor()}
	if st.Factor > 0 && st.Factor < 1 {
		a.micro = max(uint64(st.Factor*MicroOne), 1)
	}
	return a, false
}

// refuse marks dec as refused for reason before any limit: every
// descriptor over limit, with no limit to report.
func refuse(dec *Decision, reason Reason, retry time.Duration) {
	dec.Code, dec.Reason, dec.RetryAfter = CodeOverLimit, reason, retry
	for i := range dec.Statuses {
		dec.Statuses[i].Code = CodeOverLimit
		dec.Statuses[i].RetryAfter = retry
	}
}

// allowBreakers runs the breaker step: each of dom's breakers whose key
// the request carries. It returns the probes taken, or refuses dec (and
// gives back the probes taken before the refusal).
func (l *Limiter) allowBreakers(ctx context.Context, now time.Time, dom *Domain, req *Request, dec *Decision) (bool, error) {
	if l.breakers == nil {
		return true, nil
	}
	for _, b := range dom.Breakers {
		name := valueOf(req, b.Key)
		if name == "" {
			continue
		}
		v, err := l.breakers.Allow(ctx, now, dom.Name, b.Key, name)
		if err != nil {
			l.release(ctx, now, dom, dec)
			return false, fmt.Errorf("breaker %s: %w", b.Key, err)
		}
		if !v.Allowed {
			l.release(ctx, now, dom, dec)
			refuse(dec, ReasonBreaker, v.RetryAfter)
			return false, nil
		}
		if v.ProbeID != "" {
			dec.Probes = append(dec.Probes, Probe{Key: b.Key, Name: name, ID: v.ProbeID})
		}
	}
	return true, nil
}

// release gives back the probes dec holds: the request will not go
// upstream, so its probe would otherwise hold a half-open slot for the
// whole ProbeLease (and a tenant at its limit could keep a breaker from
// closing). Releasing counts neither success nor failure. A release that
// fails is left to the lease, which bounds it; the decision stands.
func (l *Limiter) release(ctx context.Context, now time.Time, dom *Domain, dec *Decision) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	for _, p := range dec.Probes {
		_ = l.breakers.Release(ctx, now, dom.Name, p.Key, p.Name, p.ID)
	}
	dec.Probes = nil
}
