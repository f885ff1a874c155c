package extauthz

import (
	"fmt"
	"strings"
	"testing"
)

// referenceSeeds are bodies where the scanner and the json.Decoder
// version could part ways: every kind of value in every place the parser
// looks, escapes, unicode, bad syntax, and nesting.
var referenceSeeds = []string{
	``, ` `, `{}`, ` {} `, `{}{}`, `{} x`, `{}]`, `[]`, `"s"`, `1`, `1x`, `-`, `tru`, `nul`, `x`, `}`, `,`, `:`,
	`{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"héllo"}],"max_tokens":50,"stream":true}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"data:xyz"}},"de",1,null,[["x"]],{"text":{"a":"b"}},{"text":5}]}]}`,
	`{"messages":[{"content":"a\nb\u00e9\"\\\/\b\f\r\t"}]}`,
	`{"messages":[{"content":"\ud83d\ude00 \ud83d \ude00 \ud83d\u0041 \udbff\udfff \ud800\ud800\udc00 \uDBFF\uDFFF \u0000"}]}`,
	"{\"messages\":[{\"content\":\"\xff\xfe a\xe2\x82 \xe2\x82\\n \xed\xa0\x80 \xef\xbf\xbd \xf0\x9f\x98\x80\"}]}",
	"{\"model\":\"\xff\"}", "{\"model\":\"a\x7fb\"}", `{"model":"a\u007fb"}`, `{"model":"\u00e9"}`, `{"model":"é"}`, `{"model":"a\/b"}`,
	`{"mo\u0064el":"x","\u006dax_tokens":3,"m\u00e9":1}`, "{\"model\xff\":\"x\"}",
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"arguments":"{}"}}]}],"tools":[{"a":[1,{"b":2}]}]}`,
	`{"max_tokens":10,"max_completion_tokens":300}`, `{"max_tokens":1e3,"n":2.0}`, `{"max_tokens":null,"n":null}`,
	`{"max_tokens":1e300}`, `{"max_tokens":-1e400}`, `{"max_tokens":1e-400}`, `{"max_tokens":18446744073709551616}`,
	`{"max_tokens":9007199254740993}`, `{"max_tokens":999999999999999}`, `{"max_tokens":-0}`, `{"max_tokens":-0.0}`, `{"max_tokens":0.5e1}`,
	`{"n":99999999}`, `{"n":0}`, `{"n":-2}`, `{"n":1.5}`, `{"n":"2"}`, `{"n":true}`, `{"n":[1]}`, `{"n":{}}`, `{"n":01}`, `{"n":1.}`, `{"n":1e}`, `{"n":1e+}`, `{"n":-}`, `{"n":--1}`, `{"n":.5}`, `{"n":1E2}`,
	`{"model":"m","prompt":"abcd"}`, `{"prompt":["ab","cd",[1,2,3,"x",[4],{"a":1},null],4,true,null,{"x":[]}]}`, `{"prompt":{"x":"y"}}`, `{"prompt":5}`,
	`{"model":"a","model":"b"}`, `{"Model":"a"}`, `{"model":"a","MODEL":"b"}`, `{"max_tokens":1,"MAX_TOKENS":30000,"n":2}`,
	`{"messages":[{"content":"a","Content":"bbbb"}],"prompt":["a"],"Prompt":"b"}`, `{"max_token\u017f":3,"\u004e":2,"mod\u0065l":"m"}`,
	`{"model":null}`, `{"model":4}`, `{"model":{"a":1}}`, `{"model":[}`, `{"model":true}`, `{"model":"a\u0000b"}`,
	`{"messages":"hi","prompt":{"x":"y"}}`, `{"messages":[[[[{`, `{"messages":[1,"a",null,true,{"content":"ab"}]}`, `{"messages":null}`,
	`model=gpt`, `["model"]`, `{"a":1}x`, `{"a" 1}`, `{"a":1 "b":2}`, `{"a":1,}`, `{,}`, `{"a":[1,]}`, `{"a":[,1]}`, `{"a":[1 2]}`, `{"a":{"b"}}`,
	`{"a":{"b":1,}}`, `{"a":]`, `{"a":}`, `{1:2}`, `{"a":"\x"}`, `{"a":"\u12x4"}`, "{\"a\":\"\x01\"}", `{"a":tx}`, `{"a":truex}`, `{"a":nulll}`,
	`{"messages":[{"content":"abc`, `{"model":"gpt-4o","max_tok`, `{"max_tokens":-1,"messages":[`, `{"model":"a\`, `{"model":"\u00`,
	`{"model":"gpt-4o","max_tokens":7,"messages":[{"content":"abcdef"},{"content":[{"text":"gh"}]}],"n":3}`,
	`{"messages":[{"content":[{"text":"a"},"b",{"text":null}]}],"prompt":["a",[1,2],3,{"x":[]}],"n":2,"max_completion_tokens":1e3}`,
	"\t\n\r {\t\"model\" \n:\r \"m\" , \"messages\" : [ { \"content\" : [ \"x\" , { \"text\" : \"y\" } ] } ] }\n",
	strings.Repeat(`{"a":`, 500), strings.Repeat("[", 300), `{"a":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`,
	`{"messages":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`,
	`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"u","detail":"low","x":[[1]]},"detail":5},{"type":{"a":1},"text":"t"},{"image_url":"s","detail":"high"}]}]}`,
	`{"messages":[{"content":[{"type":"input_image","detail":{"x":[1]},"image_url":{"detail":[]}}],"function_call":{"name":"f"}}],"functions":[{"name":"g"}]}`,
}

// TestParseBodyMatchesReference: on every prefix of every seed, as a
// partial and as a complete body, the scanner answers what the
// json.Decoder version answered; and so on whole seeds with other model
// fields.
func TestParseBodyMatchesReference(t *testing.T) {
	t.Parallel()
	for _, seed := range referenceSeeds {
		for _, partial := range []bool{false, true} {
			for n := 0; n <= len(seed); n++ {
				checkReference(t, []byte(seed[:n]), "model", partial)
			}
			for _, field := range []string{"", "n", "messages", "content"} {
				checkReference(t, []byte(seed), field, partial)
			}
		}
	}
}

// TestParseBodyDepthMatchesReference: deep nesting is refused where the
// json.Decoder version refused it (past 10,000 levels in a skipped
// member) and read where it read it.
func TestParseBodyDepthMatchesReference(t *testing.T) {
	t.Parallel()
	// A value the reference skipped whole may be walked a few levels in
	// first: every depth near the limit.
	for depth := maxSkipDepth - 4; depth <= maxSkipDepth+1; depth++ {
		for _, format := range []string{`{"a":%s}`, `{"messages":[{"role":%s}]}`, `{"messages":%s}`, `{"prompt":[%s]}`,
			`{"messages":[{"content":[{"image_url":{"x":%s}}]}]}`, `{"messages":[{"content":[{"image_url":{"detail":%s}}]}]}`,
			`{"messages":[{"content":[{"type":%s,"detail":%s}]}]}`, `{"messages":[{"tool_calls":%s}]}`, `{"tools":%s}`,
			`{"messages":[{"tool_calls":[{"function":{"x":%s,"name":%s}}],"function_call":{"arguments":%s}}]}`,
			`{"tools":[{"function":{"x":%s},"y":%s}],"functions":[%s]}`} {
			v := strings.Repeat("[", depth) + strings.Repeat("]", depth)
			body := strings.ReplaceAll(format, "%s", v)
			for _, partial := range []bool{false, true} {
				checkReference(t, []byte(body), "model", partial)
				checkReference(t, []byte(body[:len(body)-depth/2]), "model", partial)
			}
		}
	}
}

// FuzzParseBodyReference holds the scanner to the json.Decoder version it
// replaced: the same Body and the same error for any bytes.
func FuzzParseBodyReference(f *testing.F) {
	for _, s := range referenceSeeds {
		f.Add([]byte(s), false, "model")
		f.Add([]byte(s), true, "model")
	}
	f.Add([]byte(`{"engine":"e","n":1}`), false, "engine")
	f.Add([]byte(`{"é":"e"}`), false, "é")
	f.Fuzz(func(t *testing.T, data []byte, partial bool, field string) {
		if len(data) > 1<<16 {
			return
		}
		checkReference(t, data, field, partial)
	})
}

// refRow is the table row the reference reads: chat and completions as
// they were, plus the fields it skipped whole (tools, functions), whose
// skipping must fail where the reference's did. What the reference does
// not count (images, JSON text) is left out of the comparison.
var refRow = endpoint{fields: []field{
	{"max_tokens", kindOutput}, {"max_completion_tokens", kindOutput}, {"n", kindChoices},
	{"messages", kindMessages}, {"prompt", kindPrompt},
	{"tools", kindTools}, {"functions", kindTools},
}}

func checkReference(t *testing.T, data []byte, field string, partial bool) {
	t.Helper()
	want, wantErr := refParseBody(data, field, partial)
	got, err := parseRow(data, field, &refRow, partial)
	got.ToolChars, got.Images = 0, [imageDetails]uint64{}
	if keyRefused(t, data, err) {
		// The reference read keys exactly and let the last win; the
		// scanner refuses where that could differ from encoding/json.
		return
	}
	if got != want || err != wantErr {
		t.Fatalf("parseRow(%q, %q, partial %v) = %+v, %v; the reference says %+v, %v", abbrev(data), field, partial, got, err, want, wantErr)
	}
	// Envoy's body string takes the other instantiation.
	got, err = parseRow(string(data), field, &refRow, partial)
	got.ToolChars, got.Images = 0, [imageDetails]uint64{}
	if keyRefused(t, data, err) {
		return
	}
	if got != want || err != wantErr {
		t.Fatalf("parseRow(string %q, %q, partial %v) = %+v, %v; the reference says %+v, %v", abbrev(data), field, partial, got, err, want, wantErr)
	}
}

// keyRefused says whether err refuses data for an ambiguous key, and
// fails t if data has no such key.
func keyRefused(t *testing.T, data []byte, err error) bool {
	t.Helper()
	be, ok := err.(*bodyError)
	if !ok || be.code != "ambiguous_key" {
		return false
	}
	if !ambiguousIn(data, be.param) {
		t.Fatalf("parseRow(%q) refuses an ambiguous %q, but no object has one", abbrev(data), be.param)
	}
	return true
}

// abbrev keeps a failure's message readable for the deep bodies.
func abbrev(data []byte) string {
	const max = 300
	if len(data) <= max {
		return string(data)
	}
	return fmt.Sprintf("%s...(%d bytes)", data[:max], len(data))
}
