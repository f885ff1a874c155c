// Package headers formats the rate limit response headers every adapter
// sends (Envoy's draft-03 x-ratelimit-* trio, OpenAI's per-kind
// x-ratelimit-*-requests and -tokens, Retry-After) and the OpenAI-style
// error bodies of its refusals. It is shared by pkg/rls (ShouldRateLimit)
// and pkg/extauthz (Check), so a client sees the same headers and bodies
// whichever API admitted or denied it. It imports no protos: each adapter
// converts its own statuses to Quotas.
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
	// The same figures per kind of limit, as OpenAI names them: the
	// request limits' and the token budgets' separately, each kind's from
	// its own quota with the least room. A reset is a duration as OpenAI
	// writes it ("1s", "6m0s", "12ms"), not a number of seconds.
	LimitRequests     = "x-ratelimit-limit-requests"
	RemainingRequests = "x-ratelimit-remaining-requests"
	ResetRequests     = "x-ratelimit-reset-requests"
	LimitTokens       = "x-ratelimit-limit-tokens"     //nolint:gosec // G101: a header's name, not a credential
	RemainingTokens   = "x-ratelimit-remaining-tokens" //nolint:gosec // G101: a header's name, not a credential
	ResetTokens       = "x-ratelimit-reset-tokens"     //nolint:gosec // G101: a header's name, not a credential
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
	// Tokens: the limit is a token budget (limit.Tokens); its figures go
	// in the -tokens headers, a request limit's in the -requests ones.
	Tokens bool
}

// MaxAppended is the most headers Append appends: the draft-03 trio,
// Retry-After and both kinds' three.
const MaxAppended = 10

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
// nothing when no quota has a limit and none is over.
//
// Then, for each kind of limit among the quotas, OpenAI's three headers
// (x-ratelimit-limit-tokens ...), their figures picked the same way among
// that kind's quotas, the limit a plain number and the reset a duration
// rounded up to the millisecond. A client that reads OpenAI's headers
// thus sees the token budget even when a request limit has less room.
// A caller that passes a small array's slice as dst allocates nothing
// here but the one string the values share.
//
// A denial by a quota marked TooLarge invites no retry: the figures are
// that quota's (for its kind; the other kind's as usual), without any
// reset and Retry-After, and x-tollgate-reason: too_large and
// x-should-retry: false say why.
func Append(dst []Header, quotas []Quota) []Header {
	var retry time.Duration
	over := false
	var tooLarge *Quota
	for i := range quotas {
		q := &quotas[i]
		if q.TooLarge && q.Over && q.HasLimit {
			tooLarge = q
			break
		}
		if q.Over {
			over = true
			retry = max(retry, q.Reset)
		}
	}
	all := tooLarge
	if all == nil {
		all = worst(quotas, anyKind)
	}
	if all == nil && !over {
		return dst
	}
	// Every value is written into one buffer and converted to one string,
	// which the values then slice: one allocation for all of them.
	var buf [256]byte
	b := buf[:0]
	var vals [MaxAppended]Header // keys, with the values' ends in b for now
	var ends [MaxAppended]int
	n := 0
	add := func(key string) {
		vals[n].Key, ends[n] = key, len(b)
		n++
	}
	if all != nil {
		b = appendPolicies(b, quotas, all.Amount)
		add(Limit)
		b = strconv.AppendUint(b, all.Remaining, 10)
		add(Remaining)
		if tooLarge == nil {
			b = strconv.AppendInt(b, CeilSeconds(all.Reset), 10)
			add(Reset)
		}
	}
	if over && tooLarge == nil {
		b = strconv.AppendInt(b, max(1, CeilSeconds(retry)), 10)
		add(RetryAfter)
	}
	for _, k := range [...]kind{requestsKind, tokensKind} {
		q := worst(quotas, k)
		if tooLarge != nil && tooLarge.Tokens == (k == tokensKind) {
			q = tooLarge
		}
		if q == nil {
			continue
		}
		names := &kindNames[k]
		b = strconv.AppendUint(b, q.Amount, 10)
		add(names[0])
		b = strconv.AppendUint(b, q.Remaining, 10)
		add(names[1])
		if tooLarge == nil {
			b = appendDuration(b, q.Reset)
			add(names[2])
		}
	}
	s := string(b)
	from := 0
	for i := range n {
		dst = append(dst, Header{vals[i].Key, s[from:ends[i]]})
		from = ends[i]
	}
	if tooLarge != nil {
		dst = append(dst, Header{Reason, ReasonTooLarge}, Header{ShouldRetry, "false"})
	}
	return dst
}

// kind selects the quotas worst looks at.
type kind uint8

const (
	anyKind kind = iota
	requestsKind
	tokensKind
)

// kindNames are each kind's limit, remaining and reset headers.
var kindNames = [...][3]string{
	requestsKind: {LimitRequests, RemainingRequests, ResetRequests},
	tokensKind:   {LimitTokens, RemainingTokens, ResetTokens},
}

// worst is the quota with a limit of kind k that the headers report: on
// a denial the denying one with the longest wait, else the one with the
// least room, the first on a tie; nil when there is none. A denial
// reports the limit that denied, not a looser one that happens to have
// less room: with weighted costs a denying token budget can still show
// room, just not enough.
func worst(quotas []Quota, k kind) *Quota {
	var w *Quota
	for i := range quotas {
		q := &quotas[i]
		if !q.HasLimit || (k != anyKind && q.Tokens != (k == tokensKind)) {
			continue
		}
		switch {
		case w == nil:
			w = q
		case q.Over != w.Over:
			if q.Over {
				w = q
			}
		case q.Over:
			if q.Reset > w.Reset {
				w = q
			}
		case q.Remaining < w.Remaining:
			w = q
		}
	}
	return w
}

// appendDuration appends d, rounded up to the millisecond, as OpenAI
// writes its resets, which is time.Duration's String: "0s", "12ms",
// "1.5s", "6m0s", "1h2m3s".
func appendDuration(b []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(b, "0s"...)
	}
	ms := d / time.Millisecond
	if d%time.Millisecond != 0 {
		ms++ // not (d + 999999) / 1e6, which would wrap past MaxInt64 - 999999
	}
	if ms < 1000 {
		b = strconv.AppendInt(b, int64(ms), 10)
		return append(b, "ms"...)
	}
	h, m, s, frac := ms/3600000, ms/60000%60, ms/1000%60, ms%1000
	if h > 0 {
		b = strconv.AppendInt(b, int64(h), 10)
		b = append(b, 'h')
	}
	if h > 0 || m > 0 {
		b = strconv.AppendInt(b, int64(m), 10)
		b = append(b, 'm')
	}
	b = strconv.AppendInt(b, int64(s), 10)
	if frac > 0 {
		b = append(b, '.', byte('0'+frac/100))
		if frac%100 > 0 {
			b = append(b, byte('0'+frac/10%10))
			if frac%10 > 0 {
				b = append(b, byte('0'+frac%10))
			}
		}
	}
	return append(b, 's')
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
