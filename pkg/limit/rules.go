package limit

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"time"
)

// Rule is one node of a domain's descriptor tree, as in
// envoyproxy/ratelimit: it matches one descriptor entry by key and value.
type Rule struct {
	// Key is the descriptor entry key this node matches (Required).
	Key string
	// Value is the entry value: exact; a pattern when it holds a '*',
	// each '*' matching any run of bytes, none included ("gpt-*",
	// "bar*b", "/api*v1"), as envoyproxy/ratelimit matches; or empty to
	// match any value. Each value a pattern or an empty Value matches
	// counts on its own, unless ShareThreshold.
	Value string
	// RateLimit counts requests; TokenLimit counts cost. Either may be nil.
	RateLimit  *Limit
	TokenLimit *Limit
	// Unlimited answers OK without counting.
	Unlimited bool
	// Shadow reports over-limit in metrics but never denies.
	Shadow bool
	// DetailedMetric lets metrics carry the descriptor's values.
	DetailedMetric bool
	// ValueToMetric lets metrics carry the value of the entry this rule
	// matches, for the limits at it and below it (envoyproxy/ratelimit's
	// value_to_metric); see Domain.MetricEntries.
	ValueToMetric bool
	// ShareThreshold, on a wildcard rule, makes every value the pattern
	// matches count on one shared counter (envoyproxy/ratelimit's
	// share_threshold) instead of one counter per value.
	ShareThreshold bool
	// MaxConcurrent caps the requests in flight for each descriptor value
	// (0: no cap), held across replicas and released by the access log
	// or, when no outcome arrives, after Lease. Only ext_authz requests,
	// which carry an ID, take it.
	MaxConcurrent uint64
	Lease         time.Duration
	// Fair, when set, makes the rule's limits budgets its fairness
	// members share by weight (docs/fair-share.md); they are then never
	// scaled by the plan multiplier.
	Fair *FairShare
	// Metadata is the rule's metadata (envoyproxy/ratelimit's): values
	// as protobuf's Struct holds them (map[string]any, []any, string,
	// float64, bool, nil), for the RLS response's dynamic metadata.
	// Read only.
	Metadata map[string]any
	// Replaces names limits (rate_limit.name) that this rule displaces when
	// both match in one request.
	Replaces []string
	// StoreFailure is what the rule's charges do when the store cannot
	// answer. NewRuleSet fills an unset one from the nearest ancestor
	// that sets one, then the domain; unset after that means the
	// Limiter's default.
	StoreFailure StoreFailure
	Children     []*Rule
	// ID is a stable, human-readable path used as a metric label and in
	// /debug/config: "tenant.model_gpt-4o".
	ID string

	byValue  bool             // ValueToMetric here or on an ancestor
	exact    map[string]*Rule // "key\x00value" -> child
	wildcard []*Rule          // children whose Value holds a '*', most literal bytes first
	parts    []string         // a wildcard Value split at each '*'
	keyOnly  map[string]*Rule // key -> child with empty Value
}

// HasLimit reports whether the rule counts anything or is unlimited.
func (r *Rule) HasLimit() bool {
	return r.RateLimit != nil || r.TokenLimit != nil || r.Unlimited || r.MaxConcurrent > 0
}

// Domain is the rule tree of one domain, usually one file.
type Domain struct {
	Name        string
	Descriptors []*Rule
	// Source is where the domain was loaded from, for errors and /debug.
	Source string
	// Tiers, when set, scales every matched limit by the request's plan.
	Tiers *Tiers
	// Shedding, when set, sheds tiers and shrinks limits by pressure
	// (with a Limiter made WithShedder).
	Shedding *Shedding
	// Breakers are the domain's circuit breakers, one per key (with a
	// Limiter made WithBreakers).
	Breakers []BreakerConfig
	// StoreFailure is the domain's store_failure, inherited by rules
	// that set none (FailureUnset: the Limiter's default).
	StoreFailure StoreFailure
	// RetryBudget, when set, tells Envoy how many retries an admitted
	// request may make (admission.Decision.Retries).
	RetryBudget *RetryBudget
	// Queue, when set, lets refused requests wait (see Queue).
	Queue *Queue
	// Algorithm is the file's algorithm (SlidingWindow unless it says
	// otherwise): a request's limit override on a descriptor that no
	// rule matches counts with it.
	Algorithm Algorithm
	// Warnings are what the file said that loads but is ignored or read
	// leniently, as envoyproxy/ratelimit reads it ("file:line: path:
	// warning: ..."), for tollgate validate and the log.
	Warnings []string

	root Rule
}

// MaxMultiplier is the largest plan multiplier: far above any real plan,
// low enough that a scaled limit stays exact where Redis counts.
const MaxMultiplier = 1000

// Tiers are a domain's plans: each multiplies every limit a request of
// that plan matches (rate_limit, token_limit, burst, max_concurrent, and
// a key's or tenant's own amounts), so premium can get three times what
// free gets from one set of rules.
//
// The plan is Request.Tier when set (ext_authz takes it from the caller's
// identity), else the value of the first entry named Key in the request's
// descriptors, in order (RLS). A request with no plan, or one not in
// Plans, gets Default, which should be the most restrictive plan so that
// a client cannot gain by sending a made-up tier or none.
//
// Entries named Key are removed from every descriptor before matching and
// before counter keys are built: rules are written without them, and a
// tenant whose plan changes keeps its counters, since only the amount
// they are checked against changes.
type Tiers struct {
	// Key is the descriptor entry that carries the plan (Required).
	Key string
	// Default is the plan of a request without a known one (Required;
	// one of Plans).
	Default string
	// Plans maps each plan to its multiplier, in (0, MaxMultiplier]
	// (Required; at least one). Multipliers count to the millionth.
	Plans map[string]float64
}

// PlanNames lists t's plans in name order; none for a nil t.
func (t *Tiers) PlanNames() []string {
	if t == nil {
		return nil
	}
	out := make([]string, 0, len(t.Plans))
	for p := range t.Plans {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// validate checks t on its own; NewRuleSet checks the rules against it.
func (t *Tiers) validate() error {
	if t.Key == "" {
		return fmt.Errorf("tiers: key is empty")
	}
	if len(t.Plans) == 0 {
		return fmt.Errorf("tiers: no plans")
	}
	for name, m := range t.Plans {
		if name == "" {
			return fmt.Errorf("tiers: a plan has an empty name")
		}
		if !(m > 0 && m <= MaxMultiplier) {
			return fmt.Errorf("tiers: plan %q: multiplier %v is outside (0, %d]", name, m, MaxMultiplier)
		}
	}
	if _, ok := t.Plans[t.Default]; !ok {
		return fmt.Errorf("tiers: default %q is not one of the plans", t.Default)
	}
	return nil
}

// Plan returns the plan req gets and its multiplier in millionths:
// ("", 1e6) when d has no tiers.
func (d *Domain) Plan(req *Request) (string, uint64) {
	t := d.Tiers
	if t == nil {
		return "", MicroOne
	}
	name := req.Tier
	if name == "" {
	find:
		for i := range req.Descriptors {
			for _, e := range req.Descriptors[i].Entries {
				if e.Key == t.Key {
					name = e.Value
					break find
				}
			}
		}
	}
	m, ok := t.Plans[name]
	if !ok {
		name, m = t.Default, t.Plans[t.Default]
	}
	return name, uint64(math.Round(m * MicroOne))
}

// MicroOne is a multiplier of 1 in millionths.
const MicroOne = 1_000_000

// Scale returns floor(n x micro / 1e6), exactly, and at least 1 when n is:
// a plan multiplier never turns a limit into one that denies everything.
func Scale(n, micro uint64) uint64 {
	if n == 0 || micro == MicroOne {
		return n
	}
	const maxScaled = 1 << 53 // exact in a float64, as Lua counts
	n = min(n, maxScaled)
	hi, lo := bits.Mul64(n, micro) // < 2^53 x 2^30: hi < 1e6, so Div64 cannot panic
	q, _ := bits.Div64(hi, lo, MicroOne)
	return min(max(q, 1), maxScaled)
}

// Scaled returns l with its amount and burst scaled, or l itself when the
// multiplier is 1, so the common case allocates nothing.
func Scaled(l *Limit, micro uint64) *Limit {
	if l == nil || micro == MicroOne {
		return l
	}
	c := *l
	c.Amount = Scale(l.Amount, micro)
	c.Burst = Scale(l.Burst, micro)
	return &c
}

// StripTier returns entries without those named key; entries itself when
// there are none, so descriptors without a tier entry cost nothing.
func StripTier(entries []Entry, key string) []Entry {
	n := 0
	for _, e := range entries {
		if e.Key == key {
			n++
		}
	}
	if n == 0 {
		return entries
	}
	out := make([]Entry, 0, len(entries)-n)
	for _, e := range entries {
		if e.Key != key {
			out = append(out, e)
		}
	}
	return out
}

// RuleSet is an immutable, indexed set of domains. Build it with
// NewRuleSet and swap it whole on reload.
type RuleSet struct {
	domains map[string]*Domain
	names   []string
}

// NewRuleSet indexes domains for matching. Domain names must be unique and
// non-empty; sibling rules must not repeat a key and value.
func NewRuleSet(domains ...*Domain) (*RuleSet, error) {
	rs := &RuleSet{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		if d.Name == "" {
			return nil, fmt.Errorf("domain from %q has an empty name", d.Source)
		}
		if prev, ok := rs.domains[d.Name]; ok {
			return nil, fmt.Errorf("domain %q is defined twice (%s and %s)", d.Name, prev.Source, d.Source)
		}
		d.root = Rule{Children: d.Descriptors, StoreFailure: d.StoreFailure}
		if err := index(&d.root, ""); err != nil {
			return nil, fmt.Errorf("domain %q: %w", d.Name, err)
		}
		if d.Tiers != nil {
			if err := d.Tiers.validate(); err != nil {
				return nil, fmt.Errorf("domain %q: %w", d.Name, err)
			}
			if id := usesKey(d.Descriptors, d.Tiers.Key); id != "" {
				return nil, fmt.Errorf("domain %q: rule %s matches the tiers key %q, whose entries are removed before matching", d.Name, id, d.Tiers.Key)
			}
		}
		if err := d.checkAdmission(); err != nil {
			return nil, fmt.Errorf("domain %q: %w", d.Name, err)
		}
		rs.domains[d.Name] = d
		rs.names = append(rs.names, d.Name)
	}
	sort.Strings(rs.names)
	return rs, nil
}

// usesKey returns the ID of a rule in rules, at any depth, that matches
// entries named key, or "".
func usesKey(rules []*Rule, key string) string {
	for _, r := range rules {
		if r.Key == key {
			return r.ID
		}
		if id := usesKey(r.Children, key); id != "" {
			return id
		}
	}
	return ""
}

func index(r *Rule, prefix string) error {
	for _, c := range r.Children {
		if c.Key == "" {
			return fmt.Errorf("%s: a rule has an empty key", prefix)
		}
		id := c.Key
		if c.Value != "" {
			id += "_" + c.Value
		}
		if prefix != "" {
			id = prefix + "." + id
		}
		if c.ID == "" {
			c.ID = id
		}
		if c.StoreFailure == FailureUnset {
			c.StoreFailure = r.StoreFailure // the nearest ancestor's, or the domain's
		}
		c.byValue = r.byValue || c.ValueToMetric
		switch {
		case c.Value == "":
			if r.keyOnly == nil {
				r.keyOnly = map[string]*Rule{}
			}
			if _, dup := r.keyOnly[c.Key]; dup {
				return fmt.Errorf("%s: duplicate rule for key %q", id, c.Key)
			}
			r.keyOnly[c.Key] = c
		case c.Wildcard():
			c.parts = strings.Split(c.Value, "*")
			for _, w := range r.wildcard {
				if w.Key == c.Key && w.Value == c.Value {
					return fmt.Errorf("%s: duplicate rule for %s=%s", id, c.Key, c.Value)
				}
			}
			r.wildcard = append(r.wildcard, c)
		default:
			if r.exact == nil {
				r.exact = map[string]*Rule{}
			}
			k := c.Key + "\x00" + c.Value
			if _, dup := r.exact[k]; dup {
				return fmt.Errorf("%s: duplicate rule for %s=%s", id, c.Key, c.Value)
			}
			r.exact[k] = c
		}
		if err := index(c, id); err != nil {
			return err
		}
	}
	// The pattern with the most literal bytes is the most specific, so it
	// is tried first; for trailing wildcards that is the longest prefix.
	// Ties keep the file's order. envoyproxy/ratelimit tries them in the
	// file's order alone, so a file there that puts "gpt-*" before
	// "gpt-4*" never reaches the second; here it does
	// (docs/migrating-from-envoy-ratelimit.md).
	sort.SliceStable(r.wildcard, func(i, j int) bool { return literalBytes(r.wildcard[i]) > literalBytes(r.wildcard[j]) })
	return nil
}

// Domain returns the named domain, or nil.
func (rs *RuleSet) Domain(name string) *Domain {
	if rs == nil {
		return nil
	}
	return rs.domains[name]
}

// Domains lists the domains in name order.
func (rs *RuleSet) Domains() []*Domain {
	if rs == nil {
		return nil
	}
	out := make([]*Domain, len(rs.names))
	for i, n := range rs.names {
		out[i] = rs.domains[n]
	}
	return out
}

// Wildcard reports whether the rule's Value is a pattern (holds a '*').
func (r *Rule) Wildcard() bool { return strings.Contains(r.Value, "*") }

// literalBytes is how many bytes of a wildcard rule's Value are not '*'.
func literalBytes(r *Rule) int { return len(r.Value) - strings.Count(r.Value, "*") }

// child is the rule under r that matches e: the exact key and value, then
// the most specific matching wildcard, then the key alone; nil for none.
func (r *Rule) child(e Entry) *Rule {
	if c := r.exact[e.Key+"\x00"+e.Value]; c != nil {
		return c
	}
	for _, w := range r.wildcard {
		if w.Key == e.Key && globMatch(w.parts, e.Value) {
			return w
		}
	}
	return r.keyOnly[e.Key]
}

// ValueMatches reports whether r's Value takes value v: equal, or
// matched by the pattern of a wildcard Value; an empty Value takes any.
func ValueMatches(r *Rule, v string) bool {
	switch {
	case r.Value == "":
		return true
	case r.Wildcard() && r.parts != nil:
		return globMatch(r.parts, v) // split by NewRuleSet
	case r.Wildcard():
		return globMatch(strings.Split(r.Value, "*"), v)
	}
	return r.Value == v
}

// globMatch reports whether v matches the pattern split at its '*'s
// into parts (at least two): v starts with the first part, ends with the
// last, and holds the ones between in order, without overlaps. Taking
// each middle part at its first place is never worse than a later one,
// so one pass decides, with no allocation and no backtracking.
func globMatch(parts []string, v string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Match finds the rule for a descriptor's entries as envoyproxy/ratelimit
// does: at each level an exact key and value first, then the most
// specific matching wildcard, then the key alone. The descriptor matches
// only when its last entry lands on a rule with a limit (or unlimited).
func (d *Domain) Match(entries []Entry) *Rule {
	r, _ := d.MatchShared(entries)
	return r
}

// MatchShared is Match that also reports, as a bit per entry index, the entries
// matched by a wildcard rule with ShareThreshold: their counter key uses
// the rule's value instead of the request's.
func (d *Domain) MatchShared(entries []Entry) (found *Rule, shared uint64) {
	node := &d.root
	for i, e := range entries {
		next := node.child(e)
		if next == nil {
			return nil, 0
		}
		if next.ShareThreshold && i < 64 {
			shared |= 1 << uint(i)
		}
		if i == len(entries)-1 && next.HasLimit() {
			found = next
		}
		node = next
	}
	if found == nil {
		shared = 0
	}
	return found, shared
}

// SharedEntries returns entries with the value of each entry marked in
// shared replaced by the wildcard rule's value that matched it, so all
// values under a share_threshold wildcard land on one counter.
func (d *Domain) SharedEntries(entries []Entry, shared uint64) []Entry {
	return d.renamed(entries, func(i int, r *Rule, v string) string {
		if shared&(1<<uint(i)) != 0 {
			return r.Value
		}
		return v
	})
}

// renamed is a copy of entries in which each entry the match walk
// reaches takes the value name gives it, from its index, the rule it
// reached and its own value; entries past the walk's end keep theirs.
func (d *Domain) renamed(entries []Entry, name func(i int, r *Rule, v string) string) []Entry {
	out := make([]Entry, len(entries))
	copy(out, entries)
	node := &d.root
	for i, e := range entries {
		next := node.child(e)
		if next == nil {
			break
		}
		out[i].Value = name(i, next, e.Value)
		node = next
	}
	return out
}
