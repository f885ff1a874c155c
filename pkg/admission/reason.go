package admission

// Reason says which admission step refused a request.
type Reason uint8

const (
	// ReasonNone: the request was admitted.
	ReasonNone Reason = iota
	// ReasonLimit: a rate limit, token budget or concurrency cap.
	ReasonLimit
	// ReasonShed: the request's tier is shed under the current pressure.
	ReasonShed
	// ReasonBreaker: the circuit breaker of the request's upstream is open
	// (or half-open with every probe slot taken).
	ReasonBreaker
)

func (r Reason) String() string {
	switch r {
	case ReasonLimit:
		return "limit"
	case ReasonShed:
		return "shed"
	case ReasonBreaker:
		return "breaker"
	}
	return "none"
}
