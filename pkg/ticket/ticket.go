// Package ticket is the signed ticket an admitted request carries from its
// decision to its outcome. Check (and ShouldRateLimit, for domains with
// breakers) puts one in the dynamic metadata it returns; Envoy hands that
// metadata to the access log and to ext_proc; they open the ticket to
// settle the request's reservation and to feed its outcome to the
// breakers and the pressure score.
//
// A ticket crosses Envoy and comes back on APIs anyone who reaches the
// gRPC port can call, so it is sealed: an HMAC-SHA256 tag (truncated to
// 128 bits) over every byte, under a key only the replicas hold. Open
// refuses a ticket whose tag does not verify under the current or the
// previous key (a rotation), and one older than MaxAge, past which the
// settle-once marks it relies on may be gone. A ticket cannot be altered
// (amount, tenant, window, ID), made up, or used beyond its age; a
// genuine ticket replayed within its age settles once, because every use
// of it is keyed by its ID (see admission.Limiter.Settle).
//
// The ticket is not encrypted: it holds descriptor values (tenant, model)
// that the rest of the dynamic metadata shows anyway, and no secret.
//
// It imports no protos, so every adapter shares it without sharing an API.
package ticket

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Where the ticket travels. Check's dynamic metadata is emitted by Envoy's
// ext_authz filter under MetadataNamespace, and ShouldRateLimit's by the
// rate limit filter under RateLimitNamespace; Field is the ticket's key in
// either. The other fields of Check's metadata are for Envoy's access log
// formats and the rate limit filter: nothing settles from them.
const (
	MetadataNamespace  = "envoy.filters.http.ext_authz"
	RateLimitNamespace = "envoy.filters.http.ratelimit"
	Field              = "tollgate_reservation"

	FieldTenant         = "tenant"
	FieldTier           = "tier"
	FieldModel          = "model"
	FieldReservationID  = "reservation_id"
	FieldReservedTokens = "reserved_tokens"
	FieldReservedAtMs   = "reserved_at_ms"
)

// Bounds of what Open reads.
const (
	// MaxEncodedBytes bounds a ticket: far more than the few short
	// descriptors an authz config builds.
	MaxEncodedBytes = 64 << 10
	maxOverrides    = 1024
	maxProbes       = 64
	tagBytes        = 16
	// DefaultMaxAge is how long a ticket can be used after its decision.
	// It must not exceed the life of the marks that make a settle or a
	// breaker failure count once, or a replay after the mark is gone
	// would count again.
	DefaultMaxAge = limit.SettleOnceFor
	// maxSkew is how far in the future a ticket's time may be: the
	// replicas' clocks are NTP-synced, and a ticket from further ahead is
	// not one a replica made.
	maxSkew = time.Minute
)

// version 3: the first signed format. The unsigned versions 1 and 2 of
// the old reservation package are refused: a ticket anyone could write is
// what this package exists to end.
const version = 3

const flagReserved = 1

// Ticket is what an admitted request's outcome needs of its decision.
type Ticket struct {
	// ID names the request: its reservation and concurrency leases
	// (limit.Request.ID), and every once-only use of the ticket.
	ID     string
	Domain string
	// Descriptors, Overrides, Tier and Model are the limit.Request the
	// decision was made on, so a settle measures against the same limits
	// and a breaker finds the same name.
	Descriptors []limit.Descriptor
	Overrides   map[string]limit.Override
	Tier        string
	Model       string
	// Reserved says the decision reserved something to settle: Tokens on
	// each token limit, or concurrency leases.
	Reserved bool
	// Tokens is what the decision reserved on each token limit; Prompt is
	// the part of it estimated from the prompt (the rest is the
	// completion allowance), for settling a stream that ended without a
	// usage report.
	Tokens, Prompt uint64
	// At is the decision's time, to the millisecond.
	At time.Time
	// Probes are the half-open breakers' probes the request holds.
	Probes []limit.Probe
}

// Request is the limit.Request the ticket's decision was made on.
func (t *Ticket) Request() *limit.Request {
	return &limit.Request{Domain: t.Domain, Descriptors: t.Descriptors, Overrides: t.Overrides, ID: t.ID, Tier: t.Tier, Model: t.Model}
}

// Errors of Open. Each wraps ErrRejected, so a caller that only counts
// can test for that.
var (
	ErrRejected = errors.New("ticket rejected")
	// ErrMalformed: not a ticket this package writes.
	ErrMalformed = fmt.Errorf("%w: malformed", ErrRejected)
	// ErrForged: well formed, but its tag verifies under no key held.
	ErrForged = fmt.Errorf("%w: tag does not verify", ErrRejected)
	// ErrExpired: genuine, but older than the max age, or from the future.
	ErrExpired = fmt.Errorf("%w: expired", ErrRejected)
)

// Sealer seals and opens tickets under a Keys it can swap (a rotation).
// Safe for concurrent use.
type Sealer struct {
	keys   atomic.Pointer[Keys]
	maxAge time.Duration
}

// NewSealer returns a Sealer under keys, refusing tickets older than
// maxAge (0 or at most DefaultMaxAge; 0: DefaultMaxAge). keys is
// Required.
func NewSealer(keys *Keys, maxAge time.Duration) (*Sealer, error) {
	if keys == nil {
		return nil, errors.New("ticket: keys are required")
	}
	switch {
	case maxAge <= 0:
		maxAge = DefaultMaxAge
	case maxAge > DefaultMaxAge:
		return nil, fmt.Errorf("ticket: max age %s is longer than a settle is remembered (%s)", maxAge, DefaultMaxAge)
	}
	s := &Sealer{maxAge: maxAge}
	s.keys.Store(keys)
	return s, nil
}

// LocalSealer returns a Sealer under a key of this process alone: what a
// service seals with until it is given the Sealer the outcome channels
// open with.
func LocalSealer() *Sealer {
	s := &Sealer{maxAge: DefaultMaxAge}
	s.keys.Store(RandomKeys())
	return s
}

// SetKeys swaps the keys: tickets are sealed with the new current key at
// once, and opened under the new set.
func (s *Sealer) SetKeys(k *Keys) {
	if k != nil {
		s.keys.Store(k)
	}
}

// Keys returns the keys in force.
func (s *Sealer) Keys() *Keys { return s.keys.Load() }

// Seal returns t as a compact URL-safe string with its tag.
func (s *Sealer) Seal(t *Ticket) string {
	var buf [512]byte
	b := appendTicket(buf[:0], t)
	b = s.keys.Load().sign(b)
	var out [704]byte // room for the base64 of buf
	return string(base64.RawURLEncoding.AppendEncode(out[:0], b))
}

// Open verifies and reads a ticket Seal made, at now. Any other input
// yields an error wrapping ErrRejected, after work bounded by
// MaxEncodedBytes; the error's text never quotes the ticket.
func (s *Sealer) Open(str string, now time.Time) (*Ticket, error) {
	if len(str) > MaxEncodedBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrMalformed, len(str), MaxEncodedBytes)
	}
	b, err := base64.RawURLEncoding.DecodeString(str)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64url", ErrMalformed)
	}
	if len(b) < 1+tagBytes {
		return nil, fmt.Errorf("%w: %d bytes, too short", ErrMalformed, len(b))
	}
	if b[0] != version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrMalformed, b[0], version)
	}
	body := b[:len(b)-tagBytes]
	if !s.keys.Load().verify(body, b[len(b)-tagBytes:]) {
		return nil, ErrForged
	}
	// Only a genuine ticket is parsed: a replica wrote it, so a parse
	// error here is a bug or a key shared with something else.
	t, err := decode(body[1:])
	if err != nil {
		return nil, err
	}
	if age := now.Sub(t.At); age > s.maxAge || age < -maxSkew {
		return nil, fmt.Errorf("%w: made %s ago, at most %s", ErrExpired, age.Round(time.Second), s.maxAge)
	}
	return t, nil
}

func appendTicket(b []byte, t *Ticket) []byte {
	b = append(b, version)
	var flags uint64
	if t.Reserved {
		flags |= flagReserved
	}
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendVarint(b, t.At.UnixMilli())
	b = binary.AppendUvarint(b, t.Tokens)
	b = binary.AppendUvarint(b, t.Prompt)
	b = appendString(b, t.ID)
	b = appendString(b, t.Domain)
	b = appendString(b, t.Tier)
	b = appendString(b, t.Model)
	b = binary.AppendUvarint(b, uint64(len(t.Descriptors)))
	for _, d := range t.Descriptors {
		b = binary.AppendUvarint(b, uint64(len(d.Entries)))
		for _, e := range d.Entries {
			b = appendString(b, e.Key)
			b = appendString(b, e.Value)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(t.Overrides)))
	if len(t.Overrides) > 0 {
		// Sorted, so a ticket is a function of its contents; the names of
		// the few overrides a key carries sort on the stack.
		var buf [8]string
		names := buf[:0]
		for name := range t.Overrides {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			o := t.Overrides[name]
			b = appendString(b, name)
			b = binary.AppendUvarint(b, o.Amount)
			b = binary.AppendUvarint(b, uint64(o.Unit))
			b = binary.AppendUvarint(b, uint64(o.Multiplier))
		}
	}
	b = binary.AppendUvarint(b, uint64(len(t.Probes)))
	for _, p := range t.Probes {
		b = appendString(b, p.Key)
		b = appendString(b, p.Name)
		b = appendString(b, p.ID)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decode reads a ticket's fields after the version byte.
func decode(b []byte) (*Ticket, error) {
	d := decoder{b: b}
	t := &Ticket{}
	flags := d.uvarint()
	if flags&^flagReserved != 0 {
		d.fail("flags %#x", flags)
	}
	t.Reserved = flags&flagReserved != 0
	t.At = time.UnixMilli(d.varint())
	t.Tokens = d.uvarint()
	t.Prompt = d.uvarint()
	t.ID = d.string(limit.MaxValueBytes, "id")
	t.Domain = d.string(limit.MaxDomainBytes, "domain")
	t.Tier = d.string(limit.MaxValueBytes, "tier")
	t.Model = d.string(limit.MaxValueBytes, "model")
	if n := d.count(limit.MaxDescriptors, "descriptors"); n > 0 {
		t.Descriptors = make([]limit.Descriptor, n)
		for i := range t.Descriptors {
			m := d.count(limit.MaxEntries, "entries")
			if m == 0 {
				continue
			}
			es := make([]limit.Entry, m)
			for j := range es {
				es[j].Key = d.string(limit.MaxEntryKeyBytes, "entry key")
				es[j].Value = d.string(limit.MaxValueBytes, "entry value")
			}
			t.Descriptors[i].Entries = es
		}
	}
	if n := d.count(maxOverrides, "overrides"); n > 0 {
		t.Overrides = make(map[string]limit.Override, n)
		for range n {
			name := d.string(limit.MaxValueBytes, "override name")
			var o limit.Override
			o.Amount = d.uvarint()
			if u := d.uvarint(); u <= uint64(limit.Week) {
				o.Unit = limit.Unit(u)
			} else {
				d.fail("override unit %d", u)
			}
			if m := d.uvarint(); m <= 1<<32-1 {
				o.Multiplier = uint32(m)
			} else {
				d.fail("override multiplier %d", m)
			}
			t.Overrides[name] = o
		}
	}
	if n := d.count(maxProbes, "probes"); n > 0 {
		t.Probes = make([]limit.Probe, n)
		for i := range t.Probes {
			t.Probes[i].Key = d.string(limit.MaxEntryKeyBytes, "probe key")
			t.Probes[i].Name = d.string(limit.MaxValueBytes, "probe name")
			t.Probes[i].ID = d.string(limit.MaxValueBytes, "probe id")
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d bytes after the end", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return t, nil
}

// decoder reads a ticket front to back; the first problem sticks, and
// every read after it returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of at most max items.
func (d *decoder) count(max int, what string) int {
	n := d.uvarint()
	if n > uint64(max) {
		d.fail("%d %s, at most %d", n, what, max)
		return 0
	}
	return int(n)
}

func (d *decoder) string(max int, what string) string {
	n := d.uvarint()
	switch {
	case d.err != nil:
		return ""
	case n > uint64(max):
		d.fail("%s is %d bytes, at most %d", what, n, max)
		return ""
	case n > uint64(len(d.b)):
		d.fail("truncated %s", what)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// macs hands out HMAC states of one key: hmac.New costs more than the
// MAC of a ticket, so they are reused.
type macs struct {
	pool sync.Pool
}

func newMACs(key []byte) *macs {
	k := slices.Clone(key)
	m := &macs{}
	m.pool.New = func() any { return hmac.New(sha256.New, k) }
	return m
}

// tag appends the truncated tag of msg to dst.
func (m *macs) tag(dst, msg []byte) []byte {
	h := m.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(msg)
	var sum [sha256.Size]byte
	out := h.Sum(sum[:0])
	m.pool.Put(h)
	return append(dst, out[:tagBytes]...)
}
