package extauthz

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxCost is the largest estimate Check reserves: exact in a float64, as
// the Redis store counts, and what limit clamps a cost to anyway.
const maxCost = 1 << 53

// maxChoices bounds n, the completions asked for, so the estimate cannot
// overflow; it is far above what any API accepts.
const maxChoices = 1 << 16

// Body is what Check reads from a JSON request body in the OpenAI style:
// the fields its Endpoint's row of the table (endpoints) names.
type Body struct {
	// Endpoint is the API the body was read for.
	Endpoint Endpoint
	// Model is the body's model field (Settings.ModelBodyField). A body
	// that gives it twice, or in another case, is refused (keys.go): the
	// upstream's JSON parser may read another one than the first.
	Model string
	// MaxTokens is the largest of the output caps given (max_tokens,
	// max_completion_tokens, max_output_tokens: those the endpoint
	// reads); HasMaxTokens says whether any was given.
	MaxTokens    uint64
	HasMaxTokens bool
	// Choices is n, the completions asked for: at least 1. BestOf is
	// best_of, the completions generated to pick from (0 when not
	// given); the larger of the two is paid for.
	Choices uint64
	BestOf  uint64
	// PromptChars counts the characters of the text the model reads:
	// message and item content (a string, or the text of each part),
	// prompt, input and instructions strings, function-call arguments.
	// PromptTokens counts the token IDs of a prompt or input given as
	// IDs.
	PromptChars  uint64
	PromptTokens uint64
	// ToolChars counts the characters of tools: the JSON of their
	// definitions (tools, functions; see kindTools), and the names and
	// arguments of the calls in a conversation (chat's tool_calls and
	// function_call, the Responses API's function_call items).
	ToolChars uint64
	// Images counts image parts by their detail.
	Images [imageDetails]uint64
}

// ImageDetail is an image part's detail, which decides its cost.
type ImageDetail uint8

const (
	ImageLow ImageDetail = iota
	ImageHigh
	// ImageAuto is "auto", a detail the table does not know, or none:
	// the upstream may pick high.
	ImageAuto
	imageDetails
)

// bodyError is a body Check refuses; it says which answer it gets.
type bodyError struct {
	code  string // the OpenAI-style error code
	msg   string // for the client; never quotes the body
	param string // the field at fault, if one is
}

func (e *bodyError) Error() string { return e.msg }

var (
	errNotJSON   = &bodyError{code: "invalid_json", msg: "The request body is not valid JSON."}
	errNotObject = &bodyError{code: "invalid_json", msg: "The request body must be a JSON object."}
	errModel     = &bodyError{code: "invalid_model", msg: "The model field must be a string of printable characters."}
	errMaxTokens = &bodyError{code: "invalid_max_tokens", msg: "max_tokens and max_completion_tokens must be non-negative integers."}
	errChoices   = &bodyError{code: "invalid_n", msg: "n must be a non-negative integer."}
	errBestOf    = &bodyError{code: "invalid_best_of", msg: "best_of must be a non-negative integer."}
)

// maxSkipDepth is how deep a value the parser skips whole may nest:
// encoding/json's limit, which the parser's first version (a json.Decoder)
// applied there, kept so that the same bodies are refused.
const maxSkipDepth = 10000

// errTruncated is a body that ends inside a value: where a partial body
// was cut, or a broken complete one.
var errTruncated = errors.New("body ends inside a value")

// ParseBody reads the fields of an OpenAI-style body that Check needs
// (the model, and those endpoint ep's row of the table names), in
// one pass that builds nothing it does not keep: the work is linear in
// len(data), which the caller bounds, and it allocates the model and
// nothing else (but for a key or model with escapes, which it decodes).
// modelField names the body's model field ("" reads none). A partial body
// (Envoy buffered only its start) yields what its prefix holds; a
// complete one must be exactly one JSON object. An empty body yields a
// zero Body with Choices 1.
//
// It reads JSON as encoding/json does, strictly, with invalid UTF-8 in a
// string and an unpaired surrogate escape standing for U+FFFD;
// FuzzParseBodyReference holds it to the json.Decoder version it
// replaced.
func ParseBody(data []byte, modelField string, ep Endpoint, partial bool) (Body, error) {
	return parseBody(data, modelField, ep, partial)
}

// parseBody is ParseBody over Envoy's body string or raw_body bytes, so
// Check copies neither.
func parseBody[T string | []byte](data T, modelField string, ep Endpoint, partial bool) (Body, error) {
	if int(ep) >= len(endpoints) {
		ep = EndpointAny
	}
	b, err := parseRow(data, modelField, &endpoints[ep], partial)
	b.Endpoint = ep
	return b, err
}

// parseRow is parseBody reading the fields of row.
func parseRow[T string | []byte](data T, modelField string, row *endpoint, partial bool) (Body, error) {
	if !utf8.ValidString(modelField) {
		// No key decodes to it (a key's invalid UTF-8 is U+FFFD).
		modelField = ""
	}
	s := scanner[T]{data: data, modelField: modelField, row: row, body: Body{Choices: 1}}
	switch err := s.document(); {
	case err == nil, err == errTruncated && partial:
		return s.body, nil
	case err == errTruncated:
		return s.body, errNotJSON
	default:
		return s.body, err // a *bodyError
	}
}

// scanner reads one body left to right. A method that reads a value
// starts with s.i at its first byte (white space skipped, not at the end)
// and leaves s.i just past it. Errors are errTruncated or a *bodyError
// (errNotJSON for bad syntax).
type scanner[T string | []byte] struct {
	data       T
	i          int
	modelField string
	row        *endpoint
	body       Body
	// depth is how deep in a value skipped whole the current one is: a
	// member of an image_url object is one level into the value the
	// json.Decoder version skipped, and counts against the same limit.
	depth int
	// image is the image state of the part being read.
	image imagePart
	// seen is the read fields the object being read has named, a bit
	// each by their index (see keys.go).
	seen uint64
}

// imagePart is what a content part has said so far about being an image.
type imagePart struct {
	is     bool
	detail ImageDetail
}

func (s *scanner[T]) document() error {
	if _, err := s.next(); err != nil {
		return nil // nothing but white space
	}
	switch s.data[s.i] {
	case '{':
	case '[':
		return errNotObject
	default:
		if _, err := s.scalar(); err != nil {
			return err
		}
		return errNotObject
	}
	if err := s.object(s.member); err != nil {
		return err
	}
	// Exactly one value: trailing bytes mean the client and the upstream
	// may read different things.
	if _, err := s.next(); err == nil {
		return errNotJSON
	}
	return nil
}

// member reads a top-level member: the model (field 0) or a field of the
// row (field j+1 for row.fields[j]).
func (s *scanner[T]) member(k token) error {
	f := keySearch{hit: -1}
	if s.modelField == "" || !s.try(&f, k, 0, s.modelField) {
		for j := range s.row.fields {
			if s.try(&f, k, j+1, s.row.fields[j].name) {
				break
			}
		}
	}
	name := s.modelField
	if f.hit > 0 {
		name = s.row.fields[f.hit-1].name
	}
	switch i, err := s.found(&f, name); {
	case err != nil:
		return err
	case i == 0:
		return s.model()
	case i > 0:
		return s.read(s.row.fields[i-1].kind)
	}
	return s.skip(true)
}

// read reads a field of the table by its kind.
func (s *scanner[T]) read(kind fieldKind) error {
	switch kind {
	case kindOutput:
		return s.maxTokens()
	case kindChoices:
		return s.choices()
	case kindBestOf:
		return s.bestOf()
	case kindMessages:
		return s.messages()
	case kindPrompt:
		return s.prompt()
	case kindInput:
		return s.input()
	case kindText:
		return s.textOrItems()
	case kindTools:
		return s.tools()
	}
	return s.skip(true)
}

func (s *scanner[T]) model() error {
	if c := s.data[s.i]; c == '{' || c == '[' {
		return errModel
	}
	t, err := s.scalar()
	if err != nil {
		return err
	}
	switch t.kind {
	case tokenNull:
		s.body.Model = ""
		return nil
	case tokenString:
	default:
		return errModel
	}
	if !t.plain() {
		m := s.unquote(t)
		if !printable(m) {
			return errModel
		}
		s.body.Model = m
		return nil
	}
	raw := s.data[t.start:t.end]
	for i := range len(raw) {
		if raw[i] == 0x7f { // the other control characters cannot be raw in JSON
			return errModel
		}
	}
	s.body.Model = copyString(raw)
	return nil
}

// copyString is d as a string of its own: the model outlives the request
// (in the limiter's keys and maps), and a substring of Envoy's body string
// would keep all of it alive.
func copyString[T string | []byte](d T) string {
	if s, ok := any(d).(string); ok {
		return strings.Clone(s)
	}
	return string(d)
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

func (s *scanner[T]) maxTokens() error {
	v, set, err := s.count(errMaxTokens)
	if err != nil || !set {
		return err
	}
	s.body.MaxTokens = max(s.body.MaxTokens, v)
	s.body.HasMaxTokens = true
	return nil
}

func (s *scanner[T]) choices() error {
	v, set, err := s.count(errChoices)
	if err != nil || !set {
		return err
	}
	s.body.Choices = min(max(v, 1), maxChoices)
	return nil
}

func (s *scanner[T]) bestOf() error {
	v, set, err := s.count(errBestOf)
	if err != nil || !set {
		return err
	}
	s.body.BestOf = min(v, maxChoices)
	return nil
}

// count reads a non-negative integer or null (set is false), clamped to
// maxCost; anything else is bad.
func (s *scanner[T]) count(bad *bodyError) (v uint64, set bool, err error) {
	if c := s.data[s.i]; c == '{' || c == '[' {
		return 0, false, bad
	}
	t, err := s.scalar()
	switch {
	case err != nil:
		return 0, false, err
	case t.kind == tokenNull:
		return 0, false, nil
	case t.kind != tokenNumber:
		return 0, false, bad
	}
	num := s.data[t.start:t.end]
	if len(num) <= 15 && num[0] != '-' && digits(num) == len(num) {
		for i := range len(num) {
			v = v*10 + uint64(num[i]-'0')
		}
		return min(v, maxCost), true, nil
	}
	if u, err := strconv.ParseUint(string(num), 10, 64); err == nil {
		return min(u, maxCost), true, nil
	}
	// 100.0 and 1e3 are whole numbers too.
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false, bad
	}
	if f < 0 || f != math.Trunc(f) {
		return 0, false, bad
	}
	return uint64(min(f, maxCost)), true, nil
}
