// Package reservation is the ticket that carries an admitted request's
// reservation from Check to the access log: Check puts it in the ext_authz
// dynamic metadata, Envoy hands it back on the request's access log entry,
// and the access log service decodes it to call limit.Limiter.Reconcile
// with exactly the request Decide saw. Any replica can settle it: the
// ticket holds everything Reconcile needs, and the store holds the rest.
//
// It imports no protos, so pkg/extauthz and pkg/accesslog share it without
// sharing an API. The ticket crosses Envoy, so Decode treats it as outside
// input: bounded, and never trusting a length it reads.
package reservation

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Where the ticket travels: the ext_authz filter emits Check's dynamic
// metadata under MetadataNamespace, and Field is the ticket's key there.
// The other fields of that metadata, for Envoy's rate limit filter and
// access log formats and for the access log service, are named below.
const (
	MetadataNamespace = "envoy.filters.http.ext_authz"
	Field             = "tollgate_reservation"

	FieldTenant         = "tenant"
	FieldTier           = "tier"
	FieldModel          = "model"
	FieldReservationID  = "reservation_id"
	FieldReservedTokens = "reserved_tokens"
	FieldReservedAtMs   = "reserved_at_ms"
	// FieldProbes holds the circuit breaker probes an admitted request
	// carries: a struct of breaker key -> probe ID, which the access log
	// hands back to the breakers with the request's outcome.
	FieldProbes = "tollgate_probes"

	// RateLimitNamespace is where Envoy's rate limit filter emits the
	// dynamic metadata of a ShouldRateLimit answer; the probes of a
	// request admitted over RLS travel there under FieldProbes.
	RateLimitNamespace = "envoy.filters.http.ratelimit"
)

// MaxEncodedBytes bounds a ticket Decode accepts: far more than the few
// short descriptors an authz config builds.
const MaxEncodedBytes = 64 << 10

// maxOverrides bounds the overrides a ticket may carry.
const maxOverrides = 1024

// version 1: the fields of Reservation in order up to Overrides, strings
// and counts as uvarints, At as a zigzag varint of Unix milliseconds.
// version 2: version 1 followed by Tier, written only when Tier is set,
// so a ticket without one is what it was before tiers. Decode reads both.
const (
	version1 = 1
	version2 = 2
)

// Reservation is what Reconcile needs to settle one admitted request.
type Reservation struct {
	// ID is the request's reservation ID (limit.Request.ID).
	ID     string
	Domain string
	// Descriptors are the request's descriptors; only their entries are
	// kept, since Check sets nothing else.
	Descriptors []limit.Descriptor
	Overrides   map[string]limit.Override
	// Tokens is what Decide reserved on each token limit.
	Tokens uint64
	// At is when Decide reserved them, to the millisecond.
	At time.Time
	// Tier is the request's limit.Request.Tier: the plan whose
	// multiplier sized the limits the reservation was taken on, which a
	// refund must be measured against too.
	Tier string
}

// Request is the limit.Request to pass Reconcile.
func (r *Reservation) Request() *limit.Request {
	return &limit.Request{Domain: r.Domain, Descriptors: r.Descriptors, Overrides: r.Overrides, ID: r.ID, Tier: r.Tier}
}

// Encode returns r as a compact, URL-safe string. Check encodes one for
// every admitted request, so it allocates nothing but the string for the
// few short descriptors of an authz config.
func Encode(r *Reservation) string {
	var buf [512]byte
	b := buf[:0]
	v := byte(version1)
	if r.Tier != "" {
		v = version2
	}
	b = append(b, v)
	b = binary.AppendVarint(b, r.At.UnixMilli())
	b = binary.AppendUvarint(b, r.Tokens)
	b = appendString(b, r.ID)
	b = appendString(b, r.Domain)
	b = binary.AppendUvarint(b, uint64(len(r.Descriptors)))
	for _, d := range r.Descriptors {
		b = binary.AppendUvarint(b, uint64(len(d.Entries)))
		for _, e := range d.Entries {
			b = appendString(b, e.Key)
			b = appendString(b, e.Value)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.Overrides)))
	if len(r.Overrides) > 0 {
		// Sorted, so a ticket is a function of the reservation.
		for _, name := range slices.Sorted(maps.Keys(r.Overrides)) {
			o := r.Overrides[name]
			b = appendString(b, name)
			b = binary.AppendUvarint(b, o.Amount)
			b = binary.AppendUvarint(b, uint64(o.Unit))
			b = binary.AppendUvarint(b, uint64(o.Multiplier))
		}
	}
	if v == version2 {
		b = appendString(b, r.Tier)
	}
	var out [683]byte // the base64 of buf
	return string(base64.RawURLEncoding.AppendEncode(out[:0], b))
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrInvalid marks a ticket Decode cannot read.
var ErrInvalid = errors.New("invalid reservation ticket")

// Decode reads a ticket Encode made. Any other input yields an error
// wrapping ErrInvalid, after work bounded by MaxEncodedBytes.
func Decode(s string) (*Reservation, error) {
	if len(s) > MaxEncodedBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(s), MaxEncodedBytes)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64url", ErrInvalid)
	}
	d := decoder{b: b}
	v := d.readByte()
	if v != version1 && v != version2 {
		if d.err != nil {
			return nil, d.err
		}
		return nil, fmt.Errorf("%w: version %d, want %d or %d", ErrInvalid, v, version1, version2)
	}
	r := &Reservation{}
	r.At = time.UnixMilli(d.varint())
	r.Tokens = d.uvarint()
	r.ID = d.string(limit.MaxValueBytes, "id")
	r.Domain = d.string(limit.MaxDomainBytes, "domain")
	if n := d.count(limit.MaxDescriptors, "descriptors"); n > 0 {
		r.Descriptors = make([]limit.Descriptor, n)
		for i := range r.Descriptors {
			m := d.count(limit.MaxEntries, "entries")
			if m == 0 {
				continue
			}
			es := make([]limit.Entry, m)
			for j := range es {
				es[j].Key = d.string(limit.MaxEntryKeyBytes, "entry key")
				es[j].Value = d.string(limit.MaxValueBytes, "entry value")
			}
			r.Descriptors[i].Entries = es
		}
	}
	if n := d.count(maxOverrides, "overrides"); n > 0 {
		r.Overrides = make(map[string]limit.Override, n)
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
			r.Overrides[name] = o
		}
	}
	if v >= version2 {
		r.Tier = d.string(limit.MaxValueBytes, "tier")
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d bytes after the end", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return r, nil
}

// decoder reads a ticket front to back; the first problem sticks, and
// every read after it returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) readByte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
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
