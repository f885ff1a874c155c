package limit

import "time"

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
// RateLimitDescriptor.limit); it replaces the rule's request limit. It is
// explicit per request, so a plan multiplier does not scale it.
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
	// Tokens, when TokensSet, is what the request costs its token limits
	// (ext_authz's estimate); it then replaces Hits there.
	Tokens    uint64
	TokensSet bool
	// Overrides replace the amount (and, when Unit is set, the window) of
	// the limits they name: an API key's or tenant's own limits.
	Overrides map[string]Override
	// ID identifies the request for its reservation and concurrency
	// leases (ext_authz sets it); empty for RLS.
	ID string
	// Tier is the caller's plan (ext_authz sets it from the identity).
	// When set it wins over a tier entry in the descriptors; see Tiers.
	Tier string
	// Model is the model the request is for (ext_authz sets it); when
	// empty, the descriptors' "model" entry is. It picks the pressure
	// scope (Shedding.Scope model) and, for breakers on "model", the
	// breaker.
	Model string
}

// Reservation is what an admitted request holds until its outcome is
// reconciled: the tokens reserved on each matched token limit and the
// concurrency leases taken, at the instant At.
type Reservation struct {
	ID     string
	At     time.Time
	Tokens uint64
}

// Status is the answer for one descriptor.
type Status struct {
	Code Code
	// Limit is the limit reported for the descriptor (the one that denied,
	// else the one with the least room left), with the plan multiplier
	// applied: the effective limit. nil when none applies.
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
	// Concurrency is set when the rule's max_concurrent cap denied.
	Concurrency bool
	// TooLarge is set when the request can never fit the denying limit:
	// its Cost there is more than the limit's whole Capacity (the amount,
	// or a token bucket's burst, after overrides and the plan multiplier,
	// before any pressure factor), so no wait helps. Limit is then that
	// limit, and RetryAfter means nothing.
	TooLarge bool
	Cost     uint64
	Capacity uint64
	// Gated is set when the denying limit is fair-shared and had room for
	// the request: its fair gate kept that room for members owed it
	// (docs/fair-share.md). The member's turn comes as the others are
	// served; the admission queue lets other waiters retry first.
	Gated bool
}

// CheckRequest enforces the caps on a request: its domain and every
// descriptor. Its errors wrap ErrInvalid.
func CheckRequest(req *Request) error {
	if req.Domain == "" {
		return Invalidf("domain is empty")
	}
	if len(req.Domain) > MaxDomainBytes {
		return Invalidf("domain is %d bytes, at most %d", len(req.Domain), MaxDomainBytes)
	}
	if len(req.Descriptors) == 0 {
		return Invalidf("no descriptors")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return Invalidf("%d descriptors, at most %d", len(req.Descriptors), MaxDescriptors)
	}
	for i := range req.Descriptors {
		if err := checkDescriptor(i, req.Descriptors[i].Entries); err != nil {
			return err
		}
	}
	return nil
}

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
