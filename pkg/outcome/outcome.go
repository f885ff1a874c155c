// Package outcome is the way back from a finished request to the limits:
// it opens the request's ticket (package ticket), settles its
// reservation with the usage the response reported, releases its
// concurrency leases, and says which breakers its outcome belongs to.
// The adapters that learn outcomes, the access log and ext_proc, hand it
// what they read and know nothing of tickets or limits themselves; a
// ticket that does not verify changes nothing.
//
// A reservation settles once (admission.Limiter.Settle), by whichever report
// carries usage first: ext_proc reads it from the response body, the
// access log from a usage header when one is configured. A report without
// usage never settles the tokens, so an access log entry that arrives
// without usage (the common order: real servers send no usage header)
// cannot pre-empt the ext_proc report that has it; it releases the
// request's concurrency leases, which is idempotent.
//
// A stream that ended without usage (the client did not ask for
// include_usage, or went away) is charged, never refunded: its streamed
// text, counted at the estimate's characters per token, plus the prompt
// estimate, when that is more than the reservation; otherwise the
// reservation stands as it was.
package outcome

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/logpace"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// Channels a report comes by; metric label values.
const (
	ChannelAccessLog = "accesslog"
	ChannelExtProc   = "extproc"
)

// DefaultTimeout bounds the store calls of one report.
const DefaultTimeout = 2 * time.Second

// Limiter settles and releases reservations; *admission.Limiter is one.
type Limiter interface {
	Settle(ctx context.Context, req *limit.Request, at time.Time, reserved, actual uint64) (bool, error)
	Release(ctx context.Context, req *limit.Request) error
	Rules() *limit.RuleSet
}

var _ Limiter = (*admission.Limiter)(nil)

// Usage is what a response said about its cost.
type Usage struct {
	// Total is the tokens the response reported using, when Reported.
	Total    uint64
	Reported bool
	// StreamedChars counts the characters of text a stream sent before it
	// ended without a usage report.
	StreamedChars uint64
}

// Options configure a Loop; the zero value is usable.
type Options struct {
	// MaxAge bounds how old a ticket may be (Optional; default and
	// maximum ticket.DefaultMaxAge).
	MaxAge time.Duration
	// Timeout bounds the store calls of one report (Optional; default
	// DefaultTimeout).
	Timeout time.Duration
	// Clock tells the time tickets are checked at (Optional).
	Clock limit.Clock
	// Completed is told of every ticket Open verifies (Optional): Open
	// runs when a request completes (the access log's final entry,
	// ext_proc's end of stream), so this is where the overload
	// controller ends the request's flight. It must not block.
	Completed func(t *ticket.Ticket)
}

// Loop opens tickets and settles what they hold. Safe for concurrent use.
type Loop struct {
	sealer  *ticket.Sealer
	lim     Limiter
	clock   limit.Clock
	timeout time.Duration
	cpt     atomic.Uint64 // float64 bits: characters per token
	log     *zap.Logger
	m       *metrics
	done    func(t *ticket.Ticket) // nil: none

	mu   sync.Mutex
	warn logpace.Pace // refused tickets' log lines
}

// New returns a Loop opening tickets under keys and settling them on lim,
// logging to log (nil: nowhere) and registering its metrics on reg. keys,
// lim and reg are Required.
func New(keys *ticket.Keys, lim Limiter, log *zap.Logger, reg prometheus.Registerer, opts Options) (*Loop, error) {
	if keys == nil || lim == nil || reg == nil {
		return nil, errors.New("outcome: keys, a Limiter and a Registerer are required")
	}
	sealer, err := ticket.NewSealer(keys, opts.MaxAge)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Clock == nil {
		opts.Clock = limit.SystemClock{}
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	l := &Loop{sealer: sealer, lim: lim, clock: opts.Clock, timeout: opts.Timeout, log: log, m: m, done: opts.Completed, warn: logpace.Pace{Every: 10 * time.Second}}
	l.SetCharsPerToken(4)
	return l, nil
}

// Sealer is the Sealer the Loop opens with: the deciding adapters seal
// with it, and a key rotation swaps its keys for both.
func (l *Loop) Sealer() *ticket.Sealer { return l.sealer }

// SetCharsPerToken sets how streamed text is counted when a stream ends
// without usage: the authz config's estimate.chars_per_token.
func (l *Loop) SetCharsPerToken(c float64) {
	if c > 0 && !math.IsInf(c, 0) {
		l.cpt.Store(math.Float64bits(c))
	}
}

// Open verifies a ticket that came by channel, at its request's
// completion, and tells Options.Completed of it. A ticket that does not
// verify is counted and logged (its reason, never its text), and yields
// nil: nothing may come of it.
func (l *Loop) Open(channel, s string) *ticket.Ticket {
	t, err := l.sealer.Open(s, l.clock.Now())
	if err != nil {
		reason := reasonOf(err)
		l.m.tickets.WithLabelValues(channel, reason).Inc()
		l.mu.Lock()
		n, ok := l.warn.Event(l.clock.Now())
		l.mu.Unlock()
		if ok {
			// This refusal's reason and size; refused counts it and those
			// held back since the last line, of any reason.
			l.log.Warn("ticket refused: it changes nothing", zap.String("channel", channel), zap.String("reason", reason),
				zap.Uint64("refused", n), zap.Int("bytes", len(s)))
		}
		return nil
	}
	l.m.tickets.WithLabelValues(channel, resultVerified).Inc()
	if l.done != nil {
		l.done(t)
	}
	return t
}

func reasonOf(err error) string {
	switch {
	case errors.Is(err, ticket.ErrForged):
		return resultForged
	case errors.Is(err, ticket.ErrExpired):
		return resultExpired
	}
	return resultMalformed
}

// Result is what Report did.
type Result uint8

const (
	// Nothing: the ticket holds no reservation, or its domain is gone.
	Nothing Result = iota
	// Settled: the tokens were settled (once, by this report).
	Settled
	// Duplicate: another report settled them already.
	Duplicate
	// Released: the leases were released and the tokens left to a
	// report with usage (or to stand as reserved).
	Released
	// Failed: the store failed; the reservation stands, leases expire.
	Failed
)

var resultNames = [...]string{Nothing: "nothing", Settled: "settled", Duplicate: "duplicate", Released: "released", Failed: "error"}

func (r Result) String() string { return resultNames[r] }

// Report settles t with the usage a response reported, or, without one,
// releases its leases (and charges a stream that outran its estimate).
func (l *Loop) Report(ctx context.Context, channel string, t *ticket.Ticket, u Usage) Result {
	if t == nil || !t.Reserved {
		return Nothing
	}
	if l.lim.Rules().Domain(t.Domain) == nil {
		return Nothing // the rules dropped the domain; the leases expire alone
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	actual, settle := u.Total, u.Reported
	if !settle && u.StreamedChars > 0 {
		// Never refund a stream that reported nothing: charge what it
		// visibly used, when that is more than the reservation.
		if est := saturatingAdd(t.Prompt, l.tokens(u.StreamedChars)); est > t.Tokens {
			actual, settle = est, true
		}
	}
	var r Result
	var err error
	if settle {
		var done bool
		done, err = l.lim.Settle(ctx, t.Request(), t.At, t.Tokens, actual)
		switch {
		case err != nil:
		case done:
			r = Settled
			if actual < t.Tokens {
				l.m.tokens.WithLabelValues(channel, directionRefund).Add(float64(t.Tokens - actual))
			} else if actual > t.Tokens {
				l.m.tokens.WithLabelValues(channel, directionCharge).Add(float64(actual - t.Tokens))
			}
		default:
			r = Duplicate
		}
	} else {
		err = l.lim.Release(ctx, t.Request())
		r = Released
	}
	if err != nil {
		r = Failed
		if errors.Is(err, limit.ErrInvalid) {
			// A genuine ticket the rules now refuse (a reload changed
			// them): nothing to settle against.
			r = Nothing
		} else {
			l.log.Warn("settle failed; the reservation stands and its leases expire", zap.Error(err),
				zap.String("channel", channel), zap.String("domain", t.Domain))
		}
	}
	l.m.reports.WithLabelValues(channel, r.String()).Inc()
	// Checked first: the fields are built only when debug is on, since
	// every admitted request comes back through here.
	if ce := l.log.Check(zap.DebugLevel, "settlement"); ce != nil {
		// The ticket's ID, never the ticket: the sealed string is a
		// bearer credential for a settle.
		ce.Write(zap.String("channel", channel), zap.String("ticket_id", t.ID), zap.String("domain", t.Domain),
			zap.Uint64("reserved", t.Tokens), zap.Uint64("actual", actual), zap.Bool("usage_reported", settle),
			zap.Stringer("result", r))
	}
	return r
}

// tokens counts streamed characters as tokens, rounding up.
func (l *Loop) tokens(chars uint64) uint64 {
	cpt := math.Float64frombits(l.cpt.Load())
	f := math.Ceil(float64(chars) / cpt)
	if f >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(f)
}

func saturatingAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// Breakers lists, for each of the ticket's domain's breakers, the name
// its outcome counts under (the request's value of the breaker's key)
// and the probe the request holds on it ("" for none); keys whose value
// the request does not carry are left out.
func (l *Loop) Breakers(t *ticket.Ticket) []Breaker {
	dom := l.lim.Rules().Domain(t.Domain)
	if dom == nil || len(dom.Breakers) == 0 {
		return nil
	}
	req := t.Request()
	out := make([]Breaker, 0, len(dom.Breakers))
	for _, b := range dom.Breakers {
		name := req.Value(b.Key)
		if name == "" {
			continue
		}
		br := Breaker{Key: b.Key, Name: name}
		for _, p := range t.Probes {
			if p.Key == b.Key && p.Name == name {
				br.ProbeID = p.ID
			}
		}
		out = append(out, br)
	}
	return out
}

// Breaker is a breaker an outcome counts for.
type Breaker struct {
	Key, Name, ProbeID string
}

// Metric label values.
const (
	resultVerified  = "verified"
	resultMalformed = "malformed"
	resultForged    = "forged"
	resultExpired   = "expired"

	directionRefund = "refund"
	directionCharge = "charge"
)

type metrics struct {
	tickets *prometheus.CounterVec
	reports *prometheus.CounterVec
	tokens  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		tickets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_outcome_tickets_total",
			Help: "Tickets brought back with an outcome, by channel (accesslog, extproc) and result: verified, or refused and ignored: malformed, forged (the tag does not verify: altered, made up, or sealed under a key this replica does not hold), expired.",
		}, []string{"channel", "result"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_outcome_reports_total",
			Help: "Reports on verified tickets that hold a reservation, by channel and result: settled (usage known, settled by this report), duplicate (settled before), released (no usage: leases released, tokens left to a report with usage), error (the store failed), nothing (the domain or its rules changed).",
		}, []string{"channel", "result"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_outcome_settled_tokens_total",
			Help: "Tokens settled against reservations, by channel and direction: refund (the estimate was higher than the usage) or charge (lower).",
		}, []string{"channel", "direction"}),
	}
	// Every series exists from the start, so rate() and alerts see a zero.
	for _, ch := range []string{ChannelAccessLog, ChannelExtProc} {
		for _, r := range []string{resultVerified, resultMalformed, resultForged, resultExpired} {
			m.tickets.WithLabelValues(ch, r)
		}
		for _, r := range resultNames {
			m.reports.WithLabelValues(ch, r)
		}
		m.tokens.WithLabelValues(ch, directionRefund)
		m.tokens.WithLabelValues(ch, directionCharge)
	}
	for _, c := range []prometheus.Collector{m.tickets, m.reports, m.tokens} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register outcome metrics: %w", err)
		}
	}
	return m, nil
}
