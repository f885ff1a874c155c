package admission

import (
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Explain works out, without a store, what Decide would do with req on
// dom: how each descriptor matches, the plan, what shedder's state does
// to the request, which breakers it would ask, and the charges it would
// send. It runs the Limiter's own steps (shed, match, build), so the rules
// and keys it reports are the ones a decision uses; only the store's
// answer is missing. shedder may be nil (no pressure). It is for
// `tollgate explain`, off the hot path.
func Explain(dom *limit.Domain, req *limit.Request, shedder Shedder) (*Explanation, error) {
	if err := limit.CheckRequest(req); err != nil {
		return nil, err
	}
	ex := &Explanation{Multiplier: 1, Descriptors: make([]DescriptorExplanation, len(req.Descriptors))}
	var micro uint64
	ex.Tier, micro = dom.Plan(req)
	if dom.Tiers != nil {
		ex.Multiplier = dom.Tiers.Plans[ex.Tier]
		ex.TierGiven = req.Tier
		if ex.TierGiven == "" {
			ex.TierGiven = firstValue(req, dom.Tiers.Key)
		}
		ex.TierDefaulted = ex.TierGiven != ex.Tier
	}
	for i := range req.Descriptors {
		de := &ex.Descriptors[i]
		de.Entries = req.Descriptors[i].Entries
		if dom.Tiers != nil {
			de.Entries = limit.StripTier(de.Entries, dom.Tiers.Key)
		}
		if len(de.Entries) > 0 {
			de.Steps = dom.MatchSteps(de.Entries)
		}
	}

	if dom.Shedding != nil {
		ex.Scope = limit.ScopeGlobal
		if dom.Shedding.Scope == limit.ScopeModel {
			if m := req.Value(limit.ModelKey); m != "" {
				ex.Scope = m
			}
		}
		if shedder != nil {
			ex.Shed = shedder.Shed(dom.Name, ex.Scope, ex.Tier)
		}
	}
	l := &Limiter{shedder: shedder}
	dec := newDecision(len(req.Descriptors))
	adj, shed := l.shed(dom, req, dec)
	if shed {
		ex.Refused, ex.Reason, ex.RetryAfter = true, ReasonShed, dom.Shedding.RetryAfter()
		return ex, nil
	}
	ex.ShadowShed = dec.ShadowShed

	b := new(built)
	if err := build(b, dom, req, admit, dec.Statuses, adj); err != nil {
		return nil, err
	}
	for i := range dec.Statuses {
		ex.Descriptors[i].Rule = dec.Statuses[i].Rule
		ex.Descriptors[i].Replaced = dec.Statuses[i].Replaced
	}
	for _, bc := range dom.Breakers {
		ex.Breakers = append(ex.Breakers, BreakerCheck{Key: bc.Key, Name: req.Value(bc.Key)})
	}
	for k, p := range b.plans {
		c := b.charges[k]
		ce := ChargeExplanation{Charge: c, Limit: p.limit}
		ce.Rule = ex.Descriptors[p.desc].Rule
		// A concurrency lease has no Limit; a descriptor's own request
		// limit is scaled by neither plan nor pressure, so it has no base.
		if r := ce.Rule; r != nil && p.limit != nil {
			base := r.RateLimit
			if p.limit.Kind == limit.Tokens {
				base = r.TokenLimit
			} else if req.Descriptors[p.desc].Override != nil {
				base = nil
			}
			ce.Base = overridden(base, req.Overrides)
			ce.Planned = limit.Scaled(ce.Base, micro)
			if r.Fair != nil {
				ce.Planned = ce.Base // shared: the plan is the weight
			}
		}
		if r := ce.Rule; r != nil && r.Fair != nil && c.Fair.Policy != nil {
			ce.FairValue = firstValue(req, r.Fair.Key)
		}
		ex.Charges = append(ex.Charges, ce)
		ex.Descriptors[p.desc].Charges = append(ex.Descriptors[p.desc].Charges, len(ex.Charges)-1)
	}
	return ex, nil
}

// Explanation is Explain's answer.
type Explanation struct {
	// Tier is the plan the request is decided under ("" without tiers),
	// Multiplier its multiplier (1 without tiers). TierGiven is the plan
	// the request named ("" for none); TierDefaulted is set when it
	// named none or one not listed, so Tier is the default.
	Tier          string
	TierGiven     string
	TierDefaulted bool
	Multiplier    float64
	// Scope is the pressure scope the domain's shedding reads for the
	// request ("" without shedding), and Shed what the shedder said.
	Scope string
	Shed  limit.ShedState
	// Refused is set when shedding refuses the request before any limit
	// (Reason ReasonShed); nothing is then matched against the limits.
	Refused    bool
	Reason     Reason
	RetryAfter time.Duration
	// ShadowShed: a shadow shedding policy would have refused it.
	ShadowShed  bool
	Descriptors []DescriptorExplanation
	// Breakers are the domain's breakers in the order the Limiter asks
	// them; one whose Name is empty is skipped (the request has no entry
	// for its key).
	Breakers []BreakerCheck
	// Charges are what the request would send to the store, all or
	// nothing, in the Limiter's order.
	Charges []ChargeExplanation
}

// DescriptorExplanation is how one descriptor matched.
type DescriptorExplanation struct {
	// Entries are the entries as matched and keyed: tier entries removed.
	Entries []limit.Entry
	// Steps is the walk down the rule tree, one per entry until one
	// matched nothing.
	Steps []limit.MatchStep
	// Rule is the matched rule, nil when none (the walk stopped, or its
	// last entry landed on a rule without a limit).
	Rule *limit.Rule
	// Replaced: another matched rule's replaces removed this one's limit.
	Replaced bool
	// Charges index Explanation.Charges.
	Charges []int
}

// BreakerCheck is one breaker the Limiter would ask: the breaker of Key
// named Name.
type BreakerCheck struct {
	Key, Name string
}

// ChargeExplanation is one charge and the limit behind it.
type ChargeExplanation struct {
	// Charge is what goes to the store (Key exactly as Key builds it).
	Charge limit.Charge
	// Limit is the effective limit: after the key's or tenant's
	// override, the plan multiplier and pressure. nil for a concurrency
	// lease (Charge.Amount is then its cap).
	Limit *limit.Limit
	// Base is the rule's limit (with the request's override), Planned
	// the same after the plan multiplier only; nil for a descriptor's
	// own limit and for a concurrency lease.
	Base, Planned *limit.Limit
	Rule          *limit.Rule
	// FairValue, on a fair-shared charge (Charge.Fair.Policy set), is the
	// value of Rule.Fair.Key that Charge.Fair.Member hashes; "" when the
	// request carries none and shares the overflow member.
	FairValue string
}

// firstValue is the value of the first entry named key in req's
// descriptors, in order.
func firstValue(req *limit.Request, key string) string {
	for i := range req.Descriptors {
		for _, e := range req.Descriptors[i].Entries {
			if e.Key == key {
				return e.Value
			}
		}
	}
	return ""
}
