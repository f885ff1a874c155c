package extauthz

import (
	"fmt"
	"strings"
	"testing"
)

// keysBody is a chat body of many keys at every level the parser reads
// (messages, content parts, tools, tool calls), each key written by esc.
func keysBody(esc func(key string) string) []byte {
	q := func(key string) string { return `"` + esc(key) + `"` }
	turn := `{` + q("role") + `:"user",` + q("content") + `:[{` + q("type") + `:"text",` + q("text") + `:"hello there"},` +
		`{` + q("type") + `:"image_url",` + q("image_url") + `:{` + q("url") + `:"u",` + q("detail") + `:"low"}}]},` +
		`{` + q("role") + `:"assistant",` + q("content") + `:null,` + q("tool_calls") + `:[{` + q("id") + `:"c",` +
		q("function") + `:{` + q("name") + `:"f",` + q("arguments") + `:"{}"}}]},`
	return []byte(`{` + q("model") + `:"gpt-4o",` + q("stream") + `:true,` + q("messages") + `:[` +
		strings.Repeat(turn, 8) + `{` + q("role") + `:"user",` + q("content") + `:"bye"}],` +
		q("tools") + `:[{` + q("type") + `:"function",` + q("function") + `:{` + q("name") + `:"f"}}],` +
		q("max_tokens") + `:64}`)
}

// escapeFirst writes a key's first character as a \u escape, which
// makes the parser decode it.
func escapeFirst(key string) string { return fmt.Sprintf(`\u%04x`, key[0]) + key[1:] }

// BenchmarkEscapedKeys is the body parser on the same body with plain
// keys and with every key's first character escaped: the escaped one
// must cost about the same, not a decode (or several) per key.
func BenchmarkEscapedKeys(b *testing.B) {
	for _, bc := range []struct {
		name string
		esc  func(string) string
	}{
		{"plain", func(k string) string { return k }},
		{"escaped", escapeFirst},
	} {
		body := keysBody(bc.esc)
		// Tools count as their JSON text, escapes and all.
		got, want := mustParse(b, body), mustParse(b, keysBody(func(k string) string { return k }))
		if got.ToolChars, want.ToolChars = 0, 0; got != want {
			b.Fatalf("the %s body reads as %+v, the plain one as %+v", bc.name, got, want)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := ParseBody(body, "model", EndpointChat, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mustParse(tb testing.TB, body []byte) Body {
	tb.Helper()
	got, err := ParseBody(body, "model", EndpointChat, false)
	if err != nil {
		tb.Fatalf("ParseBody(%s): %v", body, err)
	}
	return got
}
