package extauthz

import (
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// PartialBody is what Check does with a body it did not get whole: one
// Envoy cut at with_request_body.max_request_bytes (allow_partial_message),
// or one Envoy did not send at all (no with_request_body on the route).
// What it must not do is decide more cheaply than the whole body would
// have it decide.
type PartialBody uint8

const (
	// PartialRefuse, the default, admits a cut body only when what is
	// missing cannot change the decision's keys: the model field (when
	// Settings.ModelBodyField reads one) is in the part Envoy sent, and
	// the Content-Length gives the whole body's size to estimate from.
	// Otherwise the answer is 413 (500 when Envoy sent no body at all,
	// which is the gateway's configuration, not the client's request).
	PartialRefuse PartialBody = iota
	// PartialEstimate admits every cut body: the model from the part sent
	// or from Settings.ModelHeader (which the client chose), the estimate
	// from the largest size known. It is unsafe: a client that puts the
	// model after the cut is charged to another model, or to none, and
	// escapes that model's budgets and breaker.
	PartialEstimate
)

// partialBodyNames are PartialBody's config names, by value.
var partialBodyNames = [...]string{PartialRefuse: "refuse", PartialEstimate: "estimate"}

func (p PartialBody) String() string {
	if int(p) < len(partialBodyNames) {
		return partialBodyNames[p]
	}
	return fmt.Sprintf("PartialBody(%d)", p)
}

// bodyShape is what Check knows of a request's body besides the bytes
// Envoy sent.
type bodyShape struct {
	// sent is the number of body bytes in the Check: the whole body, or
	// the first part of it.
	sent int64
	// cut says the body has bytes that are not in the Check.
	cut bool
	// size is the whole body's size: sent for a body that is not cut,
	// its Content-Length for one that is, -1 when that is unknown.
	size int64
	// least is the fewest bytes the whole body can have: its size when
	// known.
	least int64
}

// shapeOf works out whether the body in h is whole and how big it is,
// from what Envoy's ext_authz filter puts in a Check:
//   - whenever it buffered a body (with_request_body), the header
//     x-envoy-auth-partial-body, "true" when it sent only the first
//     max_request_bytes; it drops any such header the client sent;
//   - Size, the body bytes it had received when it made the Check
//     (StreamInfo's bytesReceived): not the Content-Length, and 0 when it
//     made the Check on the headers, without waiting for a body;
//   - the client's content-length, when there was one.
//
// A body is taken as cut on any sign of more bytes than were sent, so a
// "false" that a caller other than Envoy wrote buys nothing; and a
// Content-Length that cannot be the body's (malformed, or fewer bytes
// than arrived) counts as none.
func shapeOf(h *authv3.AttributeContext_HttpRequest, sent int64) bodyShape {
	headers := h.GetHeaders()
	flag, flagged := headers[PartialBodyHeader]
	cl, hasLength := contentLength(headers["content-length"])
	s := bodyShape{sent: sent, size: -1, least: max(sent, h.GetSize())}
	s.cut = (flagged && flag != "false") || (hasLength && cl > sent) || h.GetSize() > sent ||
		// Chunked, with no Content-Length, and Envoy did not wait for
		// the body: a body of unknown size.
		(sent == 0 && !flagged && headers["transfer-encoding"] != "")
	switch {
	case !s.cut:
		s.size = sent
	case hasLength && cl >= s.least:
		s.size, s.least = cl, cl
	}
	return s
}

// maxContentLengthDigits keeps contentLength's sum within an int64.
const maxContentLengthDigits = 18

// contentLength reads a content-length header value: decimal digits and
// nothing else, as RFC 9110 has it; Envoy joins repeated headers with a
// comma, which is therefore no length either.
func contentLength(v string) (int64, bool) {
	if v == "" || len(v) > maxContentLengthDigits {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// refusePartial is the refusal of a cut body under set's PartialBody
// policy, or nil when Check may decide on it; model is the model the part
// sent names ("" for none).
func refusePartial(set *Settings, s bodyShape, model string) *problem {
	if set.PartialBody == PartialEstimate {
		return nil
	}
	// The model matters wherever it is read from the body: it picks the
	// model descriptors, the breaker and the pressure scope, which the
	// rules behind the Decider may all key on. The header is no stand-in,
	// since the client sets it and the upstream reads the body.
	noModel := set.ModelBodyField != "" && model == ""
	switch {
	case !noModel && s.size >= 0:
		return nil
	case s.sent == 0:
		return errBodyNotSent
	case noModel:
		return &problem{status: 413, errCode: "request_too_large", result: resultPartialBody, msg: fmt.Sprintf(
			"Only the first %d bytes of a request body are checked, and the %s field is not within them. Put %s before the other fields, or send at most %d bytes.",
			s.sent, set.ModelBodyField, set.ModelBodyField, s.sent)}
	default:
		return &problem{status: 413, errCode: "request_too_large", result: resultPartialBody, msg: fmt.Sprintf(
			"Only the first %d bytes of a request body are checked, and this one has no valid Content-Length. Send a Content-Length header, or at most %d bytes.",
			s.sent, s.sent)}
	}
}

// errBodyNotSent answers a request whose body Envoy did not send when the
// body decides: the gateway's configuration, so a 500, not the client's
// 4xx.
var errBodyNotSent = &problem{status: 500, errType: "server_error", errCode: "request_body_not_checked", result: resultBodyNotSent,
	msg: "The gateway did not pass the request body on to be checked, so the request cannot be admitted. Its operator must set with_request_body on the ext_authz filter."}
