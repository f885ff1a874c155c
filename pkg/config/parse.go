// Package config loads rule files into pkg/limit's domain types.
//
// The format is a strict superset of envoyproxy/ratelimit's YAML, so its
// users bring their files unchanged. Strict means that a typo is an error
// and never a silently missing limit: unknown keys, wrong types, repeated
// keys and impossible combinations are rejected, and every problem names
// the file, the line and the path of the node (see Problem).
//
// One file holds one domain:
//
//	domain: inference                  # (Required) the RLS request's domain; unique across files
//	algorithm: sliding_window          # (Optional) default for every limit in this file; default sliding_window
//	descriptors:                       # (Optional) the rule tree
//	  - key: tenant                    # (Required) the descriptor entry key this rule matches
//	    value: acme                    # (Optional) exact value; "pre*" matches a prefix; absent matches any value
//	    rate_limit:                    # (Optional) counts requests
//	      unit: minute                 #   (Required unless unlimited) second|minute|hour|day|week|month|year, any case
//	      requests_per_unit: 600       #   (Required unless unlimited) 0 denies every request
//	      unlimited: false             #   (Optional) true answers OK without counting; default false
//	      name: tenant_minute          #   (Optional) reported in statuses; what replaces refers to
//	      replaces: [{name: other}]    #   (Optional) limits (by name) this one displaces when both match
//	      algorithm: sliding_window    #   (Optional) sliding_window|fixed_window|token_bucket; default the file's
//	      burst: 50                    #   (Optional, token_bucket only) bucket capacity; default requests_per_unit
//	      unit_multiplier: 1           #   (Optional) the window is this many units; default 1
//	      buckets: 20                  #   (Optional, sliding_window only) precision, 1..600; default 20
//	    token_limit:                   # (Optional) counts cost (hits_addend or an estimate): the keys of
//	      unit: hour                   #   rate_limit with tokens_per_unit for requests_per_unit, and
//	      tokens_per_unit: 500000      #   without unlimited and replaces
//	    shadow_mode: false             # (Optional) report over-limit in metrics, never deny; default false
//	    detailed_metric: false         # (Optional) let metrics carry the descriptor's values; default false
//	    store_failure: deny            # (Optional) allow|deny|local when the store cannot answer; default the
//	                                   #   nearest parent rule's, else the file's, else --store-failure
//	    descriptors: []                # (Optional) child rules, matched by the next descriptor entry
//	store_failure: local               # (Optional) allow|deny|local for every rule that sets none; default --store-failure
//	tiers:                             # (Optional) plan multipliers; default none (every limit as written)
//	  key: tier                        #   (Required) the descriptor entry that carries the plan; rules must not use it
//	  default: free                    #   (Required) the plan of a request with none or an unknown one; one of plans
//	  plans: {premium: 3, free: 1}     #   (Required) plan -> multiplier of every matched limit, > 0 and at most 1000
//	shedding:                          # (Optional) tier shedding by pressure; default none
//	  steps:                           #   (Optional) ascending thresholds; a step adds to the ones below it
//	    - above: 0.7                   #     (Required) pressure in [0,1] from which the step applies
//	      shed: [free]                 #     (Optional) tiers refused
//	      admit_only: [premium]        #     (Optional) the only tiers admitted
//	      limit_factor: 0.7            #     (Optional) scales every limit, in (0,1]; default 1
//	      burst: false                 #     (Optional) false: token buckets' bursts shrink to burst_floor; default true
//	      continuous: false            #     (Optional) limit x limit_factor x (1 - pressure); default false
//	  hysteresis: 0.05                 #   (Optional) a step is left below above - hysteresis, in [0,1); default 0
//	  hold: 30s                        #   (Optional) a step is left no sooner than this; also Retry-After; default 0 (1s)
//	  shadow: false                    #   (Optional) count what would be shed, shed nothing; default false
//	  min_factor: 0.1                  #   (Required with a continuous step) floor of the continuous factor, in (0,1]
//	  scope: global                    #   (Optional) global|model: the pressure a request reads; default global
//	  burst_floor: 1s                  #   (Optional) burst: false leaves a token bucket what it refills in this, at least 1; default 1s
//	  control:                         #   (Optional) the overload controller (docs/overload-control.md); needs tiers
//	    key: model                     #     (Optional) descriptor entry naming the upstream; default model
//	    capacity: {gpt-4o: 32}         #     (Optional) upstream -> requests it serves at once (its slots), >= 1
//	    default_capacity: 0            #     (Optional) capacity of upstreams the rules name with an exact value; default 0 (none)
//	    target: 1                      #     (Optional) in-flight aimed at, a fraction of capacity in (0,4]; default 1
//	    sheddable: [free, standard]    #     (Required) tiers it may shed, lowest first; plans of tiers
//	    interval: 250ms                #     (Optional) how often it decides, 10ms..10s; default 250ms
//	    window: 2s                     #     (Optional) span of the rates, 2..200 intervals; default 2s
//	    dwell: 15s                     #     (Optional) a fraction loosens no sooner after the last change; default 15s
//	    quantum: 0.1                   #     (Optional) the step of fractions, 0.01..0.5; default 0.1
//	    lease: 2m                      #     (Optional) ends a flight whose completion was lost, >= 1s; default 2m
//	    grace: 10s                     #     (Optional) the last state stands this long while the store fails; default 10s
//	breakers:                          # (Optional) circuit breakers shared by all replicas; default none
//	  - key: model                     #   (Required) one breaker per value of this descriptor entry; one per key
//	    failure_threshold: 5           #   (Required) upstream failures (docs/outcome-classes.md) within window that open it
//	    failure_rate: 0.5              #   (Optional) also needs failures/(failures+successes) within window at least this, in (0,1]
//	    min_requests: 10               #   (Optional) also needs failures+successes within window at least this; docs/breaker.md
//	    window: 60s                    #   (Required) how long a failure counts
//	    open_for: 30s                  #   (Required) open this long, then half-open
//	    half_open_probes: 1            #   (Optional) probes in flight cluster-wide while half-open; default 1
//	    close_after: 1                 #   (Optional) probe successes that close it; default half_open_probes
//	    probe_lease: 1m                #   (Optional) a probe's slot without an outcome; default 1m
//	    timeout: 0s                    #   (Optional) a client leaving after the upstream was silent this long is a failure; default 0 (never)
//	    cache: 100ms                   #   (Optional) answer from the closed state last read this long; 1ms-10s; default 100ms
//
// share_threshold (Optional, wildcard values only, as in
// envoyproxy/ratelimit) makes every value the prefix matches share one
// counter. Two more keys of envoyproxy/ratelimit load so its files do, but
// change nothing yet: quota_mode (the rule is enforced as an ordinary
// limit) and value_to_metric (metric names).
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const (
	// maxFileBytes caps one rule file: rules are written by people, and a
	// reload must never be able to exhaust memory.
	maxFileBytes = 4 << 20
	// maxProblems is how many problems one file reports; past that, the
	// rest are most likely echoes of the first ones.
	maxProblems = 50
	// extraVisits is the slack of a walk's budget of node visits, which is
	// the file's length plus this. Without aliases a walk makes under one
	// visit per two bytes (TestVisitsPerByte), so only aliases that expand
	// a small file into a huge tree (a "billion laughs") exhaust it.
	extraVisits = 1 << 16
	// maxAmount keeps amounts exact where the Redis store counts: Lua
	// numbers are doubles.
	maxAmount = 1 << 53
)

// The keys each mapping accepts, in the order error messages list them.
var (
	fileKeys       = []string{"domain", "algorithm", "descriptors", "tiers", "shedding", "breakers", "store_failure"}
	tiersKeys      = []string{"key", "default", "plans"}
	sheddingKeys   = []string{"steps", "hysteresis", "hold", "shadow", "min_factor", "scope", "burst_floor", "control"}
	controlKeys    = []string{"key", "capacity", "default_capacity", "target", "sheddable", "interval", "window", "dwell", "quantum", "lease", "grace"}
	stepKeys       = []string{"above", "shed", "admit_only", "limit_factor", "burst", "continuous"}
	breakerKeys    = []string{"key", "failure_threshold", "failure_rate", "min_requests", "window", "open_for", "half_open_probes", "close_after", "probe_lease", "timeout", "cache"}
	descriptorKeys = []string{
		"key", "value", "rate_limit", "token_limit", "shadow_mode", "detailed_metric", "descriptors",
		"quota_mode", "value_to_metric", "share_threshold", "max_concurrent", "store_failure",
	}
	rateLimitKeys = []string{
		"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "burst", "unit_multiplier", "buckets",
	}
	tokenLimitKeys = []string{"unit", "tokens_per_unit", "name", "algorithm", "burst", "unit_multiplier", "buckets"}
	concurrentKeys = []string{"limit", "lease"}
	replacesKeys   = []string{"name"}
)

// Parse compiles one file's bytes into a domain; name is used in errors
// and as Domain.Source. The error, when there is one, is an Errors with
// every problem found, up to 50.
func Parse(name string, data []byte) (*limit.Domain, error) {
	d, _, err := parse(name, data)
	return d, err
}

// parse is Parse that also returns the line of the domain key, so Load
// can point at the second file that repeats a domain.
func parse(name string, data []byte) (*limit.Domain, int, error) {
	w := &walker{file: name}
	var d *limit.Domain
	var line int
	if root := w.document(data, ruleFileDoc); root != nil {
		d, line = w.domain(root)
	}
	if err := w.err(); err != nil {
		return nil, 0, err
	}
	return d, line, nil
}

// walker walks a parsed file and collects problems as it goes, so one
// pass reports them all.
type walker struct {
	file      string
	problems  Errors
	truncated bool
	budget    int // node visits left
	visits    int
	stopped   bool
	// alg is the file's default algorithm.
	alg limit.Algorithm
	// tierKey is tiers.key, which no rule may match on.
	tierKey string
}

func (w *walker) addf(n *yaml.Node, path, format string, args ...any) {
	if w.stopped {
		return
	}
	if len(w.problems) == maxProblems {
		w.truncated, w.stopped = true, true
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	w.problems = append(w.problems, Problem{File: w.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (w *walker) err() error {
	if len(w.problems) == 0 {
		return nil
	}
	// Aliases make the walk jump around the file; people read top down.
	sort.SliceStable(w.problems, func(i, j int) bool { return w.problems[i].Line < w.problems[j].Line })
	if w.truncated {
		w.problems = append(w.problems, Problem{File: w.file, Msg: fmt.Sprintf("stopped after the first %d problems", maxProblems)})
	}
	return w.problems
}

// docWords are the words a file kind's messages about the file as a
// whole use: the rule parser's and the Walker's differ.
type docWords struct {
	// most ends "file is larger than 4 MiB, ..."
	most string
	// empty is the whole message for a file with no document.
	empty string
	// one ends "a second YAML document; ..."
	one string
}

// ruleFileDoc are a rule file's words.
var ruleFileDoc = docWords{
	most:  "the most a rule file may hold",
	empty: "file is empty; a rule file needs at least a domain",
	one:   "a rule file holds one document (one domain)",
}

// document parses data as exactly one YAML document and returns its
// top-level node, or nil after reporting why there is none: the file is
// larger than maxFileBytes, it is not YAML, or it holds no document. It
// sets the walk's budget from data's length.
//
// A second document, or a syntax error after the first, is reported and
// the first document is still returned, so that one pass also reports
// the first one's problems; a caller that must not read on compares
// problems before and after.
func (w *walker) document(data []byte, words docWords) *yaml.Node {
	if len(data) > maxFileBytes {
		w.addf(nil, "", "file is larger than %d MiB, %s", maxFileBytes>>20, words.most)
		return nil
	}
	w.budget = len(data) + extraVisits
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		w.syntax(err)
		return nil
	}
	for {
		// Empty documents, as after a trailing ---, are harmless.
		var extra yaml.Node
		err := dec.Decode(&extra)
		if err == nil && (len(extra.Content) == 0 || isNull(extra.Content[0])) {
			continue
		}
		if err == nil {
			w.addf(&extra, "", "a second YAML document; %s", words.one)
		} else if !errors.Is(err, io.EOF) {
			w.syntax(err)
		}
		break
	}
	if len(doc.Content) == 0 || isNull(doc.Content[0]) {
		w.addf(&yaml.Node{Line: 1}, "", "%s", words.empty)
		return nil
	}
	return doc.Content[0]
}

// syntax reports a YAML parser error, moving yaml.v3's "yaml: line N:"
// prefix into the Problem's line.
func (w *walker) syntax(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ": "); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				line, msg = n, rest[i+2:]
			}
		}
	}
	w.addf(&yaml.Node{Line: line}, "", "invalid YAML: %s", msg)
}

// resolve follows aliases and charges the node to the walk's budget.
func (w *walker) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	w.budget--
	if w.budget == 0 {
		w.addf(n, "", "aliases expand the file too far; stopped after %d YAML nodes", w.visits)
		w.stopped = true
	}
	w.visits++
	return n
}

// mapping checks that n is a mapping whose keys are all in allowed and
// appear once, and returns the value of each key. Keys whose value is
// null are left out: envoyproxy/ratelimit's yaml.v2 reads "key:" with
// nothing after it as the key's zero value.
func (w *walker) mapping(n *yaml.Node, path string, allowed []string) (map[string]*yaml.Node, bool) {
	n = w.resolve(n)
	if n.Kind != yaml.MappingNode {
		w.addf(n, path, "want a mapping with keys %s, got %s", strings.Join(allowed, "|"), describe(n))
		return nil, false
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	ok := true
	for i := 0; i+1 < len(n.Content) && !w.stopped; i += 2 {
		k, v := w.resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			w.addf(k, path, "a key must be a string, got %s", describe(k))
			ok = false
			continue
		}
		p := join(path, k.Value)
		if !slices.Contains(allowed, k.Value) {
			switch guess := closest(k.Value, allowed); {
			case k.Value == "replaces":
				w.addf(k, p, "unknown key here; replaces goes inside rate_limit, as in envoyproxy/ratelimit")
			case guess != "":
				w.addf(k, p, "unknown key; did you mean %s?", guess)
			default:
				w.addf(k, p, "unknown key (want one of %s)", strings.Join(allowed, "|"))
			}
			ok = false
			continue
		}
		if first, dup := lines[k.Value]; dup {
			w.addf(k, p, "key repeated (first at line %d)", first)
			ok = false
			continue
		}
		lines[k.Value] = k.Line
		if !isNull(w.resolve(v)) {
			out[k.Value] = v
		}
	}
	return out, ok
}

func (w *walker) domain(root *yaml.Node) (*limit.Domain, int) {
	f, ok := w.mapping(root, "", fileKeys)
	if f == nil {
		return nil, 0
	}
	d := &limit.Domain{Source: w.file}
	line := 0
	if n, has := f["domain"]; !has {
		w.addf(root, "", "domain is required")
	} else if name, ok := w.str(n, "domain"); ok {
		line = w.resolve(n).Line
		switch {
		case name == "":
			w.addf(n, "domain", "is empty")
		case len(name) > limit.MaxDomainBytes:
			w.addf(n, "domain", "is %d bytes, more than %d", len(name), limit.MaxDomainBytes)
		default:
			d.Name = name
		}
	}
	if n, has := f["algorithm"]; has {
		if a, ok := w.algorithm(n, "algorithm"); ok {
			w.alg = a
		}
	}
	// Tiers first, wherever they are in the file: rules are checked
	// against tiers.key.
	if n, has := f["tiers"]; has {
		d.Tiers = w.tiers(n)
	}
	if n, has := f["descriptors"]; has {
		d.Descriptors = w.rules(n, "descriptors", 1)
	}
	if n, has := f["shedding"]; has {
		d.Shedding = w.shedding(n, d.Tiers, f["tiers"] != nil)
	}
	if n, has := f["breakers"]; has {
		d.Breakers = w.breakers(n)
	}
	if n, has := f["store_failure"]; has {
		d.StoreFailure = w.storeFailure(n, "store_failure")
	}
	if !ok {
		return nil, 0
	}
	return d, line
}

// rules reads a descriptor list whose rules match entry number depth.
func (w *walker) rules(n *yaml.Node, path string, depth int) []*limit.Rule {
	n = w.resolve(n)
	if n.Kind != yaml.SequenceNode {
		w.addf(n, path, "want a list of descriptors, got %s", describe(n))
		return nil
	}
	if depth > limit.MaxEntries {
		w.addf(n, path, "nested deeper than %d levels; a request descriptor has at most %d entries, so these rules could never match",
			limit.MaxEntries, limit.MaxEntries)
		return nil
	}
	seen := map[string]int{} // key NUL value -> line of the first rule
	out := make([]*limit.Rule, 0, len(n.Content))
	for i, c := range n.Content {
		if w.stopped {
			break
		}
		if r := w.rule(c, fmt.Sprintf("%s[%d]", path, i), depth, seen); r != nil {
			out = append(out, r)
		}
	}
	return out
}

func (w *walker) rule(n *yaml.Node, path string, depth int, seen map[string]int) *limit.Rule {
	f, _ := w.mapping(n, path, descriptorKeys)
	if f == nil {
		return nil
	}
	at := n // where a repeated alias is used, rather than where it points
	n = w.resolve(n)
	r := &limit.Rule{}
	keyOK, valueOK := false, true
	if kn, has := f["key"]; !has {
		w.addf(n, path, "key is required")
	} else if k, ok := w.str(kn, path+".key"); ok {
		switch {
		case k == "":
			w.addf(kn, path+".key", "is empty")
		case len(k) > limit.MaxEntryKeyBytes:
			w.addf(kn, path+".key", "is %d bytes, more than %d", len(k), limit.MaxEntryKeyBytes)
		case k == w.tierKey:
			// Such a rule could never match: the entry is gone by then.
			w.addf(kn, path+".key", "%s is the tiers.key; tier entries are read for the plan multiplier and removed before matching", k)
		default:
			r.Key, keyOK = k, true
		}
	}
	if vn, has := f["value"]; has {
		valueOK = false
		if v, ok := w.str(vn, path+".value"); ok {
			switch {
			case len(v) > limit.MaxValueBytes:
				w.addf(vn, path+".value", "is %d bytes, more than %d", len(v), limit.MaxValueBytes)
			case strings.IndexByte(v, '*') >= 0 && strings.IndexByte(v, '*') < len(v)-1:
				w.addf(vn, path+".value", "%q has a * before its end; only a trailing * (a prefix match) is supported", v)
			default:
				r.Value, valueOK = v, true
			}
		}
	}
	if keyOK && valueOK {
		id := r.Key + "\x00" + r.Value
		if first, dup := seen[id]; dup {
			what := fmt.Sprintf("key %q with value %q", r.Key, r.Value)
			if r.Value == "" {
				what = fmt.Sprintf("key %q with no value", r.Key)
			}
			w.addf(at, path, "a rule for %s is already defined at line %d", what, first)
			return nil // and its subtree: a repeated alias must not multiply work
		}
		seen[id] = at.Line
	}

	if ln, has := f["rate_limit"]; has {
		r.RateLimit, r.Unlimited, r.Replaces = w.limit(ln, path+".rate_limit", limit.Requests)
	}
	if ln, has := f["token_limit"]; has {
		if r.Unlimited {
			w.addf(ln, path+".token_limit", "the rule is unlimited (rate_limit.unlimited: true) and counts nothing, so a token_limit would be ignored")
		} else {
			r.TokenLimit, _, _ = w.limit(ln, path+".token_limit", limit.Tokens)
		}
	}
	if cn, has := f["max_concurrent"]; has {
		r.MaxConcurrent, r.Lease = w.concurrent(cn, path+".max_concurrent")
		if r.Unlimited && r.MaxConcurrent > 0 {
			w.addf(cn, path+".max_concurrent", "the rule is unlimited (rate_limit.unlimited: true), so a cap on requests in flight would be ignored")
		}
	}
	r.Shadow = w.flag(f, "shadow_mode", path)
	r.DetailedMetric = w.flag(f, "detailed_metric", path)
	w.flag(f, "quota_mode", path)
	w.flag(f, "value_to_metric", path)
	if r.ShareThreshold = w.flag(f, "share_threshold", path); r.ShareThreshold && !strings.HasSuffix(r.Value, "*") {
		w.addf(f["share_threshold"], path+".share_threshold", "applies only to a wildcard value (one ending in *)")
	}
	if sn, has := f["store_failure"]; has {
		r.StoreFailure = w.storeFailure(sn, path+".store_failure")
	}
	if cn, has := f["descriptors"]; has {
		r.Children = w.rules(cn, path+".descriptors", depth+1)
	}
	return r
}

// storeFailure reads a store_failure: allow, deny or local.
func (w *walker) storeFailure(n *yaml.Node, path string) limit.StoreFailure {
	s, ok := w.str(n, path)
	if !ok {
		return limit.FailureUnset
	}
	p, ok := limit.ParseStoreFailure(s)
	if !ok {
		w.addf(n, path, "%q is not one of %s", s, limit.StoreFailureNames())
	}
	return p
}

// limit reads a rate_limit (kind Requests) or token_limit (kind Tokens).
// It returns unlimited and replaces for rate_limit, where
// envoyproxy/ratelimit puts them.
func (w *walker) limit(n *yaml.Node, path string, kind limit.Kind) (l *limit.Limit, unlimited bool, replaces []string) {
	keys, amountKey := rateLimitKeys, "requests_per_unit"
	if kind == limit.Tokens {
		keys, amountKey = tokenLimitKeys, "tokens_per_unit"
	}
	before := len(w.problems)
	f, _ := w.mapping(n, path, keys)
	if f == nil {
		return nil, false, nil
	}
	n = w.resolve(n)
	var name string
	if v, has := f["name"]; has {
		name, _ = w.str(v, path+".name")
	}
	if v, has := f["replaces"]; has {
		replaces = w.replaces(v, path+".replaces", name)
	}
	if unlimited = w.flag(f, "unlimited", path); unlimited {
		// envoyproxy/ratelimit rejects a unit beside unlimited too: the
		// file says two contradictory things.
		for _, k := range []string{"unit", amountKey, "algorithm", "burst", "unit_multiplier", "buckets"} {
			if v, has := f[k]; has {
				w.addf(v, path+"."+k, "must not be set when unlimited is true")
			}
		}
		return nil, true, replaces
	}

	l = &limit.Limit{Name: name, Kind: kind, Algorithm: w.alg, Multiplier: 1}
	if v, has := f["unit"]; !has {
		w.addf(n, path, "unit is required (or unlimited: true)")
	} else if s, ok := w.str(v, path+".unit"); ok {
		if u, ok := limit.ParseUnit(s); ok {
			l.Unit = u
		} else {
			w.addf(v, path+".unit", "%q is not one of %s", s, limit.UnitNames())
		}
	}
	amount, amountOK := f[amountKey]
	if !amountOK {
		w.addf(n, path, "%s is required", amountKey)
	} else {
		l.Amount, amountOK = w.uint(amount, path+"."+amountKey, 0, maxAmount)
	}
	if v, has := f["algorithm"]; has {
		l.Algorithm, _ = w.algorithm(v, path+".algorithm")
	}
	if v, has := f["unit_multiplier"]; has {
		m, ok := w.uint(v, path+".unit_multiplier", 1, math.MaxUint32)
		if u := int64(l.Unit.Duration()); ok && u > 0 && m > uint64(math.MaxInt64/u) {
			// A window is a time.Duration: int64 nanoseconds.
			w.addf(v, path+".unit_multiplier", "%d %ss is longer than the longest window, %d %ss", m, l.Unit, math.MaxInt64/u, l.Unit)
		}
		l.Multiplier = uint32(m)
	}
	if v, has := f["burst"]; has {
		if l.Algorithm != limit.TokenBucket {
			w.addf(v, path+".burst", "applies only to algorithm token_bucket, and this limit is %s", l.Algorithm)
		} else {
			l.Burst, _ = w.uint(v, path+".burst", 1, maxAmount)
		}
	}
	if v, has := f["buckets"]; has {
		if l.Algorithm != limit.SlidingWindow {
			w.addf(v, path+".buckets", "applies only to algorithm sliding_window, and this limit is %s", l.Algorithm)
		} else {
			b, _ := w.uint(v, path+".buckets", 1, limit.MaxBuckets)
			l.Buckets = uint16(b)
		}
	}
	switch l.Algorithm {
	case limit.TokenBucket:
		if amountOK && l.Amount == 0 {
			// A bucket that never refills has no rate to pace by.
			w.addf(amount, path+"."+amountKey, "a token_bucket needs at least 1")
		}
		if l.Burst == 0 {
			l.Burst = l.Amount
		}
	case limit.SlidingWindow:
		if l.Buckets == 0 {
			l.Buckets = limit.DefaultBuckets
		}
	}
	if len(w.problems) != before {
		return nil, false, replaces
	}
	return l, false, replaces
}

func (w *walker) replaces(n *yaml.Node, path, own string) []string {
	n = w.resolve(n)
	if n.Kind != yaml.SequenceNode {
		w.addf(n, path, "want a list of {name: ...}, got %s", describe(n))
		return nil
	}
	var out []string
	for i, e := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		f, _ := w.mapping(e, p, replacesKeys)
		if f == nil {
			continue
		}
		v, has := f["name"]
		if !has {
			w.addf(w.resolve(e), p, "name is required")
			continue
		}
		name, ok := w.str(v, p+".name")
		switch {
		case !ok:
		case name == "":
			w.addf(v, p+".name", "is empty")
		case name == own:
			w.addf(v, p+".name", "%q is this limit's own name; a limit cannot replace itself", name)
		default:
			out = append(out, name)
		}
	}
	return out
}

func (w *walker) algorithm(n *yaml.Node, path string) (limit.Algorithm, bool) {
	s, ok := w.str(n, path)
	if !ok {
		return w.alg, false
	}
	// Case-insensitive like units, which envoyproxy/ratelimit files write
	// in upper case.
	a, ok := limit.ParseAlgorithm(strings.ToLower(s))
	if !ok {
		w.addf(n, path, "%q is not one of %s", s, limit.AlgorithmNames())
		return w.alg, false
	}
	return a, true
}

// str reads any scalar as the text written, as envoyproxy/ratelimit's
// yaml.v2 does for string fields: value: 200 is "200".
func (w *walker) str(n *yaml.Node, path string) (string, bool) {
	n = w.resolve(n)
	if n.Kind != yaml.ScalarNode {
		w.addf(n, path, "want a string, got %s", describe(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// flag reads an optional boolean key of f; absent is false.
func (w *walker) flag(f map[string]*yaml.Node, key, path string) bool {
	v, has := f[key]
	if !has {
		return false
	}
	n := w.resolve(v)
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b
			}
		case "!!str":
			// yaml.v2, which envoyproxy/ratelimit uses, reads YAML 1.1's
			// words as booleans, so its files may say yes and off.
			if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
				switch n.Value {
				case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
					return true
				case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
					return false
				}
			}
		}
	}
	w.addf(n, join(path, key), "want true or false, got %s", describe(n))
	return false
}

// uint reads a whole number in [lo, hi].
func (w *walker) uint(n *yaml.Node, path string, lo, hi uint64) (uint64, bool) {
	n = w.resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && isDigits(n.Value) {
			w.addf(n, path, "%s is more than %d", n.Value, hi)
		} else {
			w.addf(n, path, "want a whole number, got %s", describe(n))
		}
		return 0, false
	}
	if strings.HasPrefix(n.Value, "-") {
		var i int64
		if n.Decode(&i) != nil || i != 0 {
			w.addf(n, path, "%s is negative", n.Value)
			return 0, false
		}
	}
	var u uint64
	if err := n.Decode(&u); err != nil || u > hi {
		w.addf(n, path, "%s is more than %d", n.Value, hi)
		return 0, false
	}
	if u < lo {
		w.addf(n, path, "%s is less than %d", n.Value, lo)
		return 0, false
	}
	return u, true
}

// closest returns the word in words nearest to s, if it is near enough
// to be the likely intent (a typo, a missing or extra letter).
func closest(s string, words []string) string {
	best, bestD := "", 3
	for _, w := range words {
		if d := distance(s, w); d < bestD {
			best, bestD = w, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func isDigits(s string) bool {
	s = strings.TrimPrefix(s, "+")
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// describe names a node for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!null":
			return "nothing (null)"
		default:
			return n.Value
		}
	}
	return "an alias to nothing"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// defaultLease is how long a concurrency slot is held when no access log
// entry releases it: longer than a slow completion, short enough that a
// lost entry does not shrink the cap for long.
const defaultLease = 10 * time.Minute

// concurrent reads max_concurrent: {limit: N, lease: 10m}.
func (w *walker) concurrent(n *yaml.Node, path string) (uint64, time.Duration) {
	f, ok := w.mapping(n, path, concurrentKeys)
	if !ok {
		return 0, 0
	}
	var max uint64
	if ln, has := f["limit"]; has {
		max, _ = w.uint(ln, path+".limit", 1, 1<<32)
	} else {
		w.addf(n, path, "limit is required")
	}
	lease := defaultLease
	if ln, has := f["lease"]; has {
		if v, ok := w.str(ln, path+".lease"); ok {
			d, err := time.ParseDuration(v)
			switch {
			case err != nil:
				w.addf(ln, path+".lease", "%q is not a duration such as 30s or 10m", v)
			case d < time.Second || d > 24*time.Hour:
				w.addf(ln, path+".lease", "%s is outside 1s..24h", d)
			default:
				lease = d
			}
		}
	}
	return max, lease
}

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
	} else if k, ok := w.str(v, path+".key"); ok {
		switch {
		case k == "":
			w.addf(v, path+".key", "is empty")
		case len(k) > limit.MaxEntryKeyBytes:
			w.addf(v, path+".key", "is %d bytes, more than %d", len(k), limit.MaxEntryKeyBytes)
		default:
			t.Key, w.tierKey = k, k
		}
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

// fields remembers the node of each path read under one value, so that
// the problems its Check reports point at their line.
type fields map[string]*yaml.Node

// report adds each of problems, found in the value read at base from
// node n, at the line of its field (or of its nearest parent read).
func (w *walker) report(n *yaml.Node, base string, at fields, problems []limit.FieldError) {
	for _, p := range problems {
		node, path := n, p.Path
		for q := path; q != ""; {
			if v, ok := at[q]; ok {
				node = v
				break
			}
			i := strings.LastIndexAny(q, ".[")
			if i < 0 {
				break
			}
			q = q[:i]
		}
		w.addf(node, join(base, path), "%s", p.Msg)
	}
}

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
		switch {
		case s.Control == nil:
		case !hasTiers:
			w.addf(w.resolve(v), path+".control", "the controller sheds tiers: the file needs tiers")
		case tiers != nil:
			for j, t := range s.Control.Sheddable {
				if _, ok := tiers.Plans[t]; !ok && t != "" {
					p := fmt.Sprintf("control.sheddable[%d]", j)
					w.addf(at[p], path+"."+p, "%q is not a plan of tiers", t)
				}
			}
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

// float reads a finite number.
func (w *walker) float(n *yaml.Node, path string) (float64, bool) {
	n = w.resolve(n)
	var v float64
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") || n.Decode(&v) != nil ||
		math.IsNaN(v) || math.IsInf(v, 0) {
		w.addf(n, path, "want a number such as 0.7, got %s", describe(n))
		return 0, false
	}
	return v, true
}

// duration reads a Go duration such as 30s or 1m.
func (w *walker) duration(n *yaml.Node, path string) (time.Duration, bool) {
	s, ok := w.str(n, path)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		w.addf(n, path, "%q is not a duration such as 30s or 10m", s)
		return 0, false
	}
	return d, true
}
