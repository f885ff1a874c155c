package admission

// Reason says why a request was refused, and picks what the client is
// told. This file is the one place a denial reason is declared: adding
// one means a constant and its row of answers below, and every adapter
// maps a Reason to its wire form through Answer, not a switch of its own.
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
	// ReasonTooLarge: the request costs more than a limit's whole
	// capacity, so no wait helps (Decision.TooLarge names the limit).
	ReasonTooLarge
	// ReasonUnauthenticated: the API key is missing or unknown. ext_authz
	// refuses it before the pipeline runs, as only it reads keys; no
	// Decision carries it.
	ReasonUnauthenticated
)

// Answer is what a refusal for one Reason tells the client.
type Answer struct {
	// Name is the Reason's String, and x-tollgate-reason's value where
	// the answer carries that header.
	Name string
	// Result is the `result` label of the decisions counters for a
	// request refused for this reason; "" for ReasonLimit, whose label
	// each descriptor's status picks (over_limit, shadow_over).
	Result string
	// Status is the HTTP status ext_authz answers with. RLS can only say
	// OVER_LIMIT, which Envoy answers with its own configured status.
	Status int
	// RetryAfter: the answer carries Retry-After, as waiting helps.
	RetryAfter bool
	// BeforeLimits: the request is refused before any limit is charged,
	// so its statuses report no limit; the wait (Decision.RetryAfter)
	// and the reason go in headers of their own.
	BeforeLimits bool
	// Type, Code and Message are the OpenAI-style error type and code
	// and the client's message of an answer that no limit shapes; ""
	// where the status's limit words them (429, 413: see
	// headers.LimitError) or the caller does (401). The type is OpenAI's
	// for a 503 ("server_error"), so clients classify the refusal as
	// they would the upstream's; OpenAI sends no code there, so the code
	// is Tollgate's.
	Type, Code, Message string
}

// answers is the table: one row per Reason.
var answers = [...]Answer{
	ReasonNone:  {Name: "none", Result: "ok", Status: 200},
	ReasonLimit: {Name: "limit", Status: 429, RetryAfter: true},
	ReasonShed: {Name: "shed", Result: "shed", Status: 503, RetryAfter: true, BeforeLimits: true,
		Type: "server_error", Code: "overloaded", Message: "The service is overloaded; requests of your plan are paused"},
	ReasonBreaker: {Name: "breaker", Result: "breaker_open", Status: 503, RetryAfter: true, BeforeLimits: true,
		Type: "server_error", Code: "upstream_unavailable", Message: "The model is failing and temporarily unavailable"},
	ReasonTooLarge:        {Name: "too_large", Result: "too_large", Status: 413},
	ReasonUnauthenticated: {Name: "unauthenticated", Result: "unauthenticated", Status: 401},
}

// Answer is r's row of the table; ReasonNone's for a value outside it.
func (r Reason) Answer() Answer {
	if int(r) < len(answers) {
		return answers[r]
	}
	return answers[ReasonNone]
}

func (r Reason) String() string { return r.Answer().Name }
