package upstream

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParseChat feeds parseChat hostile bodies: it must answer each with
// a request in bounds or a client error, and what it accepts must make a
// valid response.
func FuzzParseChat(f *testing.F) {
	for _, s := range []string{
		string(ChatBody("m", 400, 64, false)),
		string(ChatBody("m", 3, 1, true)),
		`{"model":"\u00e9\ud83d\ude00","messages":[{"content":[{"type":"text","text":"h\u00e9llo"},{"type":"image_url"}]}],"max_completion_tokens":7}`,
		`{"messages":[{"content":null},{"content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"content":"x"}],"max_tokens":1.5}`,
		`{"messages":[{"content":"x"}],"max_tokens":-3}`,
		`{"messages":{}}`,
		`{"model":7}`,
		`null`,
		"\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	c := DefaultConfig()
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseChat(body, &c)
		if err != nil {
			if ce := clientError(""); !errors.As(err, &ce) {
				t.Fatalf("error %v is not a client error", err)
			}
			return
		}
		if r.maxTokens < 1 || r.maxTokens > c.MaxTokensLimit || r.promptTokens < 0 || r.promptTokens > len(body) {
			t.Fatalf("out of bounds: %+v from %d bytes", r, len(body))
		}
		if r.includeUsage && !r.stream {
			t.Fatal("include_usage without stream")
		}
		comp := completion{id: 1, created: 1, req: &r, tokens: r.maxTokens}
		if b := appendJSON(nil, &comp); !json.Valid(b) {
			t.Fatalf("invalid response JSON: %q", b)
		}
		if b := appendChunk(nil, &comp, 0, comp.tokens); len(b) == 0 {
			t.Fatal("no chunk")
		}
	})
}
