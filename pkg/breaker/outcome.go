package breaker

import "time"

// Outcome is a finished request as a breaker needs it; an adapter (the
// access log) fills it.
type Outcome struct {
	// Status is the HTTP status sent downstream, 0 when none was.
	Status uint32
	// Duration is the request's duration.
	Duration time.Duration
	// Upstream is the cluster the request went to; empty when it never
	// reached one (a denial by Tollgate or another filter), and then the
	// outcome says nothing of the upstream.
	Upstream string
	// Name is the value of the breaker's descriptor key for the request.
	Name string
	// ProbeID is the Verdict's ProbeID when the request was a probe.
	ProbeID string
}

// Classify says whether o is a success or a failure under c's rule, and
// ok = false when it says nothing: no name, no upstream, or no response
// within Timeout.
//
// A failure is a response with status 5xx or 408, or with status 0 (no
// response was sent) when c.Timeout is set and the request lasted at
// least that long. Any other status is a success (a 4xx is the client's
// fault, and a 429 the upstream limiting, not failing).
func Classify(c Config, o Outcome) (success, ok bool) {
	switch {
	case o.Name == "" || o.Upstream == "":
		return false, false
	case o.Status >= 500 && o.Status < 600, o.Status == 408:
		return false, true
	case o.Status == 0:
		if c.Timeout > 0 && o.Duration >= c.Timeout {
			return false, true
		}
		return false, false
	}
	return true, true
}
