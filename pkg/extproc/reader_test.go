package extproc

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// readBody reads the chunks as one body of the given kind.
func readBody(kind bodyKind, chunks ...[]byte) Usage {
	r := newUsageReader(kind)
	for _, c := range chunks {
		r.write(c)
	}
	r.finish()
	return r.result()
}

// splits returns body cut in every way the tests try: whole, one byte at
// a time, in 7-byte chunks, and in two at every offset.
func splits(body []byte) [][][]byte {
	out := [][][]byte{{body}}
	var one, seven [][]byte
	for i := range body {
		one = append(one, body[i:i+1])
	}
	for i := 0; i < len(body); i += 7 {
		seven = append(seven, body[i:min(i+7, len(body))])
	}
	out = append(out, one, seven)
	for i := 0; i <= len(body); i++ {
		out = append(out, [][]byte{body[:i], body[i:]})
	}
	return out
}

func testdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reference reads an SSE body with encoding/json, one event per blank
// line (the test files use \n only): the last usage before [DONE] and
// the runes of every streamed text delta. It checks the files' expected
// numbers independently of the scanner.
func reference(t testing.TB, body []byte) Usage {
	t.Helper()
	var u Usage
	for _, ev := range strings.Split(string(body), "\n\n") {
		var data string
		for _, line := range strings.Split(ev, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = d
			}
		}
		if data == "[DONE]" {
			break
		}
		if data == "" {
			continue
		}
		var e struct {
			Type    string `json:"type"`
			Delta   string `json:"delta"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage    *map[string]json.RawMessage `json:"usage"`
			Response struct {
				Usage *map[string]json.RawMessage `json:"usage"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			t.Fatalf("reference: %v in %s", err, data)
		}
		for _, c := range e.Choices {
			u.StreamedChars += uint64(utf8.RuneCountInString(c.Delta.Content))
		}
		if e.Type == "response.output_text.delta" {
			u.StreamedChars += uint64(utf8.RuneCountInString(e.Delta))
		}
		for _, m := range []*map[string]json.RawMessage{e.Usage, e.Response.Usage} {
			if m == nil {
				continue
			}
			n := func(k string) uint64 {
				var v uint64
				if raw, ok := (*m)[k]; ok {
					if err := json.Unmarshal(raw, &v); err != nil {
						t.Fatalf("reference: %s: %v", k, err)
					}
				}
				return v
			}
			u.Reported = true
			u.Input = n("prompt_tokens") + n("input_tokens")
			u.Output = n("completion_tokens") + n("output_tokens")
			u.Total = n("total_tokens")
		}
	}
	return u
}

func TestReaderFiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		kind bodyKind
		want Usage
	}{
		{
			name: "chat stream with include_usage", give: "chat_stream.sse", kind: kindSSE,
			// "Hello" 5 + ", wörld 👋" 9 + a delta that spells an SSE
			// usage event and [DONE] inside a JSON string, 43.
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57},
		},
		{
			name: "Responses API stream", give: "responses_stream.sse", kind: kindSSE,
			// "Hi" 2 + " there\n" 7; the audio delta is not text.
			want: Usage{Input: 36, Output: 87, Total: 123, Reported: true, StreamedChars: 9},
		},
		{
			name: "chat completion JSON with a fake usage in its text", give: "chat.json", kind: kindJSON,
			want: Usage{Input: 19, Output: 10, Total: 29, Reported: true},
		},
		{
			name: "Responses API JSON", give: "responses.json", kind: kindJSON,
			want: Usage{Input: 36, Output: 87, Total: 123, Reported: true},
		},
		{
			name: "chat stream sniffed", give: "chat_stream.sse", kind: kindSniff,
			want: Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57},
		},
		{
			name: "JSON sniffed", give: "chat.json", kind: kindSniff,
			want: Usage{Input: 19, Output: 10, Total: 29, Reported: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := testdata(t, tt.give)
			if strings.HasSuffix(tt.give, ".sse") {
				if diff := cmp.Diff(tt.want, reference(t, body)); diff != "" {
					t.Fatalf("the expected usage disagrees with encoding/json (-want +reference):\n%s", diff)
				}
			}
			for _, chunks := range splits(body) {
				if diff := cmp.Diff(tt.want, readBody(tt.kind, chunks...)); diff != "" {
					t.Fatalf("%d chunks (first %d bytes) (-want +got):\n%s", len(chunks), len(chunks[0]), diff)
				}
			}
		})
	}
}

// TestReaderLineEndings: the same stream with \r\n and with \r line
// ends, split everywhere (also between a \r and its \n).
func TestReaderLineEndings(t *testing.T) {
	t.Parallel()
	body := testdata(t, "chat_stream.sse")
	want := Usage{Input: 12, Output: 25, Total: 37, Reported: true, StreamedChars: 57}
	for _, tt := range []struct {
		name string
		give []byte
	}{
		{name: "CRLF", give: bytes.ReplaceAll(body, []byte("\n"), []byte("\r\n"))},
		{name: "CR", give: bytes.ReplaceAll(body, []byte("\n"), []byte("\r"))},
		{name: "no space after data:", give: replaceLineStart(body, "data: ", "data:")},
		{name: "comments and other fields", give: replaceLineStart(body, "data: ", ": keep-alive\nid: 7\nretry: 10\nevent: chunk\ndata: ")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, chunks := range splits(tt.give) {
				if diff := cmp.Diff(want, readBody(kindSSE, chunks...)); diff != "" {
					t.Fatalf("%d chunks (first %d bytes) (-want +got):\n%s", len(chunks), len(chunks[0]), diff)
				}
			}
		})
	}
}

// replaceLineStart replaces old where a line starts with it.
func replaceLineStart(b []byte, old, new string) []byte {
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if rest, ok := strings.CutPrefix(l, old); ok {
			lines[i] = new + rest
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// usageEvent is one SSE event with a chat usage object.
func usageEvent(usage string) string {
	return `data: {"choices":[],"usage":` + usage + "}\n\n"
}

func textEvent(text string) string {
	return `data: {"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n"
}

func TestReaderCases(t *testing.T) {
	t.Parallel()
	u := func(in, out, total uint64) Usage { return Usage{Input: in, Output: out, Total: total, Reported: true} }
	deep := strings.Repeat(`{"a":`, maxDepth+1) + "1" + strings.Repeat("}", maxDepth+1)
	tests := []struct {
		name string
		kind bodyKind
		give string
		want Usage
	}{
		// Values a usage field must not take.
		{name: "negative", kind: kindJSON, give: `{"usage":{"prompt_tokens":-5,"completion_tokens":1}}`},
		{name: "fraction", kind: kindJSON, give: `{"usage":{"prompt_tokens":1.5}}`},
		{name: "exponent", kind: kindJSON, give: `{"usage":{"total_tokens":1e3}}`},
		{name: "leading zero", kind: kindJSON, give: `{"usage":{"total_tokens":012}}`},
		{name: "overflow", kind: kindJSON, give: `{"usage":{"total_tokens":184467440737095516160}}`},
		{name: "above a trillion", kind: kindJSON, give: `{"usage":{"total_tokens":1000000000001}}`},
		{name: "a trillion", kind: kindJSON, give: `{"usage":{"total_tokens":1000000000000}}`, want: u(0, 0, 1_000_000_000_000)},
		{name: "string count", kind: kindJSON, give: `{"usage":{"total_tokens":"12"}}`},
		{name: "boolean count", kind: kindJSON, give: `{"usage":{"total_tokens":true}}`},
		{name: "empty usage", kind: kindJSON, give: `{"usage":{}}`},
		{name: "usage not an object", kind: kindJSON, give: `{"usage":[{"total_tokens":3}]}`},
		{name: "null usage", kind: kindJSON, give: `{"usage":null}`},
		// What a usage object yields.
		{name: "null field is absent", kind: kindJSON, give: `{"usage":{"prompt_tokens":3,"completion_tokens":null}}`, want: u(3, 0, 3)},
		{name: "total only", kind: kindJSON, give: `{"usage":{"total_tokens":7}}`, want: u(0, 0, 7)},
		{name: "no total", kind: kindJSON, give: `{"usage":{"input_tokens":4,"output_tokens":6}}`, want: u(4, 6, 10)},
		{name: "total below its parts", kind: kindJSON, give: `{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":1}}`, want: u(10, 5, 15)},
		{name: "total above its parts", kind: kindJSON, give: `{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":40}}`, want: u(10, 5, 40)},
		{name: "unknown and nested fields", kind: kindJSON, give: `{"usage":{"cost":0.0012,"prompt_tokens_details":{"cached_tokens":-1},"prompt_tokens":2,"completion_tokens":3}}`, want: u(2, 3, 5)},
		{name: "last usage key wins", kind: kindJSON, give: `{"usage":{"total_tokens":1},"usage":{"total_tokens":2}}`, want: u(0, 0, 2)},
		{name: "usage in a nested object is not the usage", kind: kindJSON, give: `{"data":{"usage":{"total_tokens":1}}}`},
		{name: "escaped key is another key", kind: kindJSON, give: `{"\u0075sage":{"total_tokens":1}}`},
		{name: "whitespace everywhere", kind: kindJSON, give: " \n{ \"usage\" :\t{ \"total_tokens\" : 9 } } \r\n", want: u(0, 0, 9)},
		// Not JSON.
		{name: "cut JSON", kind: kindJSON, give: `{"usage":{"total_tokens":9}`},
		{name: "trailing garbage", kind: kindJSON, give: `{"usage":{"total_tokens":9}} x`},
		{name: "trailing comma", kind: kindJSON, give: `{"usage":{"total_tokens":9},}`},
		{name: "control character in a string", kind: kindJSON, give: "{\"a\":\"x\ty\",\"usage\":{\"total_tokens\":9}}"},
		{name: "bad escape", kind: kindJSON, give: `{"a":"\x","usage":{"total_tokens":9}}`},
		{name: "bad literal", kind: kindJSON, give: `{"a":nul,"usage":{"total_tokens":9}}`},
		{name: "too deep", kind: kindJSON, give: deep},
		{name: "empty body", kind: kindJSON, give: ""},
		{name: "binary", kind: kindSniff, give: "\x00\xff\xfe{{{[[[\"\\"},
		// Streams.
		{name: "last usage before DONE wins", kind: kindSSE, give: usageEvent(`{"total_tokens":5}`) + usageEvent(`{"total_tokens":6}`) + "data: [DONE]\n\n" + usageEvent(`{"total_tokens":7}`), want: u(0, 0, 6)},
		{name: "null usage keeps the earlier", kind: kindSSE, give: usageEvent(`{"total_tokens":5}`) + usageEvent("null"), want: u(0, 0, 5)},
		{name: "invalid event keeps the earlier", kind: kindSSE, give: usageEvent(`{"total_tokens":5}`) + `data: {"usage":{"total_tokens":1},` + "\n\n", want: u(0, 0, 5)},
		{name: "invalid usage keeps the earlier", kind: kindSSE, give: usageEvent(`{"total_tokens":5}`) + usageEvent(`{"total_tokens":-1}`), want: u(0, 0, 5)},
		{name: "no usage, text counted", kind: kindSSE, give: textEvent("abc") + textEvent(`d\"e\u00e9`) + "data: [DONE]\n\n", want: Usage{StreamedChars: 7}},
		{name: "text after DONE not counted", kind: kindSSE, give: textEvent("abc") + "data: [DONE]\n\n" + textEvent("abc"), want: Usage{StreamedChars: 3}},
		{name: "DONE with data after it is no DONE", kind: kindSSE, give: "data: [DONE]\ndata: x\n\n" + usageEvent(`{"total_tokens":5}`), want: u(0, 0, 5)},
		{name: "data split over two lines", kind: kindSSE, give: "data: {\"choices\":[],\ndata: \"usage\":{\"total_tokens\":8}}\n\n", want: u(0, 0, 8)},
		{name: "empty data line", kind: kindSSE, give: "data\n\n" + usageEvent(`{"total_tokens":5}`), want: u(0, 0, 5)},
		{name: "last event without its blank line", kind: kindSSE, give: usageEvent(`{"total_tokens":5}`) + `data: {"usage":{"total_tokens":6}}`, want: u(0, 0, 6)},
		{name: "cut last event", kind: kindSSE, give: usageEvent(`{"total_tokens":5}`) + `data: {"usage":{"total_tokens":6}`, want: u(0, 0, 5)},
		{name: "field datax is not data", kind: kindSSE, give: "datax: " + `{"usage":{"total_tokens":6}}` + "\n\n"},
		{name: "tool call arguments and reasoning", kind: kindSSE, give: `data: {"choices":[{"delta":{"reasoning_content":"hm","tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}` + "\n\n", want: Usage{StreamedChars: 9}},
		{name: "Responses delta before its type", kind: kindSSE, give: `data: {"delta":"abcd","type":"response.output_text.delta"}` + "\n\n", want: Usage{StreamedChars: 4}},
		{name: "Responses delta of another type", kind: kindSSE, give: `data: {"type":"response.audio.delta","delta":"abcd"}` + "\n\n"},
		{name: "Responses type with an escape", kind: kindSSE, give: `data: {"type":"response.output_text.delt\u0061","delta":"abcd"}` + "\n\n"},
		{name: "text sniffed as a stream", kind: kindSniff, give: "hello\nworld\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, chunks := range splits([]byte(tt.give)) {
				if diff := cmp.Diff(tt.want, readBody(tt.kind, chunks...)); diff != "" {
					t.Fatalf("%d chunks (first %d bytes) (-want +got):\n%s", len(chunks), len(chunks[0]), diff)
				}
			}
		})
	}
}

func TestKindOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		give string
		want bodyKind
	}{
		{give: "text/event-stream", want: kindSSE},
		{give: "Text/Event-Stream; charset=utf-8", want: kindSSE},
		{give: "application/json", want: kindJSON},
		{give: "application/json; charset=utf-8", want: kindJSON},
		{give: "application/vnd.api+json", want: kindJSON},
		{give: "", want: kindSniff},
		{give: "text/plain", want: kindSniff},
	} {
		if got := kindOf(tt.give); got != tt.want {
			t.Errorf("kindOf(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
}
