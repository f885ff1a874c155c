// Package breaker is the circuit breaker per upstream (usually per model),
// with its state in the store so that every replica agrees on it.
//
// One Breaker serves one Config: one breaker per value of the configured
// descriptor key. Its state machine (Cell) is:
//
//   - closed: every request is allowed. Each failure reported by any
//     replica's access log is kept with its time; FailureThreshold failures
//     within Window (a failure at t counts while now - t < Window) open it.
//     Rated (Config.FailureRate or MinRequests set), failures and
//     successes are counted in RateBuckets buckets across Window instead,
//     and a failure opens it when the failures reach FailureThreshold,
//     their share FailureRate and the outcomes MinRequests
//     (docs/breaker.md). Successes reach the store in batches (Observe).
//     Overload answers (Classify) never count.
//   - open: every request is denied, with RetryAfter the time left, until
//     OpenFor has passed since it opened.
//   - half-open: at most HalfOpenProbes requests are in flight as probes,
//     cluster-wide. Each holds a slot with a lease of ProbeLease; a slot
//     frees when its probe reports an outcome, or when its lease runs out
//     (the outcome was lost). CloseAfter probe successes close the breaker
//     (failures forgotten); any probe failure opens it again for OpenFor; a
//     probe's neutral outcome (see Classify) only frees its slot.
//
// A probe is named by its ProbeID, 128 random bits (NewProbeID) that the
// decision hands out and the access log entry must bring back. Only the
// ID of a slot held now moves a half-open breaker: outcomes without one,
// with a guessed one, with one from an earlier half-open period or whose
// lease ran out change nothing (set ProbeLease above the route's timeout,
// so that a genuine probe reports within it). A slot counts one outcome,
// so an outcome delivered twice counts once. In the closed state a
// probe's outcome counts as any other. Outcomes while open are ignored.
//
// A failure reported with a once ID (Report.Once: the request's ticket
// ID) counts at most once per breaker: the store keeps a marker
// (OnceKey, in the breaker key's hash tag) for OnceTTL, set in the same
// atomic step, whatever state the failure arrives in.
//
// Open goes to half-open lazily: the first Allow at or after the open
// period's end writes the change (and so counts the transition once,
// cluster-wide); State reports it as half-open before then.
//
// Every state is in the Store (memstore, or Redis with one small Lua
// script per operation and one hash-tagged key per breaker, plus the
// failure markers of Report.Once in the same hash tag), so failures
// reported to one replica open the breaker for every replica at their next
// decision. A replica answers from the closed
// state it last read for Config.Cache (100 ms by default), and from an
// open state until its period ends, with no store call: a busy closed
// breaker costs each replica one store read per Cache, not one per
// decision, and a breaker opened elsewhere reaches this replica within
// Cache. Half-open breakers ask the store every time.
//
// A breaker that is open or half-open and sees no write for Retain is
// forgotten (it is closed again): this bounds the store's memory whatever
// names clients send.
//
// # Metrics
//
// The package stays free of Prometheus: the composition root exports
//
//	tollgate_breaker_state{key, breaker}   gauge, 0 closed, 1 half-open, 2 open (Snapshot)
//	tollgate_breaker_transitions_total{from, to}   counter (Transitions)
//
// The breaker label is a descriptor value, so it is bounded: a Breaker
// tracks at most MaxTracked names (the first ones seen; a closed one makes
// room for one that opens), and Untracked counts the rest. A transition is
// counted by the replica whose store call made it, so the sum over
// replicas is the cluster's count.
package breaker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Defaults and bounds.
const (
	// DefaultProbeLease is how long a probe holds its slot without an
	// outcome. Set ProbeLease above the route's timeout.
	DefaultProbeLease = limit.DefaultProbeLease
	// Retain is how long an open or half-open breaker with no write is
	// kept past its open period and its probes' leases.
	Retain = time.Hour
	// MaxTracked caps the names a Breaker keeps for Snapshot and metrics.
	MaxTracked = 1000
)

// State is a breaker's state; its value is the state gauge's.
type State uint8

// The states.
const (
	Closed   State = 0
	HalfOpen State = 1
	Open     State = 2
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half_open"
	case Open:
		return "open"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// Config is one breaker declaration: one breaker per value of Key. It is
// limit.BreakerConfig, so that pkg/config fills it and a limit.Domain
// holds it; its Validate and WithDefaults are there. See Classify for
// what counts as a failure.
type Config = limit.BreakerConfig

// Params is what a Store needs of a Config, all durations >= 1ms.
type Params struct {
	FailureThreshold uint64
	Window           time.Duration
	OpenFor          time.Duration
	HalfOpenProbes   uint64
	CloseAfter       uint64
	ProbeLease       time.Duration
	// FailureRate and MinRequests, when either is set (Rated), make a
	// closed breaker count failures and successes in RateBuckets buckets
	// and open on all three of FailureThreshold, FailureRate and
	// MinRequests (see Cell.Record).
	FailureRate float64
	MinRequests uint64
}

// Rated says whether p opens on a failure rate with a minimum volume,
// which needs the successes counted, rather than on a count of failures
// alone.
func (p Params) Rated() bool { return p.FailureRate > 0 || p.MinRequests > 0 }

func params(c Config) Params {
	return Params{
		FailureThreshold: c.FailureThreshold,
		Window:           c.Window,
		OpenFor:          c.OpenFor,
		HalfOpenProbes:   c.HalfOpenProbes,
		CloseAfter:       c.CloseAfter,
		ProbeLease:       c.ProbeLease,
		FailureRate:      c.FailureRate,
		MinRequests:      c.MinRequests,
	}
}

// Verdict is the answer to Allow.
type Verdict struct {
	Allowed bool
	// Probe is set when the request was admitted as a half-open probe;
	// ProbeID must then come back with its outcome.
	Probe   bool
	ProbeID string
	// RetryAfter is set when the request is denied: the rest of the open
	// period, or, half-open, the time until the first probe lease ends.
	RetryAfter time.Duration
	// State is the breaker's state at the decision.
	State State
}

// Status describes one breaker at an instant, for /debug and metrics.
type Status struct {
	State State
	// Failures counted in the window (closed).
	Failures uint64
	// Volume is the failures and successes counted in the window (closed
	// and rated; 0 otherwise).
	Volume uint64
	// OpenUntil is when an open breaker goes half-open (zero otherwise).
	OpenUntil time.Time
	// Probes in flight and probe successes so far (half-open).
	Probes    uint64
	Successes uint64
}

// Transition is a change of state made by one store call; From == To
// means none.
type Transition struct {
	From, To State
}

// Changed reports whether t is a change of state.
func (t Transition) Changed() bool { return t.From != t.To }

// Store keeps breakers' state where every replica sees it. key is from
// StoreKey. Each method is atomic per key and follows Cell exactly.
type Store interface {
	// Allow decides a request; one admitted as a probe holds its slot
	// under probeID, which the caller made with NewProbeID (a Store
	// cannot make good randomness everywhere: Lua has none). A probeID
	// that is not 1 to MaxProbeIDBytes hex digits is an error.
	Allow(ctx context.Context, now time.Time, key string, p Params, probeID string) (Verdict, Transition, error)
	// Record takes one outcome. A failure with r.Once is looked at once:
	// the first delivery sets a marker (OnceKey) for OnceTTL, in the same
	// atomic step, and a failure finding the marker changes nothing.
	Record(ctx context.Context, now time.Time, key string, p Params, r Report) (Transition, error)
	// Release frees the half-open slot of probeID without counting an
	// outcome: the probe never went upstream.
	Release(ctx context.Context, now time.Time, key string, p Params, probeID string) error
	State(ctx context.Context, now time.Time, key string, p Params) (Status, error)
}

// Report is one request's outcome for Store.Record, or a batch of
// successes.
type Report struct {
	// Successes, when set, makes the Report a batch of that many
	// successes seen by one replica (Cell.Count): a rated breaker needs
	// them for its rate and volume, and one store call per batch, not per
	// request, keeps them cheap. Success, ProbeID and Once are then
	// empty.
	Successes uint64
	Success   bool
	// ProbeID is the Verdict's ProbeID when the request was a probe.
	ProbeID string
	// Once names the request (its ticket's ID), so that its failure
	// counts at most once per breaker however often it is delivered (an
	// access log batch Envoy sends again, or a replay). Empty: no such
	// guard. At most MaxOnceBytes.
	Once string
}

// MaxOnceBytes bounds Report.Once.
const MaxOnceBytes = 128

// OnceKey is the store key of the marker of a failure named once on the
// breaker at key: limit.BreakerOnceKey.
func OnceKey(key, once string) string { return limit.BreakerOnceKey(key, once) }

// OnceTTL is how long a failure's marker is kept: its Window, so that it
// cannot count twice while it could count at all, and at least Retain,
// which bounds how old a delivery Envoy or a replay can bring (tickets
// expire sooner).
func OnceTTL(p Params) time.Duration { return max(p.Window, Retain) }

// CheckReport rejects a Report a Store would not key: a Once over
// MaxOnceBytes, or a batch of Successes with anything else set.
func CheckReport(r Report) error {
	if len(r.Once) > MaxOnceBytes {
		return fmt.Errorf("%w: once ID is %d bytes, at most %d", limit.ErrInvalid, len(r.Once), MaxOnceBytes)
	}
	if r.Successes > 0 && (r.Success || r.ProbeID != "" || r.Once != "") {
		return fmt.Errorf("%w: a batch of successes carries no outcome, probe or once ID", limit.ErrInvalid)
	}
	if r.Successes > MaxBatch {
		return fmt.Errorf("%w: a batch of %d successes, at most %d", limit.ErrInvalid, r.Successes, MaxBatch)
	}
	return nil
}

// MaxBatch bounds Report.Successes, so that a count stays exact in the
// doubles of Redis' Lua.
const MaxBatch = 1 << 40

// MaxProbeIDBytes bounds a probe ID a Store accepts.
const MaxProbeIDBytes = 64

// NewProbeID returns a fresh probe ID: 128 bits from crypto/rand in hex,
// so that nobody can guess the ID of a probe in flight and report an
// outcome for it.
func NewProbeID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand crashes the program instead
	return hex.EncodeToString(b[:])
}

// ValidProbeID says whether id is what a Store accepts from Allow: 1 to
// MaxProbeIDBytes hex digits, so it can never hold the separators a
// store writes slots with.
func ValidProbeID(id string) bool {
	if id == "" || len(id) > MaxProbeIDBytes {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return false
		}
	}
	return true
}

// StoreKey is the store key of the breaker named name for descriptor key
// descKey: limit.BreakerKey, where the Redis key format lives.
func StoreKey(descKey, name string) string { return limit.BreakerKey(descKey, name) }

// checkName rejects names a descriptor could not carry.
func checkName(name string) error {
	if len(name) > limit.MaxValueBytes {
		return fmt.Errorf("%w: breaker name is %d bytes, at most %d", limit.ErrInvalid, len(name), limit.MaxValueBytes)
	}
	return nil
}
