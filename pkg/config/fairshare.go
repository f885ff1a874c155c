package config

import (
	"math"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fairShareKeys are a rule's fair_share keys (docs/fair-share.md).
var fairShareKeys = []string{"key", "weights", "default_weight", "min_share", "backlog", "quantum", "credit", "max_keys"}

// defaultFairMaxKeys is max_keys when a rule sets none: every decision on
// the shared limit reads and writes the whole state, so its size is the
// cost of each decision (docs/fair-share.md, "Where the state lives").
const defaultFairMaxKeys = 256

// maxFairCost bounds quantum and credit: costs are counted exactly in a
// float64, as Lua counts.
const maxFairCost = 1 << 53

// fairShare reads a rule's fair_share; r is the rule with its limits
// already read, f the rule's keys. nil after a problem (recorded).
//
//	fair_share:
//	  key: tenant            # (Required) the descriptor entry whose values share the rule's limits
//	  weights: plan          # (Optional) plan: the plan multiplier (needs tiers); or {value: weight}, each in (0,1000]; default every member weighs default_weight
//	  default_weight: 1      # (Optional, weights map only) weight of a value not listed, in (0,1000]; default 1
//	  min_share: 0.05        # (Optional) the least share of a member with demand, in [0,1); default 0
//	  backlog: 1m            # (Optional) how long a denial keeps a member waiting, >= 1ms; default 1s or the window if shorter
//	  quantum: 1             # (Optional) cost a member may run ahead whatever the room, >= 1; default 1
//	  credit: 30             # (Optional) most cost a member of weight 1 can be owed (w x for weight w), >= quantum; default 1/20 of what the limit admits in a backlog
//	  max_keys: 256          # (Optional) members kept, 1..1024 (others share one); default 256
func (w *walker) fairShare(n *yaml.Node, path string, r *limit.Rule, rule map[string]*yaml.Node) *limit.FairShare {
	before := len(w.problems)
	f, _ := w.mapping(n, path, fairShareKeys)
	if f == nil {
		return nil
	}
	n = w.resolve(n)
	fs := &limit.FairShare{DefaultWeight: 1}
	if v, has := f["key"]; !has {
		w.addf(n, path, "key is required: the descriptor entry whose values share the limits")
	} else if k, ok := w.name(v, path+".key", limit.MaxEntryKeyBytes); ok {
		fs.Key = k
	}
	if v, has := f["weights"]; has {
		w.fairWeights(v, path+".weights", fs)
	}
	if v, has := f["default_weight"]; has {
		if fs.Plan {
			w.addf(v, path+".default_weight", "applies only to a weights map; with weights: plan every request has a plan (tiers.default when it names none)")
		} else if m, ok := w.multiplier(v, path+".default_weight"); ok {
			fs.DefaultWeight = m
		}
	}
	p := limit.FairPolicy{Quantum: 1, MaxKeys: defaultFairMaxKeys}
	if v, has := f["min_share"]; has {
		if s, ok := w.float(v, path+".min_share"); ok {
			if s < 0 || s >= 1 {
				w.addf(v, path+".min_share", "%v is not in [0,1); it is a fraction of the limit", s)
			}
			p.MinShare = s
		}
	}
	if v, has := f["backlog"]; has {
		if d, ok := w.duration(v, path+".backlog"); ok {
			if d < time.Millisecond {
				w.addf(v, path+".backlog", "%s is less than 1ms; the state counts in milliseconds", d)
			}
			p.Backlog = d
		}
	}
	if v, has := f["quantum"]; has {
		if q, ok := w.float(v, path+".quantum"); ok {
			if q < 1 || q > maxFairCost {
				w.addf(v, path+".quantum", "%v is not in [1,%d]", q, uint64(maxFairCost))
			}
			p.Quantum = q
		}
	}
	credit, creditSet := 0.0, false
	if v, has := f["credit"]; has {
		if c, ok := w.float(v, path+".credit"); ok {
			switch {
			case c > maxFairCost:
				w.addf(v, path+".credit", "%v is more than %d", c, uint64(maxFairCost))
			case c < p.Quantum:
				w.addf(v, path+".credit", "%v is less than quantum %v; a member must be owed at least one quantum", c, p.Quantum)
			}
			credit, creditSet = c, true
		}
	}
	if v, has := f["max_keys"]; has {
		if m, ok := w.uint(v, path+".max_keys", 1, limit.FairMaxKeys); ok {
			p.MaxKeys = int(m)
		}
	}
	switch {
	case r.Unlimited:
		w.addf(n, path, "the rule is unlimited (rate_limit.unlimited: true); there is no limit to share")
	case r.RateLimit == nil && r.TokenLimit == nil && rule["rate_limit"] == nil && rule["token_limit"] == nil:
		// max_concurrent caps requests in flight per value: a lease
		// set has no room to share by weight.
		w.addf(n, path, "needs a rate_limit or token_limit to share; max_concurrent is not shared")
	}
	if len(w.problems) != before || (r.RateLimit == nil && r.TokenLimit == nil) {
		return nil // a limit that failed to read was reported there
	}
	fs.Rate = fairPolicy(p, r.RateLimit, credit, creditSet)
	fs.Token = fairPolicy(p, r.TokenLimit, credit, creditSet)
	return fs
}

// fairWeights reads weights: plan, or a mapping of member value to weight.
func (w *walker) fairWeights(n *yaml.Node, path string, fs *limit.FairShare) {
	n = w.resolve(n)
	if n.Kind == yaml.ScalarNode {
		switch {
		case n.Value != "plan":
			w.addf(n, path, "want plan or a mapping of values to weights, got %s", describe(n))
		case w.tierKey == "":
			w.addf(n, path, "plan weighs each member by its plan multiplier, and this file has no tiers")
		default:
			fs.Plan = true
		}
		return
	}
	if n.Kind != yaml.MappingNode {
		w.addf(n, path, "want plan or a mapping of values to weights, got %s", describe(n))
		return
	}
	if len(n.Content) == 0 {
		w.addf(n, path, "is empty; list at least one value, such as {acme: 3}, or leave weights out")
		return
	}
	fs.Weights = make(map[string]float64, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content) && !w.stopped; i += 2 {
		k := w.resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			w.addf(k, path, "a value must be a non-empty string, got %s", describe(k))
			continue
		}
		p := join(path, k.Value)
		if len(k.Value) > limit.MaxValueBytes {
			w.addf(k, p, "is %d bytes, more than %d; no descriptor value is that long", len(k.Value), limit.MaxValueBytes)
			continue
		}
		if first, dup := lines[k.Value]; dup {
			w.addf(k, p, "value repeated (first at line %d)", first)
			continue
		}
		lines[k.Value] = k.Line
		if m, ok := w.multiplier(n.Content[i+1], p); ok {
			fs.Weights[k.Value] = m
		}
	}
}

// DefaultFairBacklog is a fair-shared limit's backlog when its rule sets
// none (and its window is longer).
const DefaultFairBacklog = time.Second

// fairPolicy is p resolved for limit l (nil when l is). Backlog defaults
// to DefaultFairBacklog, or l's window when that is shorter; credit to a
// twentieth of what l admits in one backlog, at least the quantum.
//
// Why not the window: a member stays waiting, and keeps room held for it,
// for a backlog after a denial. Simulated on spike-queue's traffic (432
// tenants, a 6,000/min token bucket, free x10 for 45 s; see
// docs/fair-share.md, "Defaults"), a backlog of the window (1 min) with a
// credit of one bucket (300) held room for hundreds of slow free tenants:
// premium got 0.1/s of its 28/s in the spike, and after it the limit ran
// at 12% while every tier wanted more. A 1 s backlog gave premium 8.8/s
// (its weighted share is 7.6/s) and 93% after.
func fairPolicy(p limit.FairPolicy, l *limit.Limit, credit float64, creditSet bool) *limit.FairPolicy {
	if l == nil {
		return nil
	}
	if p.Backlog == 0 {
		p.Backlog = max(min(l.Window(), DefaultFairBacklog), time.Millisecond)
	}
	if creditSet {
		p.Credit = credit
	} else {
		perBacklog := float64(l.Amount) * (float64(p.Backlog) / float64(max(l.Window(), 1)))
		p.Credit = max(math.Floor(perBacklog/20), p.Quantum)
	}
	return &p
}
