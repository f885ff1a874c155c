package extauthz

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseBodyKeys: a body that names a field Tollgate reads twice, or in
// a case encoding/json folds to it, is refused, at every level the
// parser reads; keys of fields it does not read may be anything.
func TestParseBodyKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      string
		ep        Endpoint
		want      Body   // when accepted
		wantParam string // the refused field, "" when accepted
	}{
		{name: "a case-variant model", give: `{"Model":"big"}`, wantParam: "model"},
		{name: "an upper-case model", give: `{"MODEL":"big"}`, wantParam: "model"},
		{name: "model then MODEL", give: `{"model":"cheap","MODEL":"big"}`, wantParam: "model"},
		{name: "MODEL then model", give: `{"MODEL":"big","model":"cheap"}`, wantParam: "model"},
		{name: "model twice", give: `{"model":"cheap","model":"big"}`, wantParam: "model"},
		{name: "model twice, one escaped", give: `{"model":"cheap","mod\u0065l":"big"}`, wantParam: "model"},
		{name: "an escaped case variant", give: `{"mod\u0045l":"big"}`, wantParam: "model"},
		{name: "MAX_TOKENS", give: `{"max_tokens":1,"MAX_TOKENS":30000}`, ep: EndpointChat, wantParam: "max_tokens"},
		{name: "MAX_TOKENS alone", give: `{"MAX_TOKENS":30000}`, ep: EndpointChat, wantParam: "max_tokens"},
		{name: "a long s folds to s", give: `{"max_tokenſ":30000}`, ep: EndpointChat, wantParam: "max_tokens"},
		{name: "an escaped long s", give: `{"max_token\u017f":30000}`, ep: EndpointChat, wantParam: "max_tokens"},
		{name: "a Kelvin sign folds to k", give: `{"max_to\u212aens":30000}`, ep: EndpointChat, wantParam: "max_tokens"},
		{name: "max_output_tokens", give: `{"Max_Output_Tokens":9}`, ep: EndpointResponses, wantParam: "max_output_tokens"},
		{name: "n", give: `{"N":128}`, ep: EndpointChat, wantParam: "n"},
		{name: "best_of", give: `{"best_of":1,"best_of":20}`, ep: EndpointCompletions, wantParam: "best_of"},
		{name: "messages", give: `{"messages":[],"Messages":[{"content":"xxxx"}]}`, ep: EndpointChat, wantParam: "messages"},
		{name: "input", give: `{"input":"a","INPUT":"bbbb"}`, ep: EndpointResponses, wantParam: "input"},
		{name: "instructions", give: `{"Instructions":"bbbb"}`, ep: EndpointResponses, wantParam: "instructions"},
		{name: "prompt", give: `{"prompt":"a","Prompt":"bbbb"}`, ep: EndpointCompletions, wantParam: "prompt"},
		{name: "tools", give: `{"Tools":[{"name":"f"}]}`, ep: EndpointResponses, wantParam: "tools"},
		{name: "functions", give: `{"functions":[],"FUNCTIONS":[]}`, ep: EndpointChat, wantParam: "functions"},
		{name: "any path reads every row's fields", give: `{"Input":"bbbb"}`, wantParam: "input"},
		{name: "a message's content", give: `{"messages":[{"content":"a","Content":"bbbb"}]}`, ep: EndpointChat, wantParam: "content"},
		{name: "a message's tool_calls", give: `{"messages":[{"tool_calls":[],"TOOL_CALLS":[]}]}`, ep: EndpointChat, wantParam: "tool_calls"},
		{name: "a part's text", give: `{"messages":[{"content":[{"text":"a","TEXT":"bbbb"}]}]}`, ep: EndpointChat, wantParam: "text"},
		{name: "a part's type", give: `{"messages":[{"content":[{"type":"text","Type":"image_url"}]}]}`, ep: EndpointChat, wantParam: "type"},
		{name: "an image's detail", give: `{"messages":[{"content":[{"image_url":{"detail":"low","Detail":"high"}}]}]}`, ep: EndpointChat, wantParam: "detail"},
		{name: "a tool's function", give: `{"tools":[{"function":{},"Function":{}}]}`, ep: EndpointChat, wantParam: "function"},
		{name: "a call's arguments", give: `{"messages":[{"tool_calls":[{"function":{"arguments":"","Arguments":"{}"}}]}]}`, ep: EndpointChat, wantParam: "arguments"},
		{name: "an item's content", give: `{"input":[{"content":"a","conTent":"bbbb"}]}`, ep: EndpointResponses, wantParam: "content"},
		{name: "an item's part field", give: `{"input":[{"text":"a","text":"bbbb"}]}`, ep: EndpointResponses, wantParam: "text"},
		{name: "a partial body is refused by its prefix", give: `{"model":"a","MODEL":"b","messages":[{"con`, wantParam: "model"},
		{
			name: "an escaped key is the field",
			give: `{"mod\u0065l":"m","\u006dax_tokens":3,"messages":[{"\u0063ontent":"ab"}]}`, ep: EndpointChat,
			want: Body{Endpoint: EndpointChat, Model: "m", MaxTokens: 3, HasMaxTokens: true, Choices: 1, PromptChars: 2},
		},
		{
			name: "the same name in different objects",
			give: `{"model":"m","messages":[{"content":"ab"},{"content":"cd"}],"metadata":{"model":"x","MODEL":"y"}}`, ep: EndpointChat,
			want: Body{Endpoint: EndpointChat, Model: "m", Choices: 1, PromptChars: 4},
		},
		{
			name: "fields the endpoint does not read may be anything",
			give: `{"model":"m","Input":"x","input":"y","Stream":true,"stream":false,"messages":[{"Role":"a","role":"b"}]}`, ep: EndpointChat,
			want: Body{Endpoint: EndpointChat, Model: "m", Choices: 1},
		},
		{
			name: "keys that fold to no field",
			give: `{"model":"m","model_":"x","mode":"y","modèl":"z","max_tokens_":5}`, ep: EndpointChat,
			want: Body{Endpoint: EndpointChat, Model: "m", Choices: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseBody([]byte(tt.give), "model", tt.ep, true)
			if tt.wantParam != "" {
				var be *bodyError
				if !errors.As(err, &be) || be.code != "ambiguous_key" || be.param != tt.wantParam {
					t.Fatalf("ParseBody(%s) = %+v, %v; want refused for %q", tt.give, got, err, tt.wantParam)
				}
				if !ambiguousIn([]byte(tt.give), tt.wantParam) {
					t.Errorf("the test's own check finds no ambiguous %q in %s", tt.wantParam, tt.give)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseBody(%s): %v", tt.give, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseBody(%s) (-want +got):\n%s", tt.give, diff)
			}
		})
	}
}

// TestParseBodyModelFieldKeys: the configured model field is matched as
// the others are, and one that is not UTF-8 names no key.
func TestParseBodyModelFieldKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      string
		field     string
		wantModel string
		wantParam string
	}{
		{name: "another field", give: `{"model":"a","engine":"b"}`, field: "engine", wantModel: "b"},
		{name: "its case variant", give: `{"model":"a","Engine":"b"}`, field: "engine", wantParam: "engine"},
		{name: "a non-ASCII field", give: `{"modèl":"b"}`, field: "modèl", wantModel: "b"},
		{name: "a non-ASCII field's case variant", give: `{"MODÈL":"b"}`, field: "modèl", wantParam: "modèl"},
		{name: "a field that is not UTF-8", give: "{\"m\xff\":\"b\"}", field: "m\xff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseBody([]byte(tt.give), tt.field, EndpointAny, false)
			var be *bodyError
			switch {
			case tt.wantParam != "" && (!errors.As(err, &be) || be.param != tt.wantParam):
				t.Errorf("ParseBody = %+v, %v; want refused for %q", got, err, tt.wantParam)
			case tt.wantParam == "" && (err != nil || got.Model != tt.wantModel):
				t.Errorf("ParseBody = %+v, %v; want model %q", got, err, tt.wantModel)
			}
		})
	}
}

// TestKeyRune: keys decode as encoding/json decodes them.
func TestKeyRune(t *testing.T) {
	t.Parallel()
	for _, key := range []string{
		`a`, `\u0041`, `\n\t\r\b\f\/\\\"`, `\ud83d\ude00`, `\ud83d`, `\ud83d\u0041`, `\ude00\ud83d`, `\ud800\ud800\udc00`,
		"é", "\xff", "\xed\xa0\x80", "\xe2\x82", "ſ\u212a", `\u017f\u212A`, `x\u0000y`,
	} {
		var want string
		if err := json.Unmarshal([]byte(`"`+key+`"`), &want); err != nil {
			t.Fatalf("json.Unmarshal(%q): %v", key, err)
		}
		var got []rune
		for i := 0; i < len(key); {
			r, n := keyRune(key, i)
			got, i = append(got, r), i+n
		}
		if string(got) != want {
			t.Errorf("keyRune decodes %q to %q, encoding/json to %q", key, string(got), want)
		}
	}
}

// ambiguousIn is the tests' own check, over encoding/json's tokens, that
// some object of body (as far as it is valid JSON) has a key equal to
// field under bytes.EqualFold (encoding/json's key match) that is not
// field exactly, or two keys that are: what a refusal for field needs.
func ambiguousIn(body []byte, field string) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	// For each open value: is it an object, is the next token a key, and
	// how many keys for field has it had.
	type open struct {
		object, atKey bool
		keys          int
	}
	var stack []open
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].atKey && tok != json.Delim('}') {
			top := &stack[n-1]
			top.atKey = false
			if k := tok.(string); strings.EqualFold(k, field) {
				top.keys++
				if k != field || top.keys > 1 {
					return true
				}
			}
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, open{object: true, atKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, open{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: in an object, a key is next.
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].atKey = true
		}
	}
}

// keyVariantBodies use every field the parser reads, at every level.
var keyVariantBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"u","detail":"low"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}],"function_call":{"name":"g","arguments":"xy"}}],` +
		`"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"functions":[{"name":"h"}],"max_tokens":7,"max_completion_tokens":9,"n":2}`,
	`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"abc"},{"type":"input_image","image_url":"u","detail":"high"}]},` +
		`{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":"ok"},{"type":"reasoning","summary":[{"text":"s"}]}],` +
		`"instructions":"be brief","tools":[{"type":"function","name":"f"}],"max_output_tokens":9}`,
	`{"model":"m","prompt":["ab",[1,2]],"suffix":"s","max_tokens":5,"n":2,"best_of":3}`,
	`{"model":"m","instructions":[{"content":[{"text":"é"}]}],"input":"abcd"}`,
}

// TestParseBodyKeyVariants: in bodies that use every field the parser
// reads, each key in turn written with an escape reads the same, and in
// another case (or with a rune that folds to one of its letters) is
// refused for that field or, where the parser does not read it, reads the
// same: no key's case can change what a body is charged.
func TestParseBodyKeyVariants(t *testing.T) {
	t.Parallel()
	names := map[string]bool{"model": true}
	for _, list := range [][]string{messageKeys, partKeys, itemKeys, imageURLKeys, toolKeys, toolCallKeys, callKeys} {
		for _, n := range list {
			names[n] = true
		}
	}
	for _, row := range endpoints {
		for _, f := range row.fields {
			names[f.name] = true
		}
	}
	for _, body := range keyVariantBodies {
		for _, ep := range []Endpoint{EndpointAny, EndpointChat, EndpointCompletions, EndpointResponses, EndpointEmbeddings} {
			want := mustParseAt(t, body, ep)
			for name := range names {
				key := `"` + name + `":`
				for at := strings.Index(body, key); at >= 0; at = nextIndex(body, key, at) {
					variant := func(k string) string { return body[:at+1] + k + body[at+1+len(name):] }
					escaped := variant(`\u` + fmt.Sprintf("%04x", name[0]) + name[1:])
					if got := mustParseAt(t, escaped, ep); !sameButTools(got, want) {
						t.Errorf("ParseBody(%s, %d) = %+v; with the key plain, %+v", escaped, ep, got, want)
					}
					for _, k := range []string{strings.ToUpper(name), strings.ReplaceAll(name, "s", "ſ"), strings.ReplaceAll(name, "k", "\u212a")} {
						if k == name {
							continue
						}
						v := variant(k)
						got, err := ParseBody([]byte(v), "model", ep, false)
						var be *bodyError
						switch {
						case errors.As(err, &be) && be.code == "ambiguous_key" && be.param == name:
						case err != nil:
							t.Errorf("ParseBody(%s, %d): %v; want refused for %q or read as before", v, ep, err, name)
						// Upper case keeps a key's length, and so the JSON
						// text tools count; other runes lengthen it.
						case got != want && (k == strings.ToUpper(name) || !sameButTools(got, want)):
							t.Errorf("ParseBody(%s, %d) = %+v, not refused; with the key %q, %+v", v, ep, got, name, want)
						}
					}
				}
			}
		}
	}
}

func nextIndex(s, sub string, after int) int {
	if i := strings.Index(s[after+1:], sub); i >= 0 {
		return after + 1 + i
	}
	return -1
}

func mustParseAt(tb testing.TB, body string, ep Endpoint) Body {
	tb.Helper()
	b, err := ParseBody([]byte(body), "model", ep, false)
	if err != nil {
		tb.Fatalf("ParseBody(%s, %d): %v", body, ep, err)
	}
	return b
}

// sameButTools compares bodies but for ToolChars: tools count as their
// JSON text, which a key's escape or runes lengthen.
func sameButTools(a, b Body) bool {
	a.ToolChars, b.ToolChars = 0, 0
	return a == b
}
