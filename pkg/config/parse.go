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
//	    value: acme                    # (Optional) exact value; a * matches any run of bytes ("gpt-*", "/api*v1"); absent: any value
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
//	    fair_share: {key: tenant}      # (Optional) the limits are one budget the key's values share by weight; see fairshare.go
//	    metadata: {name: svc}          # (Optional) any mapping: returned in the RLS response's dynamic metadata, under
//	                                   #   "metadata", merged from the descriptors not over their limits (first wins)
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
// envoyproxy/ratelimit) makes every value the pattern matches share one
// counter. value_to_metric (Optional) names the entry's value in the
// metrics of the limits at the rule and below it, as envoyproxy/ratelimit
// names it in its stats (limit.Domain.MetricEntries). quota_mode loads so
// envoyproxy/ratelimit's files do, but the rule is enforced as an
// ordinary limit.
package config

import (
	"fmt"
	"math"
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
	fileKeys       = []string{"domain", "algorithm", "descriptors", "tiers", "shedding", "breakers", "store_failure", "retry_budget", "queue"}
	tiersKeys      = []string{"key", "default", "plans"}
	sheddingKeys   = []string{"steps", "hysteresis", "hold", "shadow", "min_factor", "scope", "burst_floor", "control"}
	controlKeys    = []string{"key", "capacity", "default_capacity", "target", "sheddable", "interval", "window", "dwell", "quantum", "lease", "grace"}
	stepKeys       = []string{"above", "shed", "admit_only", "limit_factor", "burst", "continuous"}
	breakerKeys    = []string{"key", "failure_threshold", "failure_rate", "min_requests", "window", "open_for", "half_open_probes", "close_after", "probe_lease", "timeout", "cache"}
	descriptorKeys = []string{
		"key", "value", "rate_limit", "token_limit", "shadow_mode", "detailed_metric", "descriptors",
		"quota_mode", "value_to_metric", "share_threshold", "max_concurrent", "store_failure", "fair_share", "metadata",
		"unit", // ignored with a warning, as envoyproxy/ratelimit ignores it here
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
	d.Warnings = w.warnings
	return d, line, nil
}

// ruleFileDoc are a rule file's words.
var ruleFileDoc = docWords{
	most:  "the most a rule file may hold",
	empty: "file is empty; a rule file needs at least a domain",
	one:   "a rule file holds one document (one domain)",
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
	} else if name, ok := w.name(n, "domain", limit.MaxDomainBytes); ok {
		line = w.resolve(n).Line
		d.Name = name
	}
	if n, has := f["algorithm"]; has {
		if a, ok := w.algorithm(n, "algorithm"); ok {
			w.alg = a
		}
	}
	d.Algorithm = w.alg
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
	if n, has := f["retry_budget"]; has {
		d.RetryBudget = w.retryBudget(n)
	}
	if n, has := f["queue"]; has {
		d.Queue = w.queue(n, d.Tiers, f["tiers"] != nil)
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
	if un, has := f["unit"]; has {
		w.warnf(w.resolve(un), path+".unit", "ignored: a unit belongs inside rate_limit or token_limit (envoyproxy/ratelimit ignores it here too)")
	}
	if kn, has := f["key"]; !has {
		w.addf(n, path, "key is required")
	} else if k, ok := w.name(kn, path+".key", limit.MaxEntryKeyBytes); ok {
		if k == w.tierKey {
			// Such a rule could never match: the entry is gone by then.
			w.addf(kn, path+".key", "%s is the tiers.key; tier entries are read for the plan multiplier and removed before matching", k)
		} else {
			r.Key, keyOK = k, true
		}
	}
	if vn, has := f["value"]; has {
		valueOK = false
		if v, ok := w.str(vn, path+".value"); ok {
			switch {
			case len(v) > limit.MaxValueBytes:
				w.addf(vn, path+".value", "is %d bytes, more than %d", len(v), limit.MaxValueBytes)
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
	if fn, has := f["fair_share"]; has {
		r.Fair = w.fairShare(fn, path+".fair_share", r, f)
	}
	r.Shadow = w.flag(f, "shadow_mode", path)
	r.DetailedMetric = w.flag(f, "detailed_metric", path)
	w.flag(f, "quota_mode", path)
	r.ValueToMetric = w.flag(f, "value_to_metric", path)
	if r.ShareThreshold = w.flag(f, "share_threshold", path); r.ShareThreshold && !r.Wildcard() {
		w.addf(f["share_threshold"], path+".share_threshold", "applies only to a wildcard value (one holding a *)")
	}
	if sn, has := f["store_failure"]; has {
		r.StoreFailure = w.storeFailure(sn, path+".store_failure")
	}
	if mn, has := f["metadata"]; has {
		r.Metadata = w.metadata(mn, path+".metadata")
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
		// file says two contradictory things. It loads an amount without
		// a unit and ignores it: so does Tollgate, with a warning.
		for _, k := range []string{"unit", amountKey, "algorithm", "burst", "unit_multiplier", "buckets"} {
			v, has := f[k]
			switch {
			case !has:
			case k == amountKey && kind == limit.Requests && f["unit"] == nil:
				w.warnf(v, path+"."+k, "ignored beside unlimited: true (as envoyproxy/ratelimit ignores it)")
			default:
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
	switch {
	case amountOK:
		l.Amount, amountOK = w.uint(amount, path+"."+amountKey, 0, maxAmount)
	case kind == limit.Requests && f["unit"] != nil:
		// envoyproxy/ratelimit reads a missing requests_per_unit as 0.
		w.warnf(n, path, "requests_per_unit is missing: read as 0, as envoyproxy/ratelimit reads it, so every request this rule matches is over its limit")
		amount, amountOK = n, true
	default:
		w.addf(n, path, "%s is required", amountKey)
	}
	if v, has := f["algorithm"]; has {
		l.Algorithm, _ = w.algorithm(v, path+".algorithm")
	}
	if v, has := f["unit_multiplier"]; has {
		m, ok := w.uint(v, path+".unit_multiplier", 1, math.MaxUint32)
		if ok {
			w.fitsWindow(v, path+".unit_multiplier", m, l.Unit)
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
		if d, ok := w.duration(ln, path+".lease"); ok {
			if d < time.Second || d > 24*time.Hour {
				w.addf(ln, path+".lease", "%s is outside 1s..24h", d)
			} else {
				lease = d
			}
		}
	}
	return max, lease
}
