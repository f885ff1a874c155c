package limit

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// Defaults of a Control (the rules file's shedding.control).
const (
	DefaultControlTarget   = 1.0
	DefaultControlInterval = 250 * time.Millisecond
	DefaultControlWindow   = 2 * time.Second
	DefaultControlDwell    = 15 * time.Second
	DefaultControlQuantum  = 0.1
	DefaultControlLease    = 2 * time.Minute
	DefaultControlGrace    = 10 * time.Second
)

// Control is a domain's overload controller (the rules file's
// shedding.control), run by pkg/pressure: per upstream (the value of Key
// in a request), it counts the requests in flight cluster-wide against
// the upstream's capacity and sheds a fraction of the sheddable tiers,
// lowest first, so that in-flight settles at Target x Capacity.
// docs/overload-control.md explains each field and how to size it.
type Control struct {
	// Key is the descriptor entry naming the upstream (Optional; default
	// "model").
	Key string
	// Capacity is, per upstream, the requests it serves at once (its
	// slots, not its queue) (Optional; an upstream not listed gets
	// DefaultCapacity).
	Capacity map[string]int64
	// DefaultCapacity is the capacity of the upstreams the domain's rules
	// name with an exact value of Key and Capacity does not list
	// (Optional; default 0: only the upstreams in Capacity are
	// controlled). An upstream no rule names is never controlled, so a
	// client cannot make scopes up.
	DefaultCapacity int64
	// Target is the in-flight aimed at, as a fraction of capacity
	// (Optional; default 1), in (0, 4].
	Target float64
	// Sheddable are the tiers the controller may shed, lowest first
	// (Required, at least one); every other tier gets its demand first.
	Sheddable []string
	// Interval is how often the controller decides (Optional; default
	// 250ms), in [10ms, 10s].
	Interval time.Duration
	// Window is how far back offered and admitted rates are measured
	// (Optional; default 2s), at least 2 intervals and at most 200.
	Window time.Duration
	// Dwell is how long after its last change a fraction may loosen
	// (Optional; default 15s); tightening is never held back.
	Dwell time.Duration
	// Quantum is the step fractions move by (Optional; default 0.1), in
	// [0.01, 0.5].
	Quantum float64
	// Lease ends a flight whose completion never came (Optional; default
	// 2m): set it above the longest request, streams included.
	Lease time.Duration
	// Grace is how long the last shared state stands while the store
	// fails (Optional; default 10s); past it the controller sheds nothing
	// and the steps run on local signals.
	Grace time.Duration
}

// WithDefaults returns c with its optional fields filled.
func (c Control) WithDefaults() Control {
	if c.Key == "" {
		c.Key = ModelKey
	}
	if c.Target == 0 {
		c.Target = DefaultControlTarget
	}
	if c.Interval == 0 {
		c.Interval = DefaultControlInterval
	}
	if c.Window == 0 {
		c.Window = DefaultControlWindow
	}
	if c.Dwell == 0 {
		c.Dwell = DefaultControlDwell
	}
	if c.Quantum == 0 {
		c.Quantum = DefaultControlQuantum
	}
	if c.Lease == 0 {
		c.Lease = DefaultControlLease
	}
	if c.Grace == 0 {
		c.Grace = DefaultControlGrace
	}
	return c
}

// CheckTiers lists what is wrong with s's controller against its
// domain's tiers t (nil when the domain has none): the controller sheds
// tiers, so it needs them, and each tier it may shed must be one of their
// plans. It is the one check of both for the rule parser, which reports
// each at its line, and NewRuleSet. Paths are relative to shedding, as
// Check's are; an empty tier is Check's to report.
func (s *Shedding) CheckTiers(t *Tiers) []FieldError {
	if s.Control == nil {
		return nil
	}
	if t == nil {
		return []FieldError{{"control", "the controller sheds tiers: the file needs tiers"}}
	}
	var out []FieldError
	for j, name := range s.Control.Sheddable {
		if _, ok := t.Plans[name]; !ok && name != "" {
			out = append(out, FieldError{fmt.Sprintf("control.sheddable[%d]", j), fmt.Sprintf("%q is not a plan of tiers", name)})
		}
	}
	return out
}

// Check lists c's invalid fields, its optional ones as given (0 is their
// default); paths are relative to control.
func (c *Control) Check() []FieldError {
	var out []FieldError
	bad := func(path, format string, a ...any) { out = append(out, FieldError{path, fmt.Sprintf(format, a...)}) }
	names := make([]string, 0, len(c.Capacity))
	for n := range c.Capacity {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch v := c.Capacity[n]; {
		case n == "":
			bad("capacity", "an empty upstream name")
		case v < 1:
			bad("capacity."+n, "%d is not at least 1", v)
		}
	}
	if c.DefaultCapacity < 0 {
		bad("default_capacity", "%d is negative", c.DefaultCapacity)
	}
	if len(c.Capacity) == 0 && c.DefaultCapacity == 0 {
		bad("capacity", "no upstream has a capacity (set capacity or default_capacity)")
	}
	if c.Target != 0 && (math.IsNaN(c.Target) || c.Target <= 0 || c.Target > 4) {
		bad("target", "%v is not in (0,4]", c.Target)
	}
	if len(c.Sheddable) == 0 {
		bad("sheddable", "at least one tier is required")
	}
	for j, t := range c.Sheddable {
		if t == "" {
			bad(fmt.Sprintf("sheddable[%d]", j), "empty tier")
		} else if slices.Index(c.Sheddable, t) < j {
			bad(fmt.Sprintf("sheddable[%d]", j), "tier %q listed twice", t)
		}
	}
	d := c.WithDefaults()
	if c.Interval != 0 && (c.Interval < 10*time.Millisecond || c.Interval > 10*time.Second) {
		bad("interval", "%v is not in [10ms,10s]", c.Interval)
	}
	if c.Window != 0 && (d.Window < 2*d.Interval || d.Window > 200*d.Interval) {
		bad("window", "%v is not between 2 and 200 intervals of %v", c.Window, d.Interval)
	}
	if c.Dwell < 0 {
		bad("dwell", "%v is negative", c.Dwell)
	}
	if c.Quantum != 0 && (math.IsNaN(c.Quantum) || c.Quantum < 0.01 || c.Quantum > 0.5) {
		bad("quantum", "%v is not in [0.01,0.5]", c.Quantum)
	}
	if c.Lease != 0 && c.Lease < time.Second {
		bad("lease", "%v is under 1s", c.Lease)
	}
	if c.Grace < 0 {
		bad("grace", "%v is negative", c.Grace)
	}
	return out
}

// KeyName is Key, or its default.
func (c *Control) KeyName() string {
	if c.Key == "" {
		return ModelKey
	}
	return c.Key
}

// CapacityOf is upstream's capacity, 0 when it is not controlled; named
// says whether the domain's rules name it (see DefaultCapacity).
func (c *Control) CapacityOf(upstream string, named bool) int64 {
	if v, ok := c.Capacity[upstream]; ok {
		return v
	}
	if named {
		return c.DefaultCapacity
	}
	return 0
}
