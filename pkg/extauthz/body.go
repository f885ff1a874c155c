package extauthz

import (
	"encoding/json"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
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
	s.i++ // '{'
	c, err := s.next()
	if err != nil {
		return err
	}
	if c == '}' {
		s.i++
		return nil
	}
	for {
		k, err := s.key()
		if err != nil {
			return err
		}
		if err := member(k); err != nil {
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
		case '}':
			s.i++
			return nil
		default:
			return errNotJSON
		}
	}
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

// array reads an array, calling item at each element.
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

func (s *scanner[T]) array(item func() error) error {
	s.i++ // '['
	c, err := s.next()
	if err != nil {
		return err
	}
	if c == ']' {
		s.i++
		return nil
	}
	for {
		if err := item(); err != nil {
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
		case ']':
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

// digits is the length of the run of ASCII digits d starts with.
func digits[T string | []byte](d T) int {
	i := 0
	for i < len(d) && '0' <= d[i] && d[i] <= '9' {
		i++
	}
	return i
}

// messages counts the content of each item of a chat's messages.
func (s *scanner[T]) messages() error {
	if s.data[s.i] != '[' {
		return s.skip(false)
	}
	return s.array(s.message)
}

func (s *scanner[T]) message() error {
	if s.data[s.i] != '{' {
		return s.skip(false)
	}
	return s.object(s.messageMember)
}

func (s *scanner[T]) messageMember(k token) error {
	name, err := s.field(k, messageKeys)
	switch {
	case err != nil:
		return err
	case name == "content":
		return s.content()
	case name == "tool_calls", name == "function_call":
		return s.toolCalls()
	}
	return s.skip(true)
}

// The tool walkers below read values the json.Decoder version skipped
// whole; each level they enter counts in s.depth, so that what they skip
// is refused past the same depth.

// tools counts tool definitions: a list of objects.
func (s *scanner[T]) tools() error {
	if s.data[s.i] != '[' {
		return s.jsonText()
	}
	return s.inArray(s.tool)
}

func (s *scanner[T]) tool() error {
	if s.data[s.i] != '{' {
		return s.jsonText()
	}
	return s.inObject(s.toolMember)
}

// toolMember counts a tool's member; a chat tool's function object's
// members count as the tool's own (one level: no recursion a body could
// deepen).
func (s *scanner[T]) toolMember(k token) error {
	name, err := s.field(k, toolKeys)
	if err != nil {
		return err
	}
	if name == "function" && s.data[s.i] == '{' {
		return s.inObject(s.toolField)
	}
	return s.toolField(k)
}

// toolField counts a member as its JSON text: the key in quotes, the
// colon, the value.
func (s *scanner[T]) toolField(k token) error {
	s.body.ToolChars += uint64(k.end-k.start) + 3
	return s.jsonText()
}

// jsonText counts every byte of a value as a character.
func (s *scanner[T]) jsonText() error {
	start := s.i
	err := s.skip(true)
	s.body.ToolChars += uint64(s.i - start)
	return err
}

// toolCalls counts the calls of a chat message: tool_calls, a list of
// {function: {name, arguments}}, or function_call, one {name, arguments}.
func (s *scanner[T]) toolCalls() error {
	if s.data[s.i] != '[' {
		return s.toolCall()
	}
	return s.inArray(s.toolCall)
}

func (s *scanner[T]) toolCall() error {
	if s.data[s.i] != '{' {
		return s.skip(true)
	}
	return s.inObject(s.toolCallMember)
}

func (s *scanner[T]) toolCallMember(k token) error {
	name, err := s.field(k, toolCallKeys)
	switch {
	case err != nil:
		return err
	case name == "function" && s.data[s.i] == '{':
		return s.inObject(s.callMember)
	}
	return s.callField(name)
}

// callMember counts a call's name and arguments, what the model wrote.
func (s *scanner[T]) callMember(k token) error {
	name, err := s.field(k, callKeys)
	if err != nil {
		return err
	}
	return s.callField(name)
}

// callField reads a call's member that field named ("" for none).
func (s *scanner[T]) callField(name string) error {
	if name == "name" || name == "arguments" {
		return s.toolText()
	}
	return s.skip(true)
}

// toolText counts a string value's characters as a tool's, and skips any
// other value.
func (s *scanner[T]) toolText() error {
	if s.data[s.i] != '"' {
		return s.skip(true)
	}
	return s.charsTo(&s.body.ToolChars)
}

// content counts a message's content: a string, or a list of parts whose
// text is counted.
func (s *scanner[T]) content() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.part)
	}
	return s.skip(false)
}

func (s *scanner[T]) part() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '{':
		return s.imageObject(s.partMember)
	}
	return s.skip(false)
}

// imageObject reads an object that may be an image part, and counts it
// if it is one.
func (s *scanner[T]) imageObject(member func(token) error) error {
	outer := s.image
	s.image = imagePart{detail: ImageAuto}
	err := s.object(member)
	if s.image.is {
		s.body.Images[s.image.detail]++
	}
	s.image = outer
	return err
}

// partMember reads a member of a content part: its text, or what makes
// it an image (chat's image_url object, the Responses API's input_image
// type, image_url string and detail).
func (s *scanner[T]) partMember(k token) error {
	name, err := s.field(k, partKeys)
	if err != nil {
		return err
	}
	return s.partField(name)
}

// partField reads a content part's member that field named ("" for
// none).
func (s *scanner[T]) partField(name string) error {
	switch name {
	case "text":
		return s.text()
	case "type":
		return s.partType()
	case "image_url":
		s.image.is = true
		if s.data[s.i] == '{' {
			return s.inObject(s.imageURLMember)
		}
	case "detail":
		return s.detail()
	}
	return s.skip(true)
}

func (s *scanner[T]) imageURLMember(k token) error {
	name, err := s.field(k, imageURLKeys)
	switch {
	case err != nil:
		return err
	case name == "detail":
		return s.detail()
	}
	return s.skip(true)
}

// partType marks a part whose type is an image's.
func (s *scanner[T]) partType() error {
	if s.data[s.i] != '"' {
		return s.skip(true)
	}
	t, err := s.str()
	if err == nil && (s.is(t, "image_url") || s.is(t, "input_image")) {
		s.image.is = true
	}
	return err
}

// detail reads an image's detail.
func (s *scanner[T]) detail() error {
	if s.data[s.i] != '"' {
		return s.skip(true)
	}
	t, err := s.str()
	switch {
	case err != nil:
	case s.is(t, "low"):
		s.image.detail = ImageLow
	case s.is(t, "high"):
		s.image.detail = ImageHigh
	default:
		s.image.detail = ImageAuto
	}
	return err
}

// input counts a Responses or embeddings input: a string, a list of
// strings, token IDs (a list, or a list of lists), or items.
func (s *scanner[T]) input() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.inputItem)
	}
	return s.skip(false)
}

func (s *scanner[T]) inputItem() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.tokenID)
	case '{':
		return s.imageObject(s.itemMember)
	}
	return s.tokenID()
}

// itemMember reads a member of a Responses input item: a message's
// content, a function call's name and arguments or its output, a
// reasoning summary; or, for an item that is itself a part, what
// partMember reads.
func (s *scanner[T]) itemMember(k token) error {
	name, err := s.field(k, itemKeys)
	switch {
	case err != nil:
		return err
	case name == "content", name == "output", name == "summary":
		return s.content()
	case name == "arguments", name == "name":
		return s.toolText()
	}
	return s.partField(name)
}

// textOrItems counts a string, or a list of input items (instructions
// may be either).
func (s *scanner[T]) textOrItems() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.inputItem)
	}
	return s.skip(false)
}

// text counts a string value and skips any other.
func (s *scanner[T]) text() error {
	if s.data[s.i] == '"' {
		return s.chars()
	}
	return s.skip(false)
}

// prompt counts a completions prompt: a string, a list of strings, a list
// of token IDs, or a list of lists of token IDs.
func (s *scanner[T]) prompt() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.promptItem)
	}
	return s.skip(false)
}

func (s *scanner[T]) promptItem() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.tokenID)
	}
	return s.tokenID()
}

// tokenID counts a number and skips any other value.
func (s *scanner[T]) tokenID() error {
	if c := s.data[s.i]; c == '{' || c == '[' {
		return s.skip(false)
	}
	t, err := s.scalar()
	if err == nil && t.kind == tokenNumber {
		s.body.PromptTokens++
	}
	return err
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
		// takes two, too.
		n++
		if d[j+1] != 'u' {
			i = j + 2
			continue
		}
		i = j + 6
		if r := hex4(d[j+2:]); utf16.IsSurrogate(r) && i+6 <= t.end && d[i] == '\\' && d[i+1] == 'u' &&
			utf16.DecodeRune(r, hex4(d[i+2:])) != utf8.RuneError {
			i += 6
		}
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

// estimate is a request's token cost: its prompt at charsPerToken
// characters a token, plus the completions it may generate. A partial
// body counts every byte of the whole body (bodyBytes: its size, or the
// fewest bytes it can have when that is unknown) as a prompt character,
// which can only overestimate the prompt.
// It also returns the prompt's part of the total (the rest is the
// completions' allowance), which a stream that ends without a usage
// report is settled from.
//
// Images cost Settings.ImageTokens by their detail; an endpoint that
// generates nothing (embeddings) has no completions, and an unknown path
// at least the default.
func estimate(b *Body, s *Settings, partial bool, bodyBytes int64) (total, promptPart uint64) {
	// Both counts are at most the body's length: no overflow.
	chars := b.PromptChars + b.ToolChars
	if partial {
		chars = max(chars, uint64(max(bodyBytes, 0)))
	}
	prompt := math.Ceil(float64(chars) / s.CharsPerToken)
	for d, n := range b.Images {
		prompt += float64(n) * float64(s.ImageTokens[d])
	}
	completion := s.DefaultMaxTokens
	switch {
	case int(b.Endpoint) < len(endpoints) && endpoints[b.Endpoint].noOutput:
		completion = 0
	case b.Endpoint == EndpointAny:
		// A cap is read from every row's fields, and a row that does not
		// have the field given would take the default: at least that.
		completion = max(completion, b.MaxTokens)
	case b.HasMaxTokens:
		completion = b.MaxTokens
	}
	in := prompt + float64(b.PromptTokens)
	all := in + float64(completion)*float64(max(b.Choices, b.BestOf, 1))
	if all >= maxCost {
		return maxCost, uint64(min(in, maxCost))
	}
	return uint64(all), uint64(in)
}
