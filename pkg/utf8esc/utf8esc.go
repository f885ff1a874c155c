// Package utf8esc turns any byte string into valid UTF-8, injectively.
//
// Envoy is C++ and forwards header values, descriptor values and bodies
// as bytes, but proto3 strings and replies must be valid UTF-8. A valid
// string is left exactly as it is, so keys made from honest values do not
// change. In a string that is not valid, every byte that does not start a
// valid sequence becomes one code point of the private use range
// U+EF80-U+EFFF (byte 0x80+n -> U+EF80+n), and so does every byte of a code
// point of that range already present: inside an escaped string every such
// code point is an escape, so Unescape recovers the original bytes and two
// distinct invalid strings never escape to the same string. (No mapping
// that leaves valid strings alone can also keep escaped strings apart from
// every valid one: a valid string that happens to spell an escaped one is
// the same key. Whoever could send that string could send it directly.)
//
// The private use range is chosen over a textual escape such as \xFF so
// that an escaped JSON body stays the same JSON: the escape adds no
// quote, backslash or control character.
package utf8esc

import "unicode/utf8"

const (
	// first is the code point that stands for byte 0x80.
	first = 0xEF80
	// last is the code point that stands for byte 0xFF.
	last = 0xEFFF
)

// String returns s if it is valid UTF-8, else its escaped form.
func String(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(escape(make([]byte, 0, len(s)+len(s)/2), s))
}

// Bytes is String for a byte slice; it returns b itself when b is valid.
func Bytes(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return escape(make([]byte, 0, len(b)+len(b)/2), string(b))
}

// escape appends the escaped form of s, which is not valid UTF-8, to dst.
func escape(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || (r >= first && r <= last) {
			for _, b := range []byte(s[i : i+n]) {
				dst = utf8.AppendRune(dst, first+rune(b)-0x80)
			}
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return dst
}

// Unescape inverts String for a string that was not valid UTF-8 (a valid
// one String returns as it is): each code point of U+EF80-U+EFFF becomes
// the byte it stands for. It exists for tests and
// for tools that need the bytes Envoy sent; Tollgate's keys use the
// escaped form.
func Unescape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r >= first && r <= last {
			out = append(out, byte(r-first+0x80))
		} else {
			out = append(out, s[i:i+n]...)
		}
		i += n
	}
	return string(out)
}
