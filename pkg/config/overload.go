package config

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// shedding reads the file's shedding policy and checks it with
// limit.Shedding.Check. It returns nil when anything is wrong.
//
// The controller sheds tiers, so it needs the domain's (tiers; hasTiers
// says the file has a tiers: section, nil here when it was wrong) and
// its sheddable tiers must be among their plans.
func (w *walker) shedding(n *yaml.Node, tiers *limit.Tiers, hasTiers bool) *limit.Shedding {
	const path = "shedding"
	before := len(w.problems)
	f, _ := w.mapping(n, path, sheddingKeys)
	if f == nil {
		return nil
	}
	n = w.resolve(n)
	s := &limit.Shedding{}
	at := fields{}
	if v, has := f["steps"]; has {
		v = w.resolve(v)
		if v.Kind != yaml.SequenceNode {
			w.addf(v, path+".steps", "want a list of steps, got %s", describe(v))
		} else {
			for i, c := range v.Content {
				p := fmt.Sprintf("steps[%d]", i)
				at[p] = w.resolve(c)
				s.Steps = append(s.Steps, w.step(c, path+"."+p, p, at))
			}
		}
	}
	if v, has := f["hysteresis"]; has {
		at["hysteresis"] = v
		s.Hysteresis, _ = w.float(v, path+".hysteresis")
	}
	if v, has := f["hold"]; has {
		at["hold"] = v
		s.Hold, _ = w.duration(v, path+".hold")
	}
	if v, has := f["min_factor"]; has {
		at["min_factor"] = v
		s.MinFactor, _ = w.float(v, path+".min_factor")
	}
	if v, has := f["scope"]; has {
		at["scope"] = v
		s.Scope, _ = w.str(v, path+".scope")
	}
	if v, has := f["burst_floor"]; has {
		at["burst_floor"] = v
		s.BurstFloor, _ = w.duration(v, path+".burst_floor")
	}
	s.Shadow = w.flag(f, "shadow", path)
	if v, has := f["control"]; has {
		at["control"] = w.resolve(v)
		s.Control = w.control(v, path+".control", at)
		// A tiers section with problems has reported them and is nil
		// here: the controller is not checked against it.
		if s.Control != nil && (tiers != nil || !hasTiers) {
			w.report(n, path, at, s.CheckTiers(tiers))
		}
	}
	if len(w.problems) != before {
		return nil
	}
	w.report(n, path, at, s.Check())
	if len(w.problems) != before {
		return nil
	}
	return s
}

// control reads shedding.control; Shedding.Check checks its values.
// Its nodes go in at under "control.<field>" for the report.
func (w *walker) control(n *yaml.Node, path string, at fields) *limit.Control {
	f, _ := w.mapping(n, path, controlKeys)
	if f == nil {
		return nil
	}
	c := &limit.Control{}
	if v, has := f["key"]; has {
		at["control.key"] = v
		c.Key, _ = w.str(v, path+".key")
	}
	if v, has := f["capacity"]; has {
		v = w.resolve(v)
		at["control.capacity"] = v
		if v.Kind != yaml.MappingNode {
			w.addf(v, path+".capacity", "want a mapping of upstream to capacity, got %s", describe(v))
		} else {
			c.Capacity = map[string]int64{}
			for i := 0; i+1 < len(v.Content); i += 2 {
				k := w.resolve(v.Content[i])
				name, ok := w.str(k, path+".capacity")
				if !ok {
					continue
				}
				p := path + ".capacity." + name
				if _, dup := c.Capacity[name]; dup {
					w.addf(k, p, "upstream listed twice")
					continue
				}
				at["control.capacity."+name] = v.Content[i+1]
				u, _ := w.uint(v.Content[i+1], p, 1, 1<<31)
				c.Capacity[name] = int64(u)
			}
		}
	}
	if v, has := f["default_capacity"]; has {
		at["control.default_capacity"] = v
		u, _ := w.uint(v, path+".default_capacity", 0, 1<<31)
		c.DefaultCapacity = int64(u)
	}
	for _, fl := range []struct {
		key string
		to  *float64
	}{{"target", &c.Target}, {"quantum", &c.Quantum}} {
		if v, has := f[fl.key]; has {
			at["control."+fl.key] = v
			*fl.to, _ = w.float(v, path+"."+fl.key)
		}
	}
	for _, d := range []struct {
		key string
		to  *time.Duration
	}{{"interval", &c.Interval}, {"window", &c.Window}, {"dwell", &c.Dwell}, {"lease", &c.Lease}, {"grace", &c.Grace}} {
		if v, has := f[d.key]; has {
			at["control."+d.key] = v
			*d.to, _ = w.duration(v, path+"."+d.key)
		}
	}
	if v, has := f["sheddable"]; has {
		c.Sheddable = w.strings(v, path+".sheddable", "control.sheddable", at)
	} else {
		w.addf(w.resolve(n), path, "sheddable is required: the tiers the controller may shed, lowest first")
	}
	return c
}

func (w *walker) step(n *yaml.Node, path, rel string, at fields) limit.ShedStep {
	var st limit.ShedStep
	f, _ := w.mapping(n, path, stepKeys)
	if f == nil {
		return st
	}
	if v, has := f["above"]; !has {
		w.addf(w.resolve(n), path, "above is required")
	} else {
		at[rel+".above"] = v
		st.Above, _ = w.float(v, path+".above")
	}
	if v, has := f["limit_factor"]; has {
		at[rel+".limit_factor"] = v
		st.LimitFactor, _ = w.float(v, path+".limit_factor")
	}
	if v, has := f["shed"]; has {
		st.Shed = w.strings(v, path+".shed", rel+".shed", at)
	}
	if v, has := f["admit_only"]; has {
		st.AdmitOnly = w.strings(v, path+".admit_only", rel+".admit_only", at)
	}
	if _, has := f["burst"]; has {
		st.NoBurst = !w.flag(f, "burst", path)
	}
	st.Continuous = w.flag(f, "continuous", path)
	return st
}

// strings reads a list of strings, remembering each item's node.
func (w *walker) strings(n *yaml.Node, path, rel string, at fields) []string {
	n = w.resolve(n)
	if n.Kind != yaml.SequenceNode {
		w.addf(n, path, "want a list of tiers, got %s", describe(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, c := range n.Content {
		p := fmt.Sprintf("[%d]", i)
		at[rel+p] = c
		s, _ := w.str(c, path+p)
		out = append(out, s)
	}
	return out
}

// breakers reads the file's breakers and checks each with
// limit.BreakerConfig.Check. It returns nil when anything is wrong.
func (w *walker) breakers(n *yaml.Node) []limit.BreakerConfig {
	const path = "breakers"
	before := len(w.problems)
	n = w.resolve(n)
	if n.Kind != yaml.SequenceNode {
		w.addf(n, path, "want a list of breakers, got %s", describe(n))
		return nil
	}
	out := make([]limit.BreakerConfig, 0, len(n.Content))
	keys := map[string]int{}
	for i, c := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		b, ok := w.breaker(c, p)
		if !ok {
			continue
		}
		if first, dup := keys[b.Key]; dup {
			w.addf(w.resolve(c), p+".key", "%q has a breaker already (line %d); one breaker per key", b.Key, first)
			continue
		}
		if b.Key == w.tierKey {
			w.addf(w.resolve(c), p+".key", "%s is the tiers.key; tier entries are removed before matching", b.Key)
			continue
		}
		keys[b.Key] = w.resolve(c).Line
		out = append(out, b)
	}
	if len(w.problems) != before {
		return nil
	}
	return out
}

func (w *walker) breaker(n *yaml.Node, path string) (limit.BreakerConfig, bool) {
	var b limit.BreakerConfig
	before := len(w.problems)
	f, _ := w.mapping(n, path, breakerKeys)
	if f == nil {
		return b, false
	}
	n = w.resolve(n)
	at := fields{}
	if v, has := f["key"]; has {
		at["key"] = v
		b.Key, _ = w.str(v, path+".key")
	}
	for _, u := range []struct {
		name string
		to   *uint64
	}{{"failure_threshold", &b.FailureThreshold}, {"min_requests", &b.MinRequests}, {"half_open_probes", &b.HalfOpenProbes}, {"close_after", &b.CloseAfter}} {
		if v, has := f[u.name]; has {
			at[u.name] = v
			*u.to, _ = w.uint(v, path+"."+u.name, 1, 1<<32)
		}
	}
	if v, has := f["failure_rate"]; has {
		at["failure_rate"] = v
		// 0 means off in limit.BreakerConfig; written out, it is a mistake.
		if r, ok := w.float(v, path+".failure_rate"); ok && r == 0 {
			w.addf(v, path+".failure_rate", "failure_rate must be in (0,1], not 0")
		} else {
			b.FailureRate = r
		}
	}
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"window", &b.Window}, {"open_for", &b.OpenFor}, {"probe_lease", &b.ProbeLease}, {"timeout", &b.Timeout}, {"cache", &b.Cache}} {
		if v, has := f[d.name]; has {
			at[d.name] = v
			*d.to, _ = w.duration(v, path+"."+d.name)
		}
	}
	if len(w.problems) != before {
		return b, false
	}
	w.report(n, path, at, b.Check())
	return b, len(w.problems) == before
}
