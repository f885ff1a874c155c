package ticket

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Key sizes: HMAC-SHA256 gains nothing from a key over its 64-byte block
// beyond what hashing it down gives, and a key under 32 bytes is weaker
// than the hash.
const (
	MinKeyBytes = 32
	MaxKeyBytes = 1024
	// MaxKeys bounds a key file: the current key and a few previous
	// ones, each tried in turn on every ticket opened.
	MaxKeys = 4
	// maxKeyFileBytes bounds what LoadKeys reads.
	maxKeyFileBytes = 64 << 10
)

// Keys are the HMAC keys tickets are sealed and opened with: the first
// seals and opens, the others (previous keys, during a rotation) only
// open. Immutable once made.
type Keys struct {
	raw  [][]byte
	macs []*macs
	// id fingerprints the keys for logs: not the keys, and not usable to
	// recover them.
	id string
}

// NewKeys returns Keys with current first and previous after it; each
// key is MinKeyBytes to MaxKeyBytes bytes.
func NewKeys(current []byte, previous ...[]byte) (*Keys, error) {
	all := append([][]byte{current}, previous...)
	if len(all) > MaxKeys {
		return nil, fmt.Errorf("ticket: %d keys, at most %d", len(all), MaxKeys)
	}
	k := &Keys{}
	for i, key := range all {
		if err := checkKey(key); err != nil {
			return nil, fmt.Errorf("ticket: key %d: %w", i+1, err)
		}
		k.raw = append(k.raw, bytes.Clone(key))
		k.macs = append(k.macs, newMACs(key))
	}
	// The fingerprint is a MAC of a fixed label under the current key.
	fp := k.macs[0].tag(nil, []byte("tollgate ticket key id"))
	k.id = base64.RawURLEncoding.EncodeToString(fp[:6])
	return k, nil
}

// RandomKeys returns Keys with one fresh random key: tickets sealed with
// it open only in this process.
func RandomKeys() *Keys {
	key := make([]byte, MinKeyBytes)
	_, _ = rand.Read(key) // never fails (crypto/rand, Go 1.24+)
	k, err := NewKeys(key)
	if err != nil {
		panic(err) // unreachable: the key has the minimum size
	}
	return k
}

// Rotate returns Keys that seal with next and still open what k's current
// key sealed.
func (k *Keys) Rotate(next []byte) (*Keys, error) { return NewKeys(next, k.raw[0]) }

// Equal reports whether k and o hold the same keys in the same order.
func (k *Keys) Equal(o *Keys) bool {
	if len(k.raw) != len(o.raw) {
		return false
	}
	for i := range k.raw {
		if !hmac.Equal(k.raw[i], o.raw[i]) {
			return false
		}
	}
	return true
}

// ID fingerprints the current key, for logs: replicas that log the same
// ID seal with the same key.
func (k *Keys) ID() string { return k.id }

// Len is the number of keys held.
func (k *Keys) Len() int { return len(k.macs) }

func checkKey(key []byte) error {
	switch {
	case len(key) < MinKeyBytes:
		return fmt.Errorf("is %d bytes, at least %d are needed", len(key), MinKeyBytes)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("is %d bytes, at most %d", len(key), MaxKeyBytes)
	}
	return nil
}

// sign appends the current key's tag of b to b.
func (k *Keys) sign(b []byte) []byte { return k.macs[0].tag(b, b) }

// verify reports whether tag is msg's tag under one of the keys, in time
// independent of where the tags differ.
func (k *Keys) verify(msg, tag []byte) bool {
	var buf [tagBytes]byte
	ok := false
	for _, m := range k.macs {
		if hmac.Equal(m.tag(buf[:0], msg), tag) {
			ok = true
		}
	}
	return ok
}

// KeyFileError is a problem in a key file, named by file and line. It
// never quotes the line: it may hold a key.
type KeyFileError struct {
	File string
	Line int
	Msg  string
}

func (e *KeyFileError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// ParseKeys reads a key file's bytes; name is used in errors. The file
// holds one key a line, in base64 (standard or URL alphabet, padded or
// not), current key first, then previous ones still accepted; blank lines
// and lines starting with # are skipped. A 32-byte key:
//
//	head -c 32 /dev/urandom | base64
func ParseKeys(name string, data []byte) (*Keys, error) {
	if len(data) > maxKeyFileBytes {
		return nil, &KeyFileError{File: name, Msg: fmt.Sprintf("is over %d bytes", maxKeyFileBytes)}
	}
	var keys [][]byte
	var errs []error
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		key, err := decodeKey(string(line))
		if err == nil {
			err = checkKey(key)
		}
		if err != nil {
			errs = append(errs, &KeyFileError{File: name, Line: i + 1, Msg: "key " + err.Error()})
			continue
		}
		keys = append(keys, key)
	}
	switch {
	case len(errs) > 0:
		return nil, errors.Join(errs...)
	case len(keys) == 0:
		return nil, &KeyFileError{File: name, Msg: "holds no key; put a base64 key of at least 32 bytes on a line (head -c 32 /dev/urandom | base64)"}
	case len(keys) > MaxKeys:
		return nil, &KeyFileError{File: name, Msg: fmt.Sprintf("holds %d keys, at most %d (the current one and the previous ones still accepted)", len(keys), MaxKeys)}
	}
	return NewKeys(keys[0], keys[1:]...)
}

func decodeKey(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	enc := base64.RawStdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.RawURLEncoding
	}
	b, err := enc.DecodeString(s)
	if err != nil {
		return nil, errors.New("is not base64")
	}
	return b, nil
}

// LoadKeys reads the key file at path.
func LoadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read ticket keys: %w", err)
	}
	defer f.Close() //nolint:errcheck // opened read-only: a close error loses nothing
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read ticket keys %q: %w", path, err)
	}
	return ParseKeys(path, data)
}
