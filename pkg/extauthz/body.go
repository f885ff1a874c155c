package extauthz

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// maxCost is the largest estimate Check reserves: exact in a float64, as
// the Redis store counts, and what limit clamps a cost to anyway.
const maxCost = 1 << 53

// maxChoices bounds n, the completions asked for, so the estimate cannot
// overflow; it is far above what any API accepts.
const maxChoices = 1 << 16

// Body is what Check reads from a JSON request body in the OpenAI style
// (chat completions, completions, and anything with the same fields).
type Body struct {
	// Model is the body's model field (Settings.ModelBodyField); the last
	// one wins, as the upstream's JSON parser decides.
	Model string
	// MaxTokens is the larger of max_tokens and max_completion_tokens;
	// HasMaxTokens says whether either was given.
	MaxTokens    uint64
	HasMaxTokens bool
	// Choices is n, the completions asked for: at least 1.
	Choices uint64
	// PromptChars counts the characters of every messages[*].content (a
	// string, or the text of each part) and of prompt (a string or a
	// list of strings). PromptTokens counts the token IDs of a prompt
	// given as IDs.
	PromptChars  uint64
	PromptTokens uint64
}

// bodyError is a body Check refuses; it says which answer it gets.
type bodyError struct {
	code string // the OpenAI-style error code
	msg  string // for the client; never quotes the body
}

func (e *bodyError) Error() string { return e.msg }

var (
	errNotJSON   = &bodyError{code: "invalid_json", msg: "The request body is not valid JSON."}
	errNotObject = &bodyError{code: "invalid_json", msg: "The request body must be a JSON object."}
	errModel     = &bodyError{code: "invalid_model", msg: "The model field must be a string of printable characters."}
	errMaxTokens = &bodyError{code: "invalid_max_tokens", msg: "max_tokens and max_completion_tokens must be non-negative integers."}
	errChoices   = &bodyError{code: "invalid_n", msg: "n must be a non-negative integer."}
)

// ParseBody reads the fields of an OpenAI-style body that Check needs,
// with encoding/json's streaming decoder: the work and memory are linear
// in len(data), which the caller bounds. modelField names the body's model
// field ("" reads none). A partial body (Envoy buffered only its start)
// yields what its prefix holds; a complete one must be exactly one JSON
// object. An empty body yields a zero Body with Choices 1.
func ParseBody(data []byte, modelField string, partial bool) (Body, error) {
	return parseBody(bytes.NewReader(data), modelField, partial)
}

// parseBody is ParseBody over a reader, so Check reads Envoy's body string
// and raw_body bytes alike without copying either.
func parseBody(r io.Reader, modelField string, partial bool) (Body, error) {
	b := Body{Choices: 1}
	p := bodyParser{dec: json.NewDecoder(r), body: &b, modelField: modelField}
	p.dec.UseNumber()
	err := p.object()
	if errors.Is(err, errEmpty) {
		return b, nil
	}
	if err == nil {
		// Exactly one value: trailing bytes mean the client and the
		// upstream may read different things.
		if _, e := p.dec.Token(); !errors.Is(e, io.EOF) {
			err = errNotJSON
		}
	}
	if err != nil {
		if partial && truncated(err) {
			return b, nil
		}
		var be *bodyError
		if errors.As(err, &be) {
			return b, be
		}
		return b, errNotJSON
	}
	return b, nil
}

// truncated says whether err is where a cut-off body ends.
func truncated(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

type bodyParser struct {
	dec        *json.Decoder
	body       *Body
	modelField string
}

// errEmpty is a body with nothing but white space.
var errEmpty = errors.New("empty body")

func (p *bodyParser) object() error {
	t, err := p.dec.Token()
	if errors.Is(err, io.EOF) {
		return errEmpty
	}
	if err != nil {
		return err
	}
	if t != json.Delim('{') {
		return errNotObject
	}
	for p.dec.More() {
		kt, err := p.dec.Token()
		if err != nil {
			return err
		}
		key, _ := kt.(string)
		switch {
		case p.modelField != "" && key == p.modelField:
			err = p.model()
		case key == "max_tokens" || key == "max_completion_tokens":
			err = p.maxTokens()
		case key == "n":
			err = p.choices()
		case key == "messages":
			err = p.messages()
		case key == "prompt":
			err = p.prompt()
		default:
			err = p.skip()
		}
		if err != nil {
			return err
		}
	}
	return p.end('}')
}

// end reads the closing delimiter d.
func (p *bodyParser) end(d json.Delim) error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return errNotJSON
	}
	return nil
}

func (p *bodyParser) skip() error {
	var v json.RawMessage
	return p.dec.Decode(&v)
}

func (p *bodyParser) model() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	switch v := t.(type) {
	case nil:
		p.body.Model = ""
	case string:
		if !printable(v) {
			return errModel
		}
		p.body.Model = v
	default:
		return errModel
	}
	return nil
}

// printable says whether s can go in a header value and a descriptor:
// UTF-8 with no control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

func (p *bodyParser) maxTokens() error {
	v, set, err := p.count(errMaxTokens)
	if err != nil || !set {
		return err
	}
	p.body.MaxTokens = max(p.body.MaxTokens, v)
	p.body.HasMaxTokens = true
	return nil
}

func (p *bodyParser) choices() error {
	v, set, err := p.count(errChoices)
	if err != nil || !set {
		return err
	}
	p.body.Choices = min(max(v, 1), maxChoices)
	return nil
}

// count reads a non-negative integer or null (set is false), clamped to
// maxCost; anything else is bad.
func (p *bodyParser) count(bad *bodyError) (v uint64, set bool, err error) {
	t, err := p.dec.Token()
	if err != nil {
		return 0, false, err
	}
	switch n := t.(type) {
	case nil:
		return 0, false, nil
	case json.Number:
		if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
			return min(u, maxCost), true, nil
		}
		// 100.0 and 1e3 are whole numbers too.
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, false, bad
		}
		if f < 0 || f != math.Trunc(f) {
			return 0, false, bad
		}
		return uint64(min(f, maxCost)), true, nil
	}
	return 0, false, bad
}

func (p *bodyParser) messages() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if t == nil {
		return nil
	}
	if t != json.Delim('[') {
		return p.rest(t)
	}
	for p.dec.More() {
		if err := p.message(); err != nil {
			return err
		}
	}
	return p.end(']')
}

// message reads one messages item and counts its content.
func (p *bodyParser) message() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if t != json.Delim('{') {
		return p.rest(t)
	}
	return p.members("content", p.content)
}

// members reads the rest of an object whose '{' was read, handing the
// value of member name to read and skipping every other value.
func (p *bodyParser) members(name string, read func() error) error {
	for p.dec.More() {
		kt, err := p.dec.Token()
		if err != nil {
			return err
		}
		if kt == name {
			err = read()
		} else {
			err = p.skip()
		}
		if err != nil {
			return err
		}
	}
	return p.end('}')
}

// content counts a message's content: a string, or a list of parts whose
// text is counted.
func (p *bodyParser) content() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if s, ok := t.(string); ok {
		p.chars(s)
		return nil
	}
	if t != json.Delim('[') {
		return p.rest(t)
	}
	for p.dec.More() {
		if err := p.part(); err != nil {
			return err
		}
	}
	return p.end(']')
}

func (p *bodyParser) part() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if s, ok := t.(string); ok {
		p.chars(s)
		return nil
	}
	if t != json.Delim('{') {
		return p.rest(t)
	}
	return p.members("text", p.text)
}

// text counts a string value and skips any other.
func (p *bodyParser) text() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if s, ok := t.(string); ok {
		p.chars(s)
		return nil
	}
	return p.rest(t)
}

// prompt counts a completions prompt: a string, a list of strings, a list
// of token IDs, or a list of lists of token IDs.
func (p *bodyParser) prompt() error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if s, ok := t.(string); ok {
		p.chars(s)
		return nil
	}
	if t != json.Delim('[') {
		return p.rest(t)
	}
	for p.dec.More() {
		t, err := p.dec.Token()
		if err != nil {
			return err
		}
		switch v := t.(type) {
		case string:
			p.chars(v)
		case json.Number:
			p.body.PromptTokens++
		case json.Delim:
			if v != '[' {
				if err := p.rest(t); err != nil {
					return err
				}
				continue
			}
			for p.dec.More() {
				t, err := p.dec.Token()
				if err != nil {
					return err
				}
				if _, ok := t.(json.Number); ok {
					p.body.PromptTokens++
					continue
				}
				if err := p.rest(t); err != nil {
					return err
				}
			}
			if err := p.end(']'); err != nil {
				return err
			}
		}
	}
	return p.end(']')
}

// rest skips the remainder of a value whose first token t was read: all
// of an object or array that t opens, nothing for a scalar.
func (p *bodyParser) rest(t json.Token) error {
	d, ok := t.(json.Delim)
	if !ok {
		return nil
	}
	if d != '{' && d != '[' {
		return errNotJSON
	}
	for depth := 1; depth > 0; {
		t, err := p.dec.Token()
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}

func (p *bodyParser) chars(s string) {
	p.body.PromptChars += uint64(utf8.RuneCountInString(s))
}

// estimate is a request's token cost: its prompt at charsPerToken
// characters a token, plus the completions it may generate. A partial
// body counts every byte of the whole body (size, when Envoy knows it) as
// a prompt character, which can only overestimate.
func estimate(b *Body, s *Settings, partial bool, bodyBytes int64) uint64 {
	chars := b.PromptChars
	if partial {
		chars = max(chars, uint64(max(bodyBytes, 0)))
	}
	prompt := math.Ceil(float64(chars) / s.CharsPerToken)
	completion := s.DefaultMaxTokens
	if b.HasMaxTokens {
		completion = b.MaxTokens
	}
	total := prompt + float64(b.PromptTokens) + float64(completion)*float64(max(b.Choices, 1))
	if total >= maxCost {
		return maxCost
	}
	return uint64(total)
}
