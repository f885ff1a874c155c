// Package headers formats the rate limit response headers every adapter
// sends: Envoy's draft-03 x-ratelimit-* trio and Retry-After. It is shared
// by pkg/rls (ShouldRateLimit) and pkg/extauthz (Check), so a client sees
// the same headers whichever API admitted or denied it. It imports no
// protos: each adapter converts its own statuses to Quotas.
package headers

import (
	"strconv"
	"time"
)

// Header names, as Envoy's DRAFT_VERSION_03 option names them, plus
// Retry-After on a denial.
const (
	Limit      = "x-ratelimit-limit"
	Remaining  = "x-ratelimit-remaining"
	Reset      = "x-ratelimit-reset"
	RetryAfter = "retry-after"
	// Reason says, on a refusal before any limit, which step refused:
	// "shed" (tier shedding by pressure) or "breaker" (an open circuit
	// breaker); on a refusal by a limit the request can never fit,
	// ReasonTooLarge. Any other refusal by a limit carries none.
	Reason         = "x-tollgate-reason"
	ReasonTooLarge = "too_large"
	// ShouldRetry is "false" on a refusal no retry can pass: the OpenAI
	// SDKs read it and then skip the retries they make on any 429.
	ShouldRetry = "x-should-retry"
	// Degraded says the store could not answer and the rules'
	// store_failure did; its value is DegradedStore. DegradedOverload
	// says the replica answered without deciding, past --max-in-flight.
	Degraded         = "x-tollgate-degraded"
	DegradedStore    = "store"
	DegradedOverload = "overload"
)

// Quota is one status as the headers report it.
type Quota struct {
	// HasLimit is false for a status with no limit to report (no rule
	// matched, or only a concurrency cap denied): such a status adds
	// nothing but its wait to Retry-After, and only when Over.
	HasLimit bool
	Amount   uint64
	// WindowSeconds is the limit's window; 0 when unknown, which leaves
	// the limit out of the quota policies.
	WindowSeconds uint64
	Name          string
	Remaining     uint64
	// Reset is the time until the window resets or, for a denial, until
	// the request would fit.
	Reset time.Duration
	Over  bool
	// TooLarge: the request can never fit this quota (its cost is more
	// than the limit's capacity), so no wait is reported.
	TooLarge bool
}

// Header is one response header.
type Header struct {
	Key, Value string
}

// Append appends to dst the draft-03 headers Envoy itself would build from the
// statuses with enable_x_ratelimit_headers, so they also reach clients
// when that option is off: the figures come from the quota with the
// smallest remaining (the first on a tie) or, on a denial, from the
// denying quota with the longest wait, and x-ratelimit-limit lists a
// quota policy for every quota that has a limit, e.g.
// `10, 10;w=1;name="per-ip", 1000;w=3600`. Unlike Envoy, the reset is
// rounded up to whole seconds, so a client that waits that long finds the
// window reset rather than one second short of it. Retry-After, on a
// denial, is the longest wait among the denying quotas, as Envoy's
// enable_retry_after_header computes it, at least one second. It appends
// nothing when no quota has a limit and none is over. A caller that
// passes a small array's slice as dst allocates nothing here.
//
// A denial by a quota marked TooLarge invites no retry: the figures are
// that quota's, without x-ratelimit-reset and Retry-After, and
// x-tollgate-reason: too_large and x-should-retry: false say why.
func Append(dst []Header, quotas []Quota) []Header {
	var minQ *Quota
	var retry time.Duration
	over := false
	for i := range quotas {
		q := &quotas[i]
		if q.TooLarge && q.Over && q.HasLimit {
			return appendTooLarge(dst, quotas, q)
		}
		if q.Over {
			over = true
			retry = max(retry, q.Reset)
		}
		if !q.HasLimit {
			continue
		}
		// A denial reports the limit that denied (the one with the longest
		// wait, which Retry-After also gives), not a looser one that
		// happens to have less room: with weighted costs a denying token
		// budget can still show room, just not enough.
		switch {
		case minQ == nil:
			minQ = q
		case q.Over != minQ.Over:
			if q.Over {
				minQ = q
			}
		case q.Over:
			if q.Reset > minQ.Reset {
				minQ = q
			}
		case q.Remaining < minQ.Remaining:
			minQ = q
		}
	}
	if minQ == nil && !over {
		return dst
	}
	// Every value is written into one buffer and converted to one string,
	// which the values then slice: one allocation for all of them.
	var buf [256]byte
	b := buf[:0]
	var ends [4]int
	n := 0
	if minQ != nil {
		b = appendPolicies(b, quotas, minQ.Amount)
		ends[0] = len(b)
		b = strconv.AppendUint(b, minQ.Remaining, 10)
		ends[1] = len(b)
		b = strconv.AppendInt(b, CeilSeconds(minQ.Reset), 10)
		ends[2] = len(b)
		n = 3
	}
	if over {
		b = strconv.AppendInt(b, max(1, CeilSeconds(retry)), 10)
		ends[n] = len(b)
	}
	vals := string(b)
	if minQ != nil {
		dst = append(dst,
			Header{Limit, vals[:ends[0]]},
			Header{Remaining, vals[ends[0]:ends[1]]},
			Header{Reset, vals[ends[1]:ends[2]]},
		)
	}
	if over {
		from := 0
		if n > 0 {
			from = ends[n-1] //nolint:gosec // G602: n > 0 here
		}
		dst = append(dst, Header{RetryAfter, vals[from:ends[n]]})
	}
	return dst
}

// CodeTooLarge is the OpenAI-style error code of a request that can never
// fit a limit: the answer's body carries it with TooLargeMessage.
const CodeTooLarge = "request_too_large"

// TooLargeMessage says that a request costing cost can never fit the
// limit named name (may be empty) of capacity, in OpenAI's own words for
// the case ("Request too large ... Limit X, Requested Y"), and that a
// retry cannot help. tokens says whether the limit counts tokens.
func TooLargeMessage(name string, tokens bool, capacity, cost uint64) string {
	kind := "requests"
	if tokens {
		kind = "tokens"
	}
	b := make([]byte, 0, 160)
	b = append(b, "Request too large for the "...)
	b = append(b, kind...)
	b = append(b, " limit"...)
	if name != "" {
		b = append(b, ` "`...)
		b = appendQuoted(b, name)
		b = append(b, '"')
	}
	b = append(b, ": Limit "...)
	b = strconv.AppendUint(b, capacity, 10)
	b = append(b, ", Requested "...)
	b = strconv.AppendUint(b, cost, 10)
	b = append(b, ". The request must be made smaller; retrying it cannot succeed."...)
	return string(b)
}

// appendTooLarge is Append for a denial by q, a quota the request can
// never fit.
func appendTooLarge(dst []Header, quotas []Quota, q *Quota) []Header {
	var buf [256]byte
	b := appendPolicies(buf[:0], quotas, q.Amount)
	end := len(b)
	b = strconv.AppendUint(b, q.Remaining, 10)
	vals := string(b)
	return append(dst,
		Header{Limit, vals[:end]},
		Header{Remaining, vals[end:]},
		Header{Reason, ReasonTooLarge},
		Header{ShouldRetry, "false"},
	)
}

// appendPolicies appends x-ratelimit-limit's value: amount, then a quota
// policy for every quota with a limit and a window.
func appendPolicies(b []byte, quotas []Quota, amount uint64) []byte {
	b = strconv.AppendUint(b, amount, 10)
	for i := range quotas {
		q := &quotas[i]
		if !q.HasLimit || q.WindowSeconds == 0 {
			continue
		}
		b = append(b, ", "...)
		b = strconv.AppendUint(b, q.Amount, 10)
		b = append(b, ";w="...)
		b = strconv.AppendUint(b, q.WindowSeconds, 10)
		if q.Name != "" {
			b = append(b, `;name="`...)
			b = appendQuoted(b, q.Name)
			b = append(b, '"')
		}
	}
	return b
}

// CeilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// appendQuoted appends s as the inside of a structured-field string: only
// printable ASCII, with '"' and '\' escaped. Names come from rule files,
// but a header value must stay well-formed whatever they hold.
func appendQuoted(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return b
}
