package config

import (
	"math"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// tiers reads the file's tiers: {key, default, plans}. It returns nil
// when anything is wrong, after reporting it.
func (w *walker) tiers(n *yaml.Node) *limit.Tiers {
	const path = "tiers"
	before := len(w.problems)
	f, _ := w.mapping(n, path, tiersKeys)
	if f == nil {
		return nil
	}
	n = w.resolve(n)
	t := &limit.Tiers{}
	if v, has := f["key"]; !has {
		w.addf(n, path, "key is required")
	} else if k, ok := w.name(v, path+".key", limit.MaxEntryKeyBytes); ok {
		t.Key, w.tierKey = k, k
	}
	var names []string
	if v, has := f["plans"]; !has {
		w.addf(n, path, "plans is required")
	} else {
		t.Plans, names = w.plans(v, path+".plans")
	}
	// The default should be the most restrictive plan, so that a client
	// gains nothing by sending no tier or a made-up one. That is advice,
	// not an error: a default in the middle is a legitimate choice.
	if v, has := f["default"]; !has {
		w.addf(n, path, "default is required")
	} else if name, ok := w.str(v, path+".default"); ok {
		if _, known := t.Plans[name]; !known && t.Plans != nil {
			w.addf(v, path+".default", "%q is not one of the plans (%s)", name, strings.Join(names, "|"))
		}
		t.Default = name
	}
	if len(w.problems) != before {
		return nil
	}
	return t
}

// plans reads {name: multiplier, ...}; it returns the plans and their
// names in file order, or nil after reporting a problem.
func (w *walker) plans(n *yaml.Node, path string) (map[string]float64, []string) {
	n = w.resolve(n)
	if n.Kind != yaml.MappingNode {
		w.addf(n, path, "want a mapping of plan names to multipliers, got %s", describe(n))
		return nil, nil
	}
	if len(n.Content) == 0 {
		w.addf(n, path, "is empty; list at least one plan, such as {free: 1}")
		return nil, nil
	}
	out := make(map[string]float64, len(n.Content)/2)
	names := make([]string, 0, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	ok := true
	for i := 0; i+1 < len(n.Content) && !w.stopped; i += 2 {
		k := w.resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			w.addf(k, path, "a plan name must be a non-empty string, got %s", describe(k))
			ok = false
			continue
		}
		p := join(path, k.Value)
		if first, dup := lines[k.Value]; dup {
			w.addf(k, p, "plan repeated (first at line %d)", first)
			ok = false
			continue
		}
		lines[k.Value] = k.Line
		m, mok := w.multiplier(n.Content[i+1], p)
		ok = ok && mok
		out[k.Value] = m
		names = append(names, k.Value)
	}
	if !ok {
		return nil, names
	}
	return out, names
}

// multiplier reads a plan's multiplier: a number in (0, 1000].
func (w *walker) multiplier(n *yaml.Node, path string) (float64, bool) {
	n = w.resolve(n)
	var m float64
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") || n.Decode(&m) != nil {
		w.addf(n, path, "want a number such as 2 or 0.5, got %s", describe(n))
		return 0, false
	}
	switch {
	case math.IsNaN(m) || math.IsInf(m, 0):
		w.addf(n, path, "want a finite number, got %s", n.Value)
	case m <= 0:
		w.addf(n, path, "%s is not more than 0", n.Value)
	case m > limit.MaxMultiplier:
		w.addf(n, path, "%s is more than %d", n.Value, limit.MaxMultiplier)
	default:
		return m, true
	}
	return 0, false
}
