package limit

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
)

// Input caps. Envoy builds descriptors from headers, so a client controls
// their size; past these caps a request is invalid rather than expensive.
const (
	MaxDescriptors   = 64
	MaxEntries       = 32
	MaxEntryKeyBytes = 256
	MaxValueBytes    = 1024
	MaxDomainBytes   = 256
)

// ErrInvalid marks a request that is malformed or too large. Adapters map
// it to InvalidArgument.
var ErrInvalid = errors.New("invalid request")

// Invalidf is an error wrapping ErrInvalid, for a malformed request.
func Invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Entry is one descriptor entry.
type Entry struct {
	Key   string
	Value string
}

// checkDescriptor enforces the caps on one descriptor. A descriptor with
// no entries is valid: it matches no rule, and is answered OK without a
// limit, as envoyproxy/ratelimit answers it.
func checkDescriptor(i int, entries []Entry) error {
	if len(entries) > MaxEntries {
		return Invalidf("descriptors[%d]: %d entries, at most %d", i, len(entries), MaxEntries)
	}
	for j, e := range entries {
		if e.Key == "" {
			return Invalidf("descriptors[%d].entries[%d]: empty key", i, j)
		}
		if len(e.Key) > MaxEntryKeyBytes {
			return Invalidf("descriptors[%d].entries[%d]: key is %d bytes, at most %d", i, j, len(e.Key), MaxEntryKeyBytes)
		}
		if len(e.Value) > MaxValueBytes {
			return Invalidf("descriptors[%d].entries[%d]: value is %d bytes, at most %d", i, j, len(e.Value), MaxValueBytes)
		}
	}
	return nil
}

// Key encodes a counter's identity: what it counts (kind, algorithm,
// window), the domain and every descriptor entry. Each string is written
// with its length in front, so the encoding is injective whatever bytes
// the values hold (separators, braces, newlines). The result starts with
// a Redis Cluster hash tag derived from the domain and the first entry, so
// all counters of one descriptor family share a slot; the tag is a hash,
// never the raw value, so a '}' in a value cannot move it.
func Key(kind Kind, alg Algorithm, window time.Duration, domain string, entries []Entry) string {
	n := 48 + len(domain)
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 12
	}
	// Usual keys fit the stack buffer, so the string is the only allocation.
	var buf [192]byte
	b := buf[:0]
	if n > len(buf) {
		b = make([]byte, 0, n)
	}
	b = append(b, "tg:{"...)
	b = appendTag(b, domain, entries)
	b = append(b, "}:"...)
	if kind == Tokens {
		b = append(b, 't')
	} else {
		b = append(b, 'r')
	}
	b = append(b, algCode(alg))
	b = strconv.AppendInt(b, window.Milliseconds(), 10)
	b = append(b, ':')
	b = appendString(b, domain)
	for _, e := range entries {
		b = appendString(b, e.Key)
		b = appendString(b, e.Value)
	}
	return string(b)
}

// algCode is the one letter an algorithm has in keys.
func algCode(a Algorithm) byte {
	switch a {
	case FixedWindow:
		return 'f'
	case TokenBucket:
		return 't'
	case Concurrency:
		return 'c'
	case Once:
		return 'o'
	}
	return 's'
}

// OnceKey is the mark that settles request id's reservation, hash-tagged
// like the counters of the descriptor family it starts with.
func OnceKey(domain string, first []Entry, id string) string {
	b := make([]byte, 0, 40+len(domain)+len(id))
	b = append(b, "tg:{"...)
	b = appendTag(b, domain, first)
	b = append(b, "}:o:"...)
	b = appendString(b, domain)
	b = appendString(b, id)
	return string(b)
}

func appendString(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

func appendTag(b []byte, domain string, entries []Entry) []byte {
	h := fnv.New64a()
	_, _ = h.Write([]byte(domain))
	if len(entries) > 0 {
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(entries[0].Key))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(entries[0].Value))
	}
	return appendHex(b, h.Sum64())
}

// appendHex appends v as 16 lower-case hex digits, the tag of every
// hashed key.
func appendHex(b []byte, v uint64) []byte {
	const hex = "0123456789abcdef"
	for i := 60; i >= 0; i -= 4 {
		b = append(b, hex[(v>>uint(i))&0xf])
	}
	return b
}

// HashTag returns the hash tag inside key (the text between the first
// '{' and the next '}'), as Redis Cluster computes the slot from it.
func HashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j == i+1 {
						return key
					}
					return key[i+1 : j]
				}
			}
			return key
		}
	}
	return key
}

// The rest of the Redis key format, beside Key and onceKey so that every
// key Tollgate stores is spelled in this one file. Keys outlive a process:
// a rolling update reads the keys the previous version wrote, so these
// bytes change only with a migration (TestKeyFormatPinned pins them).
// Each key starts with "tg:{", a Cluster hash tag, "}": every call on one
// counter, breaker, scope or cell touches one slot.

// BreakerKey is the store key of the breaker named name for descriptor
// key descKey. Like Key it starts with a hash tag that is a hash of the
// two (so a brace in a value cannot move it) and writes each string with
// its length in front.
func BreakerKey(descKey, name string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(descKey))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(name))
	b := make([]byte, 0, 32+len(descKey)+len(name))
	b = append(b, "tg:{"...)
	b = appendHex(b, h.Sum64())
	b = append(b, "}:b:"...)
	b = appendString(b, descKey)
	b = appendString(b, name)
	return string(b)
}

// BreakerOnceKey is the store key of the marker of a failure named once
// on the breaker at key: key's hash tag, so that one script reaches both.
func BreakerOnceKey(key, once string) string { return key + ":once:" + once }

// CountKey is the key where the Redis store counts the fixed window of
// charge ch that at (Unix ms) is in: ch.Key, '#' and the window's index
// (its start over its width), on ch.Key's slot. A key with no hash tag is
// braced whole ("{key}#idx"), which keeps its slot: the slot of a key
// without a tag is that of the whole key. ok is false when ch.Key is not
// Countable.
func CountKey(ch *Charge, at int64) (k string, ok bool) {
	if !Countable(ch.Key) {
		return "", false
	}
	var sb strings.Builder
	sb.Grow(len(ch.Key) + 23)
	writeCountKey(&sb, ch.Key, floorDiv(at, WindowMillis(ch)))
	return sb.String(), true
}

// CountKeys are the count keys (CountKey) of the window at is in and of
// the next one, in one allocation.
func CountKeys(ch *Charge, at int64) (cur, next string, ok bool) {
	if !Countable(ch.Key) {
		return "", "", false
	}
	idx := floorDiv(at, WindowMillis(ch))
	var sb strings.Builder
	sb.Grow(2 * (len(ch.Key) + 23))
	writeCountKey(&sb, ch.Key, idx)
	n := sb.Len()
	writeCountKey(&sb, ch.Key, idx+1)
	s := sb.String()
	return s[:n], s[n:], true
}

// writeCountKey writes the count key of key's window idx to sb.
func writeCountKey(sb *strings.Builder, key string, idx int64) {
	if HashTag(key) == key {
		sb.WriteByte('{')
		sb.WriteString(key)
		sb.WriteByte('}')
	} else {
		sb.WriteString(key)
	}
	sb.WriteByte('#')
	var d [20]byte
	sb.Write(strconv.AppendInt(d[:0], idx, 10))
}

// Countable reports whether key can carry count keys (CountKey) on its
// own slot: it has a hash tag, or braces can enclose it (it is not empty
// and holds no '}').
func Countable(key string) bool {
	return HashTag(key) != key || (key != "" && strings.IndexByte(key, '}') < 0)
}

// FairStateKey is the fair-share state of the shared counter at key: key's
// hash tag, so that the counter and its state are one slot and one script.
func FairStateKey(key string) string { return key + ":fair" }

// BoardKey and PushedKey are the pressure board of scope: the hash of the
// replicas' scores, and the score an outside controller pushes. Every
// scope shares the tag {pressure}; an operator may SET the pushed key.
func BoardKey(scope string) string  { return "tg:{pressure}:" + scope }
func PushedKey(scope string) string { return "tg:{pressure}pushed:" + scope }

// FlightsKey, MeterKey and CellKey are the control loop's shared state
// (Flights, Meters, Cells): each under a hash tag that is a hash of its
// kind letter (f, m, c; no other key uses them) and scope, then the
// letter and the scope with its length in front:
//
//	tg:{<16 hex>}:f:<len>:<scope>                  flights
//	tg:{<16 hex>}:m:<len>:<scope>:<width>:<start>  a meter bucket
//	tg:{<16 hex>}:c:<len>:<key>                    a cell
func FlightsKey(scope string) string { return string(sharedKey('f', scope, 0)) }

// MeterKey is the meter bucket of scope of width ms starting at start ms.
func MeterKey(scope string, width, start int64) string {
	b := sharedKey('m', scope, 40)
	b = append(b, ':')
	b = strconv.AppendInt(b, width, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, start, 10)
	return string(b)
}

// CellKey is the cell named key.
func CellKey(key string) string { return string(sharedKey('c', key, 0)) }

func sharedKey(kind byte, scope string, extra int) []byte {
	h := fnv.New64a()
	_, _ = h.Write([]byte{kind, 0})
	_, _ = h.Write([]byte(scope))
	b := make([]byte, 0, 32+len(scope)+extra)
	b = append(b, "tg:{"...)
	b = appendHex(b, h.Sum64())
	b = append(b, "}:"...)
	b = append(b, kind, ':')
	return appendString(b, scope)
}
