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

// refParseBody is ParseBody as it was written first, over encoding/json's
// streaming decoder: the reference FuzzParseBodyReference holds the
// single-pass scanner to. It is kept as written, only renamed.
func refParseBody(data []byte, modelField string, partial bool) (Body, error) {
	return refParse(bytes.NewReader(data), modelField, partial)
}

// refParse is refParseBody over a reader.
func refParse(r io.Reader, modelField string, partial bool) (Body, error) {
	b := Body{Choices: 1}
	p := refParser{dec: json.NewDecoder(r), body: &b, modelField: modelField}
	p.dec.UseNumber()
	err := p.object()
	if errors.Is(err, errRefEmpty) {
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
		if partial && refTruncated(err) {
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
func refTruncated(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

type refParser struct {
	dec        *json.Decoder
	body       *Body
	modelField string
}

// errRefEmpty is a body with nothing but white space.
var errRefEmpty = errors.New("empty body")

func (p *refParser) object() error {
	t, err := p.dec.Token()
	if errors.Is(err, io.EOF) {
		return errRefEmpty
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
func (p *refParser) end(d json.Delim) error {
	t, err := p.dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return errNotJSON
	}
	return nil
}

func (p *refParser) skip() error {
	var v json.RawMessage
	return p.dec.Decode(&v)
}

func (p *refParser) model() error {
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

func (p *refParser) maxTokens() error {
	v, set, err := p.count(errMaxTokens)
	if err != nil || !set {
		return err
	}
	p.body.MaxTokens = max(p.body.MaxTokens, v)
	p.body.HasMaxTokens = true
	return nil
}

func (p *refParser) choices() error {
	v, set, err := p.count(errChoices)
	if err != nil || !set {
		return err
	}
	p.body.Choices = min(max(v, 1), maxChoices)
	return nil
}

// count reads a non-negative integer or null (set is false), clamped to
// maxCost; anything else is bad.
func (p *refParser) count(bad *bodyError) (v uint64, set bool, err error) {
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

func (p *refParser) messages() error {
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
func (p *refParser) message() error {
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
func (p *refParser) members(name string, read func() error) error {
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
func (p *refParser) content() error {
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

func (p *refParser) part() error {
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
func (p *refParser) text() error {
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
func (p *refParser) prompt() error {
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
func (p *refParser) rest(t json.Token) error {
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

func (p *refParser) chars(s string) {
	p.body.PromptChars += uint64(utf8.RuneCountInString(s))
}
