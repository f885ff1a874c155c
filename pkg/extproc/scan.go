package extproc

// The JSON scanner reads one JSON document (a whole response body, or the
// data of one SSE event) a chunk at a time, with a chunk boundary
// anywhere, keeping a fixed-size state and no bytes of the document. It
// knows just enough of the OpenAI chat/completions and Responses API
// shapes to find the usage object and the streamed text, and checks the
// syntax on the way, so that a usage-like string inside generated text
// (the model can be asked to print one) is never taken for the real one.

// maxDepth bounds the nesting the scanner follows; a deeper document is
// treated as garbage. Real responses nest a handful of levels.
const maxDepth = 64

// maxKey is the longest object key the scanner compares; every key it
// looks for is shorter, so a longer key is simply "some other key".
const maxKey = 24

// maxType bounds the captured Responses API event type.
const maxType = 48

// maxTokens is the largest token count accepted in a usage field: a
// trillion, far above any real request. A larger value marks the usage
// object invalid rather than charging an absurd number.
const maxTokens = 1_000_000_000_000

// role is what a container is to the reader. Everything not listed is
// roleOther: scanned for syntax, otherwise ignored.
type role uint8

const (
	roleOther     role = iota
	roleRoot           // the top-level object
	roleUsage          // root.usage, root.response.usage
	roleResponse       // root.response (a Responses API stream event)
	roleChoices        // root.choices
	roleChoice         // root.choices[i]
	roleDelta          // root.choices[i].delta
	roleToolCalls      // root.choices[i].delta.tool_calls
	roleToolCall       // root.choices[i].delta.tool_calls[j]
	roleFunction       // root.choices[i].delta.tool_calls[j].function
)

// leaf is what the scanner does with a scalar value.
type leaf uint8

const (
	leafNone       leaf = iota
	leafText            // a string of streamed chat text: count its characters
	leafDelta           // root.delta: counted if root.type is a text delta event
	leafType            // root.type: captured
	leafPrompt          // usage.prompt_tokens
	leafCompletion      // usage.completion_tokens
	leafInput           // usage.input_tokens
	leafOutput          // usage.output_tokens
	leafTotal           // usage.total_tokens
)

// child says what the value under key in a container of role parent is.
func child(parent role, key string) (role, leaf) {
	switch parent {
	case roleRoot:
		switch key {
		case "usage":
			return roleUsage, leafNone
		case "response":
			return roleResponse, leafNone
		case "choices":
			return roleChoices, leafNone
		case "delta":
			return roleOther, leafDelta
		case "type":
			return roleOther, leafType
		}
	case roleResponse:
		if key == "usage" {
			return roleUsage, leafNone
		}
	case roleUsage:
		switch key {
		case "prompt_tokens":
			return roleOther, leafPrompt
		case "completion_tokens":
			return roleOther, leafCompletion
		case "input_tokens":
			return roleOther, leafInput
		case "output_tokens":
			return roleOther, leafOutput
		case "total_tokens":
			return roleOther, leafTotal
		}
	case roleChoice:
		if key == "delta" {
			return roleDelta, leafNone
		}
	case roleDelta:
		switch key {
		case "content", "reasoning_content":
			return roleOther, leafText
		case "tool_calls":
			return roleToolCalls, leafNone
		}
	case roleToolCall:
		if key == "function" {
			return roleFunction, leafNone
		}
	case roleFunction:
		if key == "arguments" {
			return roleOther, leafText
		}
	}
	return roleOther, leafNone
}

// element says what the elements of an array of role parent are.
func element(parent role) role {
	switch parent {
	case roleChoices:
		return roleChoice
	case roleToolCalls:
		return roleToolCall
	}
	return roleOther
}

// textDelta says whether a Responses API event type streams text that
// the model is billed for (audio deltas, say, are base64 and are not).
func textDelta(typ string) bool {
	switch typ {
	case "response.output_text.delta",
		"response.refusal.delta",
		"response.reasoning_text.delta",
		"response.reasoning_summary_text.delta",
		"response.function_call_arguments.delta":
		return true
	}
	return false
}

// usageAcc collects one usage object's fields.
type usageAcc struct {
	prompt, completion, input, output, total uint64
	seen                                     uint8 // bit per leafPrompt..leafTotal seen
	bad                                      bool  // a known field had a value that is no token count
}

func (u *usageAcc) set(l leaf, v uint64) {
	switch l {
	case leafPrompt:
		u.prompt = v
	case leafCompletion:
		u.completion = v
	case leafInput:
		u.input = v
	case leafOutput:
		u.output = v
	case leafTotal:
		u.total = v
	}
	u.seen |= 1 << (l - leafPrompt)
}

func (u *usageAcc) has(l leaf) bool { return u.seen&(1<<(l-leafPrompt)) != 0 }

// counts turns the fields into input, output and total. Chat's names win
// over the Responses API's when a server sends both.
func (u *usageAcc) counts() (in, out, total uint64) {
	in, out = u.input, u.output
	if u.has(leafPrompt) {
		in = u.prompt
	}
	if u.has(leafCompletion) {
		out = u.completion
	}
	// total_tokens as reported, but never below its parts: a server that
	// under-reports the total does not make the request cheaper.
	total = max(u.total, addSat(in, out))
	return in, out, total
}

func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// Scanner states.
const (
	sValue    uint8 = iota // a value is due
	sArrFirst              // after '[': a value or ']'
	sObjFirst              // after '{': a key or '}'
	sObjKey                // after ',' in an object: a key
	sKey                   // in a key
	sKeyEsc                // after '\' in a key
	sKeyHex                // in the hex digits of \u in a key
	sColon                 // after a key: ':'
	sAfter                 // after a value in a container: ',' or the close
	sStr                   // in a string value
	sStrEsc                // after '\' in a string value
	sStrHex                // in the hex digits of \u in a string value
	sNum                   // in a number
	sLit                   // in true, false or null
	sEnd                   // after the top-level value: only whitespace
	sBad                   // not JSON; stays so until reset
)

// frame is one open container.
type frame struct {
	obj  bool
	role role
}

var literals = [...]string{"true", "false", "null"}

// jsonScanner reads one JSON document in chunks. Its zero value (after
// reset) expects the start of a document.
type jsonScanner struct {
	state uint8
	depth int
	stack [maxDepth]frame

	// The key being read, and what the value after it will be.
	key      [maxKey]byte
	keyLen   int
	keyLong  bool // longer than maxKey, or escaped: matches nothing
	nextRole role
	nextLeaf leaf

	// The scalar being read.
	leaf    leaf
	hexLeft uint8
	lit     uint8 // index into literals
	litPos  uint8
	num     uint64
	numLen  int
	numBad  bool // not a token count: a sign, a fraction, an exponent, a leading zero or too large

	typ     [maxType]byte
	typLen  int
	typBad  bool
	typSeen bool

	// What the document holds so far.
	cur        usageAcc // the usage object being read
	found      usageAcc // the last complete, valid usage object
	hasFound   bool
	textChars  uint64 // characters of chat text strings
	deltaChars uint64 // characters of root.delta strings
}

func (s *jsonScanner) reset() {
	// Only the fields a new document reads before writing; the stack and
	// buffers are overwritten as they are used.
	s.state, s.depth = sValue, 0
	s.nextRole, s.nextLeaf = roleRoot, leafNone
	s.typLen, s.typBad, s.typSeen = 0, false, false
	s.hasFound = false
	s.textChars, s.deltaChars = 0, 0
}

// complete says whether the document is one whole, valid JSON value.
func (s *jsonScanner) complete() bool {
	if s.state == sNum && s.depth == 0 {
		s.endNumber()
		s.state = sEnd
	}
	return s.state == sEnd
}

// usage returns the document's last valid usage object.
func (s *jsonScanner) usage() (usageAcc, bool) { return s.found, s.hasFound }

// chars returns the characters of streamed text in the document.
func (s *jsonScanner) chars() uint64 {
	n := s.textChars
	if s.typSeen && !s.typBad && textDelta(string(s.typ[:s.typLen])) {
		n = addSat(n, s.deltaChars)
	}
	return n
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// feed scans p. Work is linear in len(p) and allocates nothing. The
// common states (plain runs in keys and strings, the bytes between
// tokens) are read here, in line: the benchmarks lost 5-8% when each was
// a method of its own. Escapes, literals, colons and the end, rarer, are
// methods.
func (s *jsonScanner) feed(p []byte) {
	for i := 0; i < len(p); {
		c := p[i]
		switch s.state {
		case sBad:
			return
		case sEnd, sColon:
			s.between(c)
		case sValue, sArrFirst:
			if isSpace(c) {
				break
			}
			if c == ']' && s.state == sArrFirst {
				s.close(false)
				break
			}
			s.startValue(c)
		case sObjFirst, sObjKey:
			switch {
			case isSpace(c):
			case c == '"':
				s.state, s.keyLen, s.keyLong = sKey, 0, false
			case c == '}' && s.state == sObjFirst:
				s.close(true)
			default:
				s.state = sBad
			}
		case sKey:
			// The common case: plain key bytes up to the closing quote.
			j := i
			for j < len(p) && p[j] != '"' && p[j] != '\\' && p[j] >= 0x20 {
				j++
			}
			if n := j - i; n > 0 {
				if s.keyLen+n <= maxKey {
					copy(s.key[s.keyLen:], p[i:j])
					s.keyLen += n
				} else {
					s.keyLong = true
				}
				i = j
				continue
			}
			switch c {
			case '"':
				s.endKey()
			case '\\':
				s.state, s.keyLong = sKeyEsc, true
			default: // a control character
				s.state = sBad
			}
		case sKeyEsc, sStrEsc, sKeyHex, sStrHex:
			s.escapeByte(c)
		case sAfter:
			top := &s.stack[s.depth-1]
			switch {
			case isSpace(c):
			case c == ',':
				if top.obj {
					s.state = sObjKey
				} else {
					s.state, s.nextRole, s.nextLeaf = sValue, element(top.role), leafNone
				}
			case c == '}' && top.obj, c == ']' && !top.obj:
				s.close(top.obj)
			default:
				s.state = sBad
			}
		case sStr:
			j := i
			for j < len(p) && p[j] != '"' && p[j] != '\\' && p[j] >= 0x20 {
				j++
			}
			if j > i {
				s.stringBytes(p[i:j])
				i = j
				continue
			}
			switch c {
			case '"':
				s.endValue()
			case '\\':
				s.state = sStrEsc
			default:
				s.state = sBad
			}
		case sNum:
			if s.numByte(c) {
				break
			}
			s.endNumber()
			s.endValue()
			continue // c ends the number and is read again in the new state
		case sLit:
			s.literalByte(c)
		}
		i++
	}
}

// escapeByte reads a byte of an escape in a key or a string value: the
// letter after the backslash, or a hex digit of \u.
func (s *jsonScanner) escapeByte(c byte) {
	switch s.state {
	case sKeyEsc, sStrEsc:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.state--
		case 'u':
			s.state++
			s.hexLeft = 4
		default:
			s.state = sBad
			return
		}
		if s.state == sStr || s.state == sStrHex {
			s.escapedChar()
		}
	default: // sKeyHex, sStrHex
		if !isHex(c) {
			s.state = sBad
			return
		}
		if s.hexLeft--; s.hexLeft == 0 {
			s.state -= 2
		}
	}
}

// literalByte reads a byte of true, false or null.
func (s *jsonScanner) literalByte(c byte) {
	lit := literals[s.lit]
	if c != lit[s.litPos] {
		s.state = sBad
		return
	}
	if s.litPos++; int(s.litPos) == len(lit) {
		s.endLiteral()
		s.endValue()
	}
}

// between reads a byte after the document's end (only white space may
// follow it) or where a key's colon is due.
func (s *jsonScanner) between(c byte) {
	switch {
	case isSpace(c):
	case c == ':' && s.state == sColon:
		s.state = sValue
	default:
		s.state = sBad
	}
}

// startValue begins the value whose first byte is c.
func (s *jsonScanner) startValue(c byte) {
	s.leaf = s.nextLeaf
	switch {
	case c == '{' || c == '[':
		if s.depth == maxDepth {
			s.state = sBad
			return
		}
		r := s.nextRole
		if c == '[' && r == roleRoot {
			r = roleOther
		}
		s.stack[s.depth] = frame{obj: c == '{', role: r}
		s.depth++
		if c == '{' {
			s.state = sObjFirst
			if r == roleUsage {
				s.cur = usageAcc{}
			}
		} else {
			s.state, s.nextRole, s.nextLeaf = sArrFirst, element(r), leafNone
		}
	case c == '"':
		s.state = sStr
		switch s.leaf {
		case leafType:
			s.typLen, s.typBad, s.typSeen = 0, false, true
		case leafPrompt, leafCompletion, leafInput, leafOutput, leafTotal:
			s.cur.bad = true // a token count in a string
		}
	case c == '-' || '0' <= c && c <= '9':
		s.state, s.num, s.numLen, s.numBad = sNum, 0, 0, false
		s.numByte(c)
	case c == 't' || c == 'f' || c == 'n':
		s.state, s.litPos = sLit, 1
		switch c {
		case 't':
			s.lit = 0
		case 'f':
			s.lit = 1
		default:
			s.lit = 2
		}
	default:
		s.state = sBad
	}
}

// close ends the innermost container.
func (s *jsonScanner) close(obj bool) {
	s.depth--
	if obj && s.stack[s.depth].role == roleUsage {
		if !s.cur.bad && s.cur.seen != 0 {
			s.found, s.hasFound = s.cur, true
		}
	}
	s.endValue()
}

// endKey decides what the value after the key just read is.
func (s *jsonScanner) endKey() {
	s.state = sColon
	s.nextRole, s.nextLeaf = roleOther, leafNone
	if !s.keyLong {
		s.nextRole, s.nextLeaf = child(s.stack[s.depth-1].role, string(s.key[:s.keyLen]))
	}
}

// endValue moves on after a value.
func (s *jsonScanner) endValue() {
	if s.depth == 0 {
		s.state = sEnd
		return
	}
	s.state = sAfter
}

// stringBytes takes plain bytes of a string value.
func (s *jsonScanner) stringBytes(b []byte) {
	switch s.leaf {
	case leafText:
		s.textChars = addSat(s.textChars, runes(b))
	case leafDelta:
		s.deltaChars = addSat(s.deltaChars, runes(b))
	case leafType:
		if s.typLen+len(b) > maxType {
			s.typBad = true
			return
		}
		s.typLen += copy(s.typ[s.typLen:], b)
	}
}

// escapedChar counts an escape sequence in a string value as one
// character (a surrogate pair counts two; close enough for an estimate).
func (s *jsonScanner) escapedChar() {
	switch s.leaf {
	case leafText:
		s.textChars = addSat(s.textChars, 1)
	case leafDelta:
		s.deltaChars = addSat(s.deltaChars, 1)
	case leafType:
		s.typBad = true // no event type needs an escape
	}
}

// runes counts the UTF-8 characters in b: the bytes that do not continue
// a multi-byte sequence.
func runes(b []byte) uint64 {
	var n uint64
	for _, c := range b {
		if c&0xC0 != 0x80 {
			n++
		}
	}
	return n
}

// numByte takes one byte of a number, or returns false at its end.
func (s *jsonScanner) numByte(c byte) bool {
	switch {
	case '0' <= c && c <= '9':
		d := uint64(c - '0')
		if s.numLen == 1 && s.num == 0 && !s.numBad {
			s.numBad = true // a leading zero
		}
		if s.num > (maxTokens-d)/10 {
			s.numBad = true
		} else {
			s.num = s.num*10 + d
		}
		s.numLen++
	case c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E':
		s.numBad = true // negative, fractional or with an exponent: no token count
		s.numLen++
	default:
		return false
	}
	return true
}

// endNumber ends a number; it goes to the usage object if it is one of
// its fields.
func (s *jsonScanner) endNumber() {
	if s.leaf < leafPrompt {
		return
	}
	if s.numBad || s.numLen == 0 {
		s.cur.bad = true
		return
	}
	s.cur.set(s.leaf, s.num)
}

// endLiteral: null in a usage field means absent; true or false is no
// count. A non-string type makes the event no text delta.
func (s *jsonScanner) endLiteral() {
	switch {
	case s.leaf >= leafPrompt && s.lit != 2:
		s.cur.bad = true
	case s.leaf == leafType:
		s.typSeen, s.typBad = true, true
	}
}
