// Package headers formats the rate limit response headers every adapter
// sends: Envoy's draft-03 x-ratelimit-* trio and Retry-After. It is shared
// by pkg/rls (ShouldRateLimit) and pkg/extauthz (Check), so a client sees
// the same headers whichever API admitted or denied it. It imports no
// protos: each adapter converts its own statuses to Quotas.
package headers

import (
	"strconv"
	"strings"
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
	// breaker). A refusal by a limit carries none.
	Reason = "x-tollgate-reason"
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
func Append(dst []Header, quotas []Quota) []Header {
	var minQ *Quota
	var policies strings.Builder
	var retry time.Duration
	over := false
	for i := range quotas {
		q := &quotas[i]
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
		if w := q.WindowSeconds; w > 0 {
			policies.WriteString(", ")
			policies.WriteString(strconv.FormatUint(q.Amount, 10))
			policies.WriteString(";w=")
			policies.WriteString(strconv.FormatUint(w, 10))
			if q.Name != "" {
				policies.WriteString(`;name="`)
				writeQuoted(&policies, q.Name)
				policies.WriteByte('"')
			}
		}
	}
	if minQ != nil {
		dst = append(dst,
			Header{Limit, strconv.FormatUint(minQ.Amount, 10) + policies.String()},
			Header{Remaining, strconv.FormatUint(minQ.Remaining, 10)},
			Header{Reset, strconv.FormatInt(CeilSeconds(minQ.Reset), 10)},
		)
	}
	if over {
		dst = append(dst, Header{RetryAfter, strconv.FormatInt(max(1, CeilSeconds(retry)), 10)})
	}
	return dst
}

// CeilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// writeQuoted writes s as the inside of a structured-field string: only
// printable ASCII, with '"' and '\' escaped. Names come from rule files,
// but a header value must stay well-formed whatever they hold.
func writeQuoted(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		}
	}
}
