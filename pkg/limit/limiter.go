package limit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Code is a decision's outcome; the values follow Envoy's
// RateLimitResponse.Code.
type Code uint8

const (
	CodeOK        Code = 1
	CodeOverLimit Code = 2
)

func (c Code) String() string {
	if c == CodeOverLimit {
		return "over_limit"
	}
	return "ok"
}

// Override is a limit sent with the descriptor (Envoy's
// RateLimitDescriptor.limit); it replaces the rule's request limit.
type Override struct {
	Amount     uint64
	Unit       Unit
	Multiplier uint32
}

// Descriptor is one request descriptor.
type Descriptor struct {
	Entries  []Entry
	Override *Override
	// Hits is the per-descriptor hits_addend, meaningful when HitsSet.
	Hits    uint64
	HitsSet bool
	// Negative refunds instead of charging (Envoy's is_negative_hits).
	Negative bool
}

// Request is one admission question.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Hits is the request-level hits_addend; 0 means 1 for request limits.
	Hits uint64
}

// Status is the answer for one descriptor.
type Status struct {
	Code Code
	// Limit is the limit reported for the descriptor (the one that denied,
	// else the one with the least room left); nil when none applies.
	Limit      *Limit
	Remaining  uint64
	ResetAfter time.Duration
	RetryAfter time.Duration
	// Rule is the matched rule, nil for none or an override without a rule.
	Rule *Rule
	// ShadowOver is set when a shadow-mode rule would have denied.
	ShadowOver bool
	// Replaced is set when another matched rule's replaces removed this one.
	Replaced bool
}

// Decision is the answer to a Request.
type Decision struct {
	Code     Code
	Statuses []Status
}

// Limiter matches requests against the current rules and applies the
// charges to its Store in one call, all or nothing.
type Limiter struct {
	rules atomic.Pointer[RuleSet]
	store Store
	clock Clock
}

// NewLimiter returns a Limiter over store; rules may be nil (everything is
// then unknown and allowed) and can be swapped later with SetRules.
func NewLimiter(store Store, clock Clock, rules *RuleSet) *Limiter {
	if clock == nil {
		clock = SystemClock{}
	}
	l := &Limiter{store: store, clock: clock}
	if rules != nil {
		l.rules.Store(rules)
	}
	return l
}

// SetRules swaps the rules atomically; decisions in flight finish on the old set.
func (l *Limiter) SetRules(rs *RuleSet) { l.rules.Store(rs) }

// Rules returns the rules in force (nil before the first load).
func (l *Limiter) Rules() *RuleSet { return l.rules.Load() }

// plan ties a charge to the descriptor it came from.
type plan struct {
	desc  int
	limit *Limit
}

// Decide answers req. It returns an error wrapping ErrInvalid for a
// malformed request, and the store's error when the store fails.
func (l *Limiter) Decide(ctx context.Context, req *Request) (*Decision, error) {
	if req.Domain == "" {
		return nil, invalidf("domain is empty")
	}
	if len(req.Domain) > MaxDomainBytes {
		return nil, invalidf("domain is %d bytes, at most %d", len(req.Domain), MaxDomainBytes)
	}
	if len(req.Descriptors) == 0 {
		return nil, invalidf("no descriptors")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return nil, invalidf("%d descriptors, at most %d", len(req.Descriptors), MaxDescriptors)
	}
	for i := range req.Descriptors {
		if err := checkDescriptor(i, req.Descriptors[i].Entries); err != nil {
			return nil, err
		}
	}
	dec := &Decision{Code: CodeOK, Statuses: make([]Status, len(req.Descriptors))}
	for i := range dec.Statuses {
		dec.Statuses[i].Code = CodeOK
	}
	dom := l.rules.Load().Domain(req.Domain)
	if dom == nil {
		return dec, nil
	}

	// Match every descriptor first: replaces needs all of them.
	rules := make([]*Rule, len(req.Descriptors))
	var replaced map[string]bool
	var keyEntries map[int][]Entry // descriptors counted under a share_threshold wildcard
	for i := range req.Descriptors {
		r, shared := dom.match(req.Descriptors[i].Entries)
		if shared != 0 {
			if keyEntries == nil {
				keyEntries = map[int][]Entry{}
			}
			keyEntries[i] = dom.sharedEntries(req.Descriptors[i].Entries, shared)
		}
		rules[i] = r
		dec.Statuses[i].Rule = r
		if r != nil && len(r.Replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, n := range r.Replaces {
				replaced[n] = true
			}
		}
	}

	var charges []Charge
	var plans []plan
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		r := rules[i]
		if r != nil && r.Unlimited {
			continue
		}
		rate, tokens := (*Limit)(nil), (*Limit)(nil)
		if r != nil {
			rate, tokens = r.RateLimit, r.TokenLimit
		}
		if d.Override != nil {
			ov := &Limit{Kind: Requests, Amount: d.Override.Amount, Unit: d.Override.Unit, Multiplier: d.Override.Multiplier}
			if rate != nil {
				ov.Name, ov.Algorithm, ov.Buckets = rate.Name, rate.Algorithm, rate.Buckets
				// A token bucket of 0 has no emission interval; a sliding
				// window of 0 denies everything, which is what 0 asks for.
				if rate.Algorithm == TokenBucket && d.Override.Amount == 0 {
					ov.Algorithm = SlidingWindow
				}
			}
			if ov.Window() <= 0 {
				return nil, invalidf("descriptors[%d].limit: unit %d is not known", i, d.Override.Unit)
			}
			rate = ov
		}
		if rate != nil && rate.Name != "" && replaced[rate.Name] {
			dec.Statuses[i].Replaced = true
			rate = nil
		}
		if tokens != nil && tokens.Name != "" && replaced[tokens.Name] {
			dec.Statuses[i].Replaced = true
			tokens = nil
		}
		if rate == nil && tokens == nil {
			continue
		}
		rateCost, tokenCost := costs(req, d, tokens != nil)
		shadow := r != nil && r.Shadow
		ents := d.Entries
		if ke, ok := keyEntries[i]; ok {
			ents = ke
		}
		if rate != nil && !(tokens != nil && d.HitsSet) {
			charges = append(charges, charge(req.Domain, ents, rate, rateCost, shadow))
			plans = append(plans, plan{desc: i, limit: rate})
		}
		if tokens != nil {
			c := charge(req.Domain, ents, tokens, tokenCost, shadow)
			// A cost report is usage already spent: Envoy ignores the
			// answer to it, so refusing it would lose the usage and let a
			// tenant whose responses outgrow its remaining budget run on.
			c.Force = d.HitsSet && tokenCost > 0
			charges = append(charges, c)
			plans = append(plans, plan{desc: i, limit: tokens})
		}
	}
	if len(charges) == 0 {
		return dec, nil
	}
	res := make([]Result, len(charges))
	admitted, err := l.store.Apply(ctx, l.clock.Now(), charges, res)
	if err != nil {
		return nil, fmt.Errorf("apply %d charges: %w", len(charges), err)
	}
	if !admitted {
		dec.Code = CodeOverLimit
	}
	for k, p := range plans {
		st := &dec.Statuses[p.desc]
		rs := res[k]
		if !rs.Fits && charges[k].Shadow {
			st.ShadowOver = true
			rs.Fits = true
		}
		if !rs.Fits && charges[k].Force {
			rs.Fits = true // kept and not blocking: the budget now shows 0 left
		}
		if report(st, p.limit, rs) {
			st.Limit = p.limit
			st.Remaining = rs.Remaining
			st.ResetAfter = rs.ResetAfter
			st.RetryAfter = rs.RetryAfter
			if !rs.Fits {
				st.Code = CodeOverLimit
			}
		}
	}
	return dec, nil
}

// costs returns what a descriptor charges its request limit and its token
// limit. A rule with only a request limit charges the hits_addend, as
// envoyproxy/ratelimit does. A rule with a token limit treats a descriptor
// that carries its own hits_addend as a cost report (only the token limit
// is charged, typically from apply_on_stream_done) and any other
// descriptor as a request: one request, plus the request-level
// hits_addend as tokens (0, the usual case, checks that budget is left).
func costs(req *Request, d *Descriptor, hasTokens bool) (rate, tokens int64) {
	hits := req.Hits
	if hits == 0 {
		hits = 1
	}
	if d.HitsSet {
		hits = d.Hits
	}
	rate = clampCost(hits)
	if hasTokens {
		rate = 1
		if d.HitsSet {
			tokens = clampCost(d.Hits)
		} else {
			tokens = clampCost(req.Hits)
		}
	}
	if d.Negative {
		rate, tokens = -rate, -tokens
	}
	return rate, tokens
}

func clampCost(h uint64) int64 {
	const maxCost = 1 << 53 // exact in a float64, as Lua counts
	if h > maxCost {
		return maxCost
	}
	return int64(h)
}

func charge(domain string, entries []Entry, l *Limit, cost int64, shadow bool) Charge {
	return Charge{
		Key:       Key(l.Kind, l.Algorithm, l.Window(), domain, entries),
		Algorithm: l.Algorithm,
		Amount:    l.Amount,
		Window:    l.Window(),
		Burst:     l.Burst,
		Buckets:   l.Buckets,
		Cost:      cost,
		Shadow:    shadow,
	}
}

// report says whether r should replace what st reports: a denial wins,
// then the limit with the smaller share of room left.
func report(st *Status, l *Limit, r Result) bool {
	if st.Limit == nil {
		return true
	}
	if st.Code == CodeOverLimit {
		return false
	}
	if !r.Fits {
		return true
	}
	// r.Remaining/l.Amount < st.Remaining/st.Limit.Amount, without division.
	return float64(r.Remaining)*float64(st.Limit.Amount) < float64(st.Remaining)*float64(l.Amount)
}
