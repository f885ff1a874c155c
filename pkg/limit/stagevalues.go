package limit

import "time"

// The values the admission stages (package admission) exchange with the
// algorithms that answer them: the pressure gate, the circuit breakers and
// the tickets. They live here, below admission, so that those packages and
// the stores need not import the pipeline that calls them.

// ShedState is what pressure does to one request of a tier now.
type ShedState struct {
	// Shed: the tier is refused (in shadow mode: would be).
	Shed bool
	// Shadow: the policy reports and applies nothing; Factor and NoBurst
	// are then ignored.
	Shadow bool
	// Factor scales every limit, in (0,1]; 0 or 1: unchanged.
	Factor float64
	// NoBurst shrinks every token bucket's burst to the policy's
	// BurstFloor of its rate.
	NoBurst bool
}

// BreakerVerdict is a breaker's answer to one request.
type BreakerVerdict struct {
	Allowed bool
	// ProbeID is set when the request was admitted as a half-open probe:
	// its outcome must come back with it (admission.Decision.Probes).
	ProbeID string
	// RetryAfter is set when the request is refused.
	RetryAfter time.Duration
}

// Probe is a half-open breaker's probe that an admitted request holds:
// its outcome must be reported with ID (ext_authz puts it in the dynamic
// metadata, and the access log brings it back).
type Probe struct {
	// Key is the breaker's descriptor key, Name its value.
	Key, Name string
	ID        string
}

// SettleOnceFor is how long a settled reservation is remembered, so a
// duplicate report is recognised: far longer than Envoy keeps retrying a
// stream. A ticket used to settle must be refused once it is older than
// this (package ticket's max age), or a replay would settle again.
const SettleOnceFor = time.Hour
