package extauthz

// The body scanner's JSON grammar: tokens, objects and arrays, strings
// and numbers read as encoding/json reads them, values skipped whole, and
// the character count of a string. body.go holds the scanner and the
// fields it reads; the other body_*.go files walk the values of one kind.

import (
	"encoding/json"
	"math/bits"
	"unicode/utf8"
)

// token is a scalar's kind and, for a string or a number, where its
// text is: a string's between its quotes.
type token struct {
	kind     tokenKind
	start    int
	end      int
	escaped  bool // a string with a backslash escape
	nonASCII bool // a string with a byte >= 0x80
}

type tokenKind uint8

const (
	tokenString tokenKind = iota + 1
	tokenNumber
	tokenBool
	tokenNull
)

// plain says whether a string token is ASCII without escapes: its text is
// its value, a byte a character.
func (t token) plain() bool { return !t.escaped && !t.nonASCII }

// next skips white space and returns the byte after it.
func (s *scanner[T]) next() (byte, error) {
	for s.i < len(s.data) {
		switch c := s.data[s.i]; c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return c, nil
		}
	}
	return 0, errTruncated
}

// object reads an object, handing member each key and the scanner at the
// member's value.
func (s *scanner[T]) object(member func(key token) error) error {
	outer := s.seen
	s.seen = 0
	err := s.members(member)
	s.seen = outer
	return err
}

// members is object with s.seen the object's own.
func (s *scanner[T]) members(member func(key token) error) error {
	return s.elements('}', member, nil)
}

// key reads a member's key and its colon, and skips to its value.
func (s *scanner[T]) key() (token, error) {
	if s.data[s.i] != '"' {
		return token{}, errNotJSON
	}
	k, err := s.str()
	if err != nil {
		return k, err
	}
	c, err := s.next()
	if err != nil {
		return k, err
	}
	if c != ':' {
		return k, errNotJSON
	}
	s.i++
	_, err = s.next()
	return k, err
}

// inObject scans the object at s.i with member, one level deeper: the
// depth a body could otherwise grow without bound is counted here.
func (s *scanner[T]) inObject(member func(key token) error) error {
	s.depth++
	err := s.object(member)
	s.depth--
	return err
}

// inArray is inObject for an array.
func (s *scanner[T]) inArray(item func() error) error {
	s.depth++
	err := s.array(item)
	s.depth--
	return err
}

// array reads an array, calling item at each element.
func (s *scanner[T]) array(item func() error) error {
	return s.elements(']', nil, item)
}

// elements reads the comma-separated elements of the object or array
// opening at s.i up to its closing byte end: the one loop of members and
// array. An object's element is a key, read here and handed to member;
// an array's is handed to item. (Two funcs, not member wrapped in an
// item closure, which would add an indirect call per member on the
// request path.)
func (s *scanner[T]) elements(end byte, member func(key token) error, item func() error) error {
	s.i++ // '{' or '['
	c, err := s.next()
	if err != nil {
		return err
	}
	if c == end {
		s.i++
		return nil
	}
	for {
		if member != nil {
			k, err := s.key()
			if err != nil {
				return err
			}
			if err := member(k); err != nil {
				return err
			}
		} else if err := item(); err != nil {
			return err
		}
		if c, err = s.next(); err != nil {
			return err
		}
		switch c {
		case ',':
			s.i++
			if _, err := s.next(); err != nil {
				return err
			}
		case end:
			s.i++
			return nil
		default:
			return errNotJSON
		}
	}
}

// unquote decodes string token t as encoding/json does, replacing invalid
// UTF-8 and unpaired surrogates with U+FFFD.
func (s *scanner[T]) unquote(t token) string {
	var v string
	// The token was checked: the quotes around it make a valid JSON string.
	_ = json.Unmarshal([]byte(s.data[t.start-1:t.end+1]), &v)
	return v
}

// digits is the length of the run of ASCII digits d starts with.
func digits[T string | []byte](d T) int {
	i := 0
	for i < len(d) && '0' <= d[i] && d[i] <= '9' {
		i++
	}
	return i
}

// chars counts the characters of a string: the runes it decodes to.
func (s *scanner[T]) chars() error { return s.charsTo(&s.body.PromptChars) }

// charsTo is chars adding to *count.
func (s *scanner[T]) charsTo(count *uint64) error {
	t, err := s.str()
	if err != nil {
		return err
	}
	if t.plain() {
		*count += uint64(t.end - t.start)
		return nil
	}
	d := s.data[:t.end]
	n := 0
	for i := t.start; i < t.end; {
		j := i
		for j < t.end && d[j] != '\\' {
			j++
		}
		n += runeCount(d[i:j]) // invalid UTF-8: a rune (U+FFFD) a byte
		if j == t.end {
			break
		}
		// An escape is one rune; a \u escape of a surrogate pair, which
		// takes two, too: keyRune says how many bytes it spans.
		n++
		_, w := keyRune(d, j)
		i = j + w
	}
	*count += uint64(n)
	return nil
}

// hex4 decodes the four hex digits d starts with (str checked them).
func hex4[T string | []byte](d T) rune {
	var r rune
	for i := range 4 {
		c := d[i]
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// runeCount is utf8.RuneCount or RuneCountInString, whichever d needs.
func runeCount[T string | []byte](d T) int {
	if b, ok := any(d).([]byte); ok {
		return utf8.RuneCount(b)
	}
	return utf8.RuneCountInString(string(d))
}

// scalar reads a string, a number, true, false or null.
func (s *scanner[T]) scalar() (token, error) {
	switch c := s.data[s.i]; {
	case c == '"':
		return s.str()
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	case c == 't':
		return token{kind: tokenBool}, s.literal("true")
	case c == 'f':
		return token{kind: tokenBool}, s.literal("false")
	case c == 'n':
		return token{kind: tokenNull}, s.literal("null")
	}
	return token{}, errNotJSON
}

func (s *scanner[T]) literal(word string) error {
	for i := range len(word) {
		switch {
		case s.i+i >= len(s.data):
			return errTruncated
		case s.data[s.i+i] != word[i]:
			return errNotJSON
		}
	}
	s.i += len(word)
	return nil
}

// number reads a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// One that could go on when the body ends is complete, as for
// encoding/json.
func (s *scanner[T]) number() (token, error) {
	d, i := s.data, s.i
	t := token{kind: tokenNumber, start: i}
	if d[i] == '-' {
		i++
	}
	switch {
	case i == len(d):
		return t, errTruncated
	case d[i] == '0':
		i++
	case '1' <= d[i] && d[i] <= '9':
		i += digits(d[i:])
	default:
		return t, errNotJSON
	}
	if i < len(d) && d[i] == '.' {
		i++
		n := digits(d[i:])
		switch {
		case i == len(d):
			return t, errTruncated
		case n == 0:
			return t, errNotJSON
		}
		i += n
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		n := digits(d[i:])
		switch {
		case i == len(d):
			return t, errTruncated
		case n == 0:
			return t, errNotJSON
		}
		i += n
	}
	s.i, t.end = i, i
	return t, nil
}

// str reads a string: any bytes but control characters, with valid
// escapes.
func (s *scanner[T]) str() (token, error) {
	d := s.data
	i := s.i + 1
	t := token{kind: tokenString, start: i}
	high := uint64(hi) // a byte >= 0x80 stops the fast loop until one is seen
	for i < len(d) {
		// Eight bytes at a time up to the next that is not plain: most
		// of a body is message text.
		for ; i+8 <= len(d); i += 8 {
			x := load64(d, i)
			q, b := x^(lo*'"'), x^(lo*'\\')
			if m := ((x-lo*0x20)&^x | (q-lo)&^q | (b-lo)&^b | x&high) & hi; m != 0 {
				i += bits.TrailingZeros64(m) / 8
				break
			}
		}
		if i == len(d) {
			break
		}
		c := d[i]
		if c >= 0x20 && c < 0x80 && c != '"' && c != '\\' {
			i++
			continue
		}
		switch {
		case c == '"':
			s.i, t.end = i+1, i
			return t, nil
		case c >= 0x80:
			t.nonASCII, high = true, 0
			i++
		case c < 0x20:
			return t, errNotJSON
		default: // '\\'
			t.escaped = true
			if i+1 == len(d) {
				return t, errTruncated
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
				continue
			case 'u':
			default:
				return t, errNotJSON
			}
			for j := i + 2; j < i+6; j++ {
				switch {
				case j == len(d):
					return t, errTruncated
				case !isHex(d[j]):
					return t, errNotJSON
				}
			}
			i += 6
		}
	}
	return t, errTruncated
}

// lo and hi are a word's bytes' low and high bits. A byte's high bit in
// (x-lo*n)&^x is set where a byte of x is under n (for n <= 0x80), in
// (x-lo)&^x where it is zero, and x&hi where it is >= 0x80. A borrow can
// set a bit above a byte that was rightly flagged, never below one, so
// the lowest bit set is exact.
const (
	lo = 0x0101010101010101
	hi = 0x8080808080808080
)

// load64 is the little-endian word at d[i:i+8].
func load64[T string | []byte](d T, i int) uint64 {
	d = d[i : i+8]
	return uint64(d[0]) | uint64(d[1])<<8 | uint64(d[2])<<16 | uint64(d[3])<<24 |
		uint64(d[4])<<32 | uint64(d[5])<<40 | uint64(d[6])<<48 | uint64(d[7])<<56
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// skip reads any value and keeps nothing. limited refuses nesting deeper
// than maxSkipDepth, as the first version did for a member it skipped
// (but not for a value of the wrong shape where it expected messages,
// content or a prompt).
func (s *scanner[T]) skip(limited bool) error {
	var open nesting
	for {
		// At a value.
		if c := s.data[s.i]; c == '{' || c == '[' {
			open.push(c == '{')
			if limited && s.depth+open.depth > maxSkipDepth {
				return errNotJSON
			}
			s.i++
			c, err := s.next()
			if err != nil {
				return err
			}
			switch {
			case c == '}' && open.object():
			case c == ']' && !open.object():
			case open.object():
				if _, err := s.key(); err != nil {
					return err
				}
				continue
			default:
				continue
			}
			s.i++
			open.pop()
		} else if _, err := s.scalar(); err != nil {
			return err
		}
		// After a value: close what it ends, up to the next value.
		for {
			if open.depth == 0 {
				return nil
			}
			c, err := s.next()
			if err != nil {
				return err
			}
			if c == ',' {
				s.i++
				if _, err := s.next(); err != nil {
					return err
				}
				if open.object() {
					if _, err := s.key(); err != nil {
						return err
					}
				}
				break
			}
			if c != '}' && c != ']' || (c == '}') != open.object() {
				return errNotJSON
			}
			s.i++
			open.pop()
		}
	}
}

// nesting is a stack of open objects and arrays, a bit each; the first
// 256 levels cost no allocation.
type nesting struct {
	depth int
	small [4]uint64
	more  []uint64
}

func (n *nesting) word(d int) *uint64 {
	w := d / 64
	if w < len(n.small) {
		return &n.small[w]
	}
	for w-len(n.small) >= len(n.more) {
		n.more = append(n.more, 0)
	}
	return &n.more[w-len(n.small)]
}

func (n *nesting) push(object bool) {
	w, bit := n.word(n.depth), uint64(1)<<(n.depth%64)
	if object {
		*w |= bit
	} else {
		*w &^= bit
	}
	n.depth++
}

func (n *nesting) pop() { n.depth-- }

// object says whether the innermost open value is an object.
func (n *nesting) object() bool {
	return *n.word(n.depth - 1)&(uint64(1)<<((n.depth-1)%64)) != 0
}
