package headers

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// OpenAI's error types and codes, as its API answers the same cases, so
// that clients (and the OpenAI SDKs) classify a refusal by Tollgate as
// they would OpenAI's own: a rate limit is a 429 of type "requests" or
// "tokens" with code rate_limit_exceeded, a refused request is an
// invalid_request_error, an unavailable service a server_error. Where
// OpenAI sends no code for a case (a missing key, an overload), Tollgate
// sends its own.
const (
	TypeRequests       = "requests"
	TypeTokens         = "tokens"
	TypeInvalidRequest = "invalid_request_error"
	TypeServerError    = "server_error"
	CodeRateLimit      = "rate_limit_exceeded"
)

// Error is the "error" object of the OpenAI-style JSON body of every
// refusal: OpenAI's message, type, code and param, and Tollgate's own
// reason beside them in tollgate_reason, the same word x-tollgate-reason
// carries where that header is sent.
type Error struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
	// Param names the request field at fault, when one is.
	Param  string `json:"param,omitempty"`
	Reason string `json:"tollgate_reason,omitempty"`
}

// Body is the response body for e: {"error": e}.
func (e *Error) Body() []byte {
	b, _ := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	return b
}

// LimitError is the error of a refusal by the limits (not a request too
// large for one, see TooLargeError): OpenAI's rate limit error, of type
// "tokens" when the denial that waits longest is a token budget's and
// "requests" otherwise (a request limit, or a concurrency cap, which
// OpenAI does not have), and a message that names the limit and says how
// long to wait, in whole seconds, at least 1. The caller sets Reason.
func LimitError(statuses []limit.Status) Error {
	e := Error{Type: TypeRequests, Code: CodeRateLimit, Message: "Rate limit exceeded"}
	found, name := false, ""
	var wait time.Duration
	for i := range statuses {
		st := &statuses[i]
		if st.Code != limit.CodeOverLimit {
			continue
		}
		w := st.RetryAfter
		if w <= 0 {
			w = st.ResetAfter
		}
		if found && w < wait {
			continue
		}
		found, wait = true, w
		switch {
		case st.Concurrency:
			e.Type, e.Message, name = TypeRequests, "Too many requests are in flight", ""
		case st.Limit != nil && st.Limit.Kind == limit.Tokens:
			e.Type, e.Message, name = TypeTokens, "Token budget exceeded", st.Limit.Name
		default:
			e.Type, e.Message, name = TypeRequests, "Rate limit exceeded", ""
			if st.Limit != nil {
				name = st.Limit.Name
			}
		}
	}
	if name != "" {
		e.Message += " (" + name + ")"
	}
	e.Message = RetryMessage(e.Message, wait)
	return e
}

// RetryMessage is msg, then ". Retry after N seconds." with N the wait
// in whole seconds, rounded up, at least 1 ("1 second").
func RetryMessage(msg string, wait time.Duration) string {
	n := max(1, CeilSeconds(wait))
	if n == 1 {
		return msg + ". Retry after 1 second."
	}
	return msg + ". Retry after " + strconv.FormatInt(n, 10) + " seconds."
}

// TooLargeError is the error of a request that can never fit st's limit
// (see TooLargeMessage). Its type and code are not OpenAI's for the case
// (a 429 of type "tokens", rate_limit_exceeded): clients retry those, and
// this request can only be made smaller. The caller sets Reason.
func TooLargeError(st *limit.Status) Error {
	name, tokens := "", false
	if st.Limit != nil {
		name, tokens = st.Limit.Name, st.Limit.Kind == limit.Tokens
	}
	return Error{Message: TooLargeMessage(name, tokens, st.Capacity, st.Cost), Type: TypeInvalidRequest, Code: CodeTooLarge}
}
