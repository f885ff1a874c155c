package extproc

// The request-phase option: a chat/completions request that streams
// without stream_options.include_usage gets no usage chunk, so its
// response can only be charged by its streamed characters. A second,
// optional ext_proc filter (request headers SEND, request body BUFFERED,
// not observability mode) lets Process add the option to the body.
//
// The body is edited as text, not decoded and re-encoded: every byte the
// client sent stays as it was (key order, number spelling, unknown
// fields), and only the option is inserted.

// maxJSONDepth bounds the nesting of a request body that is edited; a
// deeper body is left alone.
const maxJSONDepth = 128

// Inserted text.
const (
	addStreamOptions = `"stream_options":{"include_usage":true},`
	addIncludeUsage  = `"include_usage":true`
	replaceNull      = `{"include_usage":true}`
)

// withIncludeUsage returns body with stream_options.include_usage set to
// true when body is a JSON object whose "stream" is true and whose
// stream_options has no include_usage. Any other body (not JSON, not
// streaming, include_usage already present even if false: the client
// chose) is left alone: nil, false.
//
// Keys are compared as written; a key spelt with escapes is some other
// key. For a duplicated key the last one counts, as in most JSON
// decoders. Work is linear in len(body), with one allocation for the
// result.
func withIncludeUsage(body []byte) ([]byte, bool) {
	p := jsonParser{b: body}
	p.space()
	if !p.peek('{') {
		return nil, false
	}
	open := p.i
	p.i++
	stream := false
	optStart, optEnd := -1, -1
	if !p.members(func(key []byte, start, end int) {
		switch string(key) {
		case "stream":
			stream = string(body[start:end]) == "true"
		case "stream_options":
			optStart, optEnd = start, end
		}
	}) {
		return nil, false
	}
	p.space()
	if p.i != len(body) || !stream {
		return nil, false
	}
	switch {
	case optStart < 0:
		// "stream" is a member, so the object is not empty: a comma
		// always follows the insertion.
		return splice(body, open+1, open+1, addStreamOptions), true
	case body[optStart] == 'n': // null
		return splice(body, optStart, optEnd, replaceNull), true
	case body[optStart] != '{':
		return nil, false // the upstream answers 400 anyway
	}
	q := jsonParser{b: body[:optEnd], i: optStart + 1}
	has, empty := false, true
	if !q.members(func(key []byte, _, _ int) {
		empty = false
		if string(key) == "include_usage" {
			has = true
		}
	}) || has {
		return nil, false
	}
	if empty {
		return splice(body, optStart+1, optStart+1, addIncludeUsage), true
	}
	return splice(body, optStart+1, optStart+1, addIncludeUsage+","), true
}

// splice returns b with b[from:to] replaced by s, in a new slice.
func splice(b []byte, from, to int, s string) []byte {
	out := make([]byte, 0, len(b)-(to-from)+len(s))
	out = append(out, b[:from]...)
	out = append(out, s...)
	return append(out, b[to:]...)
}

// jsonParser walks a JSON text in memory, checking its syntax.
type jsonParser struct {
	b     []byte
	i     int
	depth int
}

func (p *jsonParser) space() {
	for p.i < len(p.b) && isSpace(p.b[p.i]) {
		p.i++
	}
}

func (p *jsonParser) peek(c byte) bool { return p.i < len(p.b) && p.b[p.i] == c }

// members reads an object's members after its '{' up to and including
// its '}', calling f with each raw key (without quotes) and the bounds of
// its value. It returns false if the text is not a valid object.
func (p *jsonParser) members(f func(key []byte, start, end int)) bool {
	p.space()
	if p.peek('}') {
		p.i++
		return true
	}
	for {
		p.space()
		ks := p.i + 1
		if !p.peek('"') || !p.str() {
			return false
		}
		key := p.b[ks : p.i-1]
		p.space()
		if !p.peek(':') {
			return false
		}
		p.i++
		p.space()
		start := p.i
		if !p.value() {
			return false
		}
		f(key, start, p.i)
		p.space()
		switch {
		case p.peek(','):
			p.i++
		case p.peek('}'):
			p.i++
			return true
		default:
			return false
		}
	}
}

// value skips one JSON value.
func (p *jsonParser) value() bool {
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '"':
		return p.str()
	case c == '{':
		if p.depth++; p.depth > maxJSONDepth {
			return false
		}
		p.i++
		ok := p.members(func([]byte, int, int) {})
		p.depth--
		return ok
	case c == '[':
		if p.depth++; p.depth > maxJSONDepth {
			return false
		}
		p.i++
		ok := p.elements()
		p.depth--
		return ok
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	}
	return false
}

func (p *jsonParser) elements() bool {
	p.space()
	if p.peek(']') {
		p.i++
		return true
	}
	for {
		p.space()
		if !p.value() {
			return false
		}
		p.space()
		switch {
		case p.peek(','):
			p.i++
		case p.peek(']'):
			p.i++
			return true
		default:
			return false
		}
	}
}

// str skips a string starting at its opening quote.
func (p *jsonParser) str() bool {
	p.i++
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return true
		case c == '\\':
			if p.i+1 >= len(p.b) {
				return false
			}
			switch p.b[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if p.i+6 > len(p.b) {
					return false
				}
				for _, h := range p.b[p.i+2 : p.i+6] {
					if !isHex(h) {
						return false
					}
				}
				p.i += 6
			default:
				return false
			}
		case c < 0x20:
			return false
		default:
			p.i++
		}
	}
	return false
}

func (p *jsonParser) literal(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// number skips a number, checking RFC 8259's grammar.
func (p *jsonParser) number() bool {
	if p.peek('-') {
		p.i++
	}
	switch {
	case p.peek('0'):
		p.i++
	case p.digits() == 0:
		return false
	}
	if p.peek('.') {
		p.i++
		if p.digits() == 0 {
			return false
		}
	}
	if p.peek('e') || p.peek('E') {
		p.i++
		if p.peek('+') || p.peek('-') {
			p.i++
		}
		if p.digits() == 0 {
			return false
		}
	}
	return true
}

func (p *jsonParser) digits() int {
	n := 0
	for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}
