// Package limit is Tollgate's decision domain: rules, descriptor matching,
// store keys, the three limiting algorithms and the Store they run on.
// It imports nothing but the standard library: adapters (RLS, ext_authz,
// Redis) translate at the edge.
package limit

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Algorithm selects how a limit counts.
type Algorithm uint8

const (
	// SlidingWindow admits at most the limit in every interval of the
	// window's length. It is the default for new rules.
	SlidingWindow Algorithm = iota
	// FixedWindow counts per epoch-aligned window, as envoyproxy/ratelimit does.
	FixedWindow
	// TokenBucket is GCRA: a long-run rate of Amount per Window and an
	// instantaneous burst of at most Burst.
	TokenBucket
)

// Concurrency and Once are store primitives rather than rule algorithms:
// a rule file cannot name them.
const (
	// Concurrency counts requests in flight: a Charge of Cost 1 takes a
	// lease for Member that lasts Window, Cost -1 releases it.
	Concurrency Algorithm = iota + 3
	// Once records that something happened, for idempotency: see Charge.
	Once
)

var algorithmNames = [...]string{SlidingWindow: "sliding_window", FixedWindow: "fixed_window", TokenBucket: "token_bucket"}

func (a Algorithm) String() string {
	switch a {
	case Concurrency:
		return "concurrency"
	case Once:
		return "once"
	}
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// AlgorithmNames is the list accepted by ParseAlgorithm, for error messages.
func AlgorithmNames() string { return strings.Join(algorithmNames[:], "|") }

// ParseAlgorithm maps a rule file's algorithm name to an Algorithm.
func ParseAlgorithm(s string) (Algorithm, bool) {
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), true
		}
	}
	return 0, false
}

// Unit is a rule's time unit. The numbering follows Envoy's
// RateLimitResponse.RateLimit.Unit so adapters convert by value.
type Unit uint8

const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = [...]string{Second: "second", Minute: "minute", Hour: "hour", Day: "day", Month: "month", Year: "year", Week: "week"}

// unitSeconds uses envoyproxy/ratelimit's and Envoy's lengths: a month is
// 30 days and a year 365 days, so windows agree with Envoy's headers.
var unitSeconds = [...]int64{Second: 1, Minute: 60, Hour: 3600, Day: 86400, Month: 30 * 86400, Year: 365 * 86400, Week: 7 * 86400}

func (u Unit) String() string {
	if int(u) < len(unitNames) && unitNames[u] != "" {
		return unitNames[u]
	}
	return "unknown"
}

// Duration is the length of one unit; 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	if int(u) < len(unitSeconds) {
		return time.Duration(unitSeconds[u]) * time.Second
	}
	return 0
}

// UnitNames lists the accepted unit names in order of length, for error messages.
func UnitNames() string { return "second|minute|hour|day|week|month|year" }

// ParseUnit maps a rule file's unit name (case-insensitive, as
// envoyproxy/ratelimit accepts SECOND and second) to a Unit.
func ParseUnit(s string) (Unit, bool) {
	l := strings.ToLower(s)
	for i, n := range unitNames {
		if n != "" && n == l {
			return Unit(i), true
		}
	}
	return UnitUnknown, false
}

// Kind says what a limit counts.
type Kind uint8

const (
	// Requests counts calls (rate_limit).
	Requests Kind = iota
	// Tokens counts cost (token_limit): hits_addend or an estimate.
	Tokens
)

func (k Kind) String() string {
	if k == Tokens {
		return "tokens"
	}
	return "requests"
}

// DefaultBuckets is the sliding window's precision when a rule sets none:
// the window is counted in 20 buckets, so the counted span is at most one
// twentieth (5%) longer than the window.
const DefaultBuckets = 20

// MaxBuckets bounds a sliding window's state per key.
const MaxBuckets = 600

// Limit is one budget: Amount per Window, counted by Algorithm.
type Limit struct {
	// Name is rate_limit.name: reported in statuses and used by replaces.
	Name      string
	Kind      Kind
	Algorithm Algorithm
	// Amount is requests_per_unit or tokens_per_unit.
	Amount uint64
	Unit   Unit
	// Multiplier scales Unit (Envoy's unit_multiplier); 0 means 1.
	Multiplier uint32
	// Burst is the token bucket's capacity; 0 means Amount.
	Burst uint64
	// Buckets is the sliding window's precision; 0 means DefaultBuckets.
	Buckets uint16
}

// MaxWindow is the longest window: the longest time.Duration, about 292
// years. A longer Unit x Multiplier is counted as MaxWindow.
const MaxWindow = time.Duration(math.MaxInt64)

// Window is the limit's period: Unit times Multiplier, at most MaxWindow.
// The product saturates rather than wraps: Envoy's unit_multiplier is a
// uint32, and a day times a multiplier past 106751 would wrap an int64 of
// nanoseconds, a window of 3 per day x 616385997 to half a second.
func (l *Limit) Window() time.Duration {
	u := l.Unit.Duration()
	m := time.Duration(max(l.Multiplier, 1))
	if u > 0 && m > MaxWindow/u {
		return MaxWindow
	}
	return u * m
}

// EffectiveBurst is Burst, or Amount when Burst is unset.
func (l *Limit) EffectiveBurst() uint64 {
	if l.Burst == 0 {
		return l.Amount
	}
	return l.Burst
}

// EffectiveBuckets is Buckets, or DefaultBuckets when unset.
func (l *Limit) EffectiveBuckets() uint16 {
	if l.Buckets == 0 {
		return DefaultBuckets
	}
	return l.Buckets
}
