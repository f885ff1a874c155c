package extauthz

import (
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Keys. A Go backend decodes a body with encoding/json, which matches an
// object's key to a struct field exactly or, failing that, under Unicode
// simple case folding ("MODEL", "Model", "\u006dodel", and "ſ" for "s"
// or the Kelvin sign for "k"), and lets the last key that matches win.
// Were Tollgate to read only the exact key, or the first, a body could be
// charged for one model or cap and served another. So each key of an
// object the parser reads is matched against that object's read fields:
// a key that is a field's name exactly, the first time, is read; a second
// key for the same field, or one that only folds to a field's name, makes
// the body refused (errors in keyError). Keys that fold to no read field
// are skipped whatever they are: the backend may read them, but they do
// not change what Tollgate charges. See docs/security.md, finding 4.
//
// Matching decodes a key as it goes, escapes and all, comparing it with
// the name rune by rune: no allocation, and at most a name's length of
// the key is read for each name, so an escaped key costs about what a
// plain one does.

// The read fields of each kind of nested object (the top level's are
// Settings.ModelBodyField and the endpoint's row of the table).
var (
	messageKeys  = []string{"content", "tool_calls", "function_call"}
	partKeys     = []string{"text", "type", "image_url", "detail"}
	itemKeys     = []string{"text", "type", "image_url", "detail", "content", "output", "summary", "arguments", "name"}
	imageURLKeys = []string{"detail"}
	toolKeys     = []string{"function"}
	toolCallKeys = []string{"function", "name", "arguments"}
	callKeys     = []string{"name", "arguments"}
)

// keyMatch is how a key compares with a field's name.
type keyMatch uint8

const (
	keyOther keyMatch = iota
	keyExact
	// keyFolds is a key that is not the name but equals it under Unicode
	// simple case folding, as encoding/json compares them.
	keyFolds
)

// keyError is the refusal of a body that names field more than once, or
// in another case, in one object.
func keyError(field string) *bodyError {
	return &bodyError{code: "ambiguous_key", param: field,
		msg: "The field " + strconv.Quote(field) + " is given more than once, or in another letter case, in one object; give it once, as " +
			strconv.Quote(field) + "."}
}

// keySearch is one key's search through an object's read fields.
type keySearch struct {
	hit    int    // the field the key is exactly, or -1
	folded string // a field the key only folds to, if any
}

// try compares key k with field i, name; true when it is exactly that,
// which ends the search. i is its bit in s.seen: below 64.
func (s *scanner[T]) try(f *keySearch, k token, i int, name string) bool {
	switch s.match(k, name) {
	case keyExact:
		f.hit = i
		return true
	case keyFolds:
		if f.folded == "" {
			f.folded = name
		}
	}
	return false
}

// found ends a search: the field the key reads (-1 for none), or the
// refusal of a key that repeats a field or only folds to one.
func (s *scanner[T]) found(f *keySearch, name string) (int, error) {
	switch {
	case f.hit >= 0 && s.seen&(1<<f.hit) != 0:
		return -1, keyError(name)
	case f.hit >= 0:
		s.seen |= 1 << f.hit
		return f.hit, nil
	case f.folded != "":
		return -1, keyError(f.folded)
	}
	return -1, nil
}

// field is which of names (an object's read fields) key k reads, or ""
// for none; an error for a key that repeats one or only folds to one.
func (s *scanner[T]) field(k token, names []string) (string, error) {
	f := keySearch{hit: -1}
	for i, name := range names {
		if s.try(&f, k, i, name) {
			break
		}
	}
	if f.hit < 0 {
		_, err := s.found(&f, "")
		return "", err
	}
	name := names[f.hit]
	_, err := s.found(&f, name)
	return name, err
}

// match compares string token k, as encoding/json decodes it, with name.
func (s *scanner[T]) match(k token, name string) keyMatch {
	d := s.data[:k.end]
	if k.plain() {
		if m, ok := matchASCII(d[k.start:], name); ok {
			return m
		}
	}
	exact := true
	i, j := k.start, 0
	for i < k.end && j < len(name) {
		r, n := keyRune(d, i)
		c, m := utf8.DecodeRuneInString(name[j:])
		if r != c {
			if !foldsTo(r, c) {
				return keyOther
			}
			exact = false
		}
		i, j = i+n, j+m
	}
	switch {
	case i < k.end || j < len(name):
		return keyOther
	case exact:
		return keyExact
	}
	return keyFolds
}

// matchASCII is match for a plain key, which is ASCII, a rune a byte:
// ok is false when only the rune by rune walk can tell (name has a rune
// beyond ASCII that may fold to the key's).
func matchASCII[T string | []byte](key T, name string) (m keyMatch, ok bool) {
	switch {
	case len(key) > len(name):
		// A name has no fewer bytes than runes: a longer key has more
		// runes than it.
		return keyOther, true
	case len(key) < len(name):
		if len(key) > 0 && name[0] < utf8.RuneSelf && lower(key[0]) != lower(name[0]) {
			return keyOther, true
		}
		return keyOther, false
	}
	m = keyExact
	for i := range len(name) {
		switch c, n := key[i], name[i]; {
		case c == n:
		case n >= utf8.RuneSelf:
			return keyOther, false
		case lower(c) != lower(n):
			return keyOther, true
		default:
			m = keyFolds
		}
	}
	return m, true
}

// lower is an ASCII letter in lower case, and any other byte as it is.
func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// is says whether string token t decodes to name.
func (s *scanner[T]) is(t token, name string) bool {
	if t.plain() {
		return string(s.data[t.start:t.end]) == name
	}
	return s.match(t, name) == keyExact
}

// keyRune decodes the rune of a string token's text at d[i] (str checked
// the text), as encoding/json does: an escape, a \u pair for a
// surrogate pair, U+FFFD for an unpaired surrogate or a byte of invalid
// UTF-8. It returns the rune and the bytes it took.
func keyRune[T string | []byte](d T, i int) (rune, int) {
	c := d[i]
	switch {
	case c >= utf8.RuneSelf:
		return utf8.DecodeRuneInString(string(d[i:min(i+utf8.UTFMax, len(d))]))
	case c != '\\':
		return rune(c), 1
	}
	switch d[i+1] {
	case 'u':
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	default: // '"', '\\', '/'
		return rune(d[i+1]), 2
	}
	r := hex4(d[i+2:])
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	// d ends where the token does, so a second escape is whole.
	if i+12 <= len(d) && d[i+6] == '\\' && d[i+7] == 'u' {
		if p := utf16.DecodeRune(r, hex4(d[i+8:])); p != utf8.RuneError {
			return p, 12
		}
	}
	return utf8.RuneError, 6
}

// foldsTo says whether runes r and c, which differ, are one under Unicode
// simple case folding, as encoding/json's key match (bytes.EqualFold)
// decides.
func foldsTo(r, c rune) bool {
	if r < utf8.RuneSelf && c < utf8.RuneSelf {
		return 'A' <= r && r <= 'Z' && r+'a'-'A' == c || 'A' <= c && c <= 'Z' && c+'a'-'A' == r
	}
	// Walk r's fold orbit (SimpleFold cycles through it) looking for c.
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if f == c {
			return true
		}
	}
	return false
}
