package extauthz

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/google/go-cmp/cmp"
)

func TestParseBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		partial bool
		want    Body
		wantErr *bodyError
	}{
		{name: "empty", give: "", want: Body{Choices: 1}},
		{name: "white space", give: " \n\t", want: Body{Choices: 1}},
		{name: "empty object", give: "{}", want: Body{Choices: 1}},
		{
			name: "chat with string content",
			give: `{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"héllo"}],"max_tokens":50}`,
			want: Body{Model: "gpt-4o", MaxTokens: 50, HasMaxTokens: true, Choices: 1, PromptChars: 8 + 5},
		},
		{
			name: "chat with parts: text counted, an image with no detail is auto",
			give: `{"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"data:xyz"}},"de"]}]}`,
			want: Body{Choices: 1, PromptChars: 5, Images: [imageDetails]uint64{ImageAuto: 1}},
		},
		{
			name: "escapes count as the characters they stand for",
			give: `{"messages":[{"content":"a\nb\u00e9"}]}`,
			want: Body{Choices: 1, PromptChars: 4},
		},
		{
			name: "null content and unknown fields are skipped; tool_calls and tools count as JSON",
			give: `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"arguments":"{}"}}]}],"tools":[{"a":[1,{"b":2}]}],"stream":true}`,
			want: Body{Choices: 1, ToolChars: uint64(len(`{}`) + len(`"a":[1,{"b":2}]`))},
		},
		{
			name: "max_completion_tokens and max_tokens: the larger",
			give: `{"max_tokens":10,"max_completion_tokens":300}`,
			want: Body{MaxTokens: 300, HasMaxTokens: true, Choices: 1},
		},
		{name: "whole floats are whole numbers", give: `{"max_tokens":1e3,"n":2.0}`, want: Body{MaxTokens: 1000, HasMaxTokens: true, Choices: 2}},
		{name: "null max_tokens is absent", give: `{"max_tokens":null}`, want: Body{Choices: 1}},
		{name: "huge max_tokens is clamped", give: `{"max_tokens":1e300}`, want: Body{MaxTokens: maxCost, HasMaxTokens: true, Choices: 1}},
		{name: "n is clamped", give: `{"n":99999999}`, want: Body{Choices: maxChoices}},
		{name: "n of 0 is 1", give: `{"n":0}`, want: Body{Choices: 1}},
		{
			name: "prompt string",
			give: `{"model":"m","prompt":"abcd"}`,
			want: Body{Model: "m", Choices: 1, PromptChars: 4},
		},
		{
			name: "prompt list of strings and of token IDs",
			give: `{"prompt":["ab","cd",[1,2,3],4]}`,
			want: Body{Choices: 1, PromptChars: 4, PromptTokens: 4},
		},
		// encoding/json lets the last win; the estimate must not read the
		// first (see TestParseBodyKeys).
		{name: "a second model is refused", give: `{"model":"a","model":"b"}`, wantErr: keyError("model")},
		{name: "null model", give: `{"model":null}`, want: Body{Choices: 1}},
		{name: "messages of the wrong shape count nothing", give: `{"messages":"hi","prompt":{"x":"y"}}`, want: Body{Choices: 1}},
		{name: "not JSON", give: `model=gpt`, wantErr: errNotJSON},
		{name: "not an object", give: `["model"]`, wantErr: errNotObject},
		{name: "a string", give: `"model"`, wantErr: errNotObject},
		{name: "two values", give: `{}{}`, wantErr: errNotJSON},
		{name: "trailing garbage", give: `{"model":"a"} x`, wantErr: errNotJSON},
		{name: "truncated", give: `{"model":"a","messages":[{"content":"abc`, wantErr: errNotJSON},
		{name: "model not a string", give: `{"model":4}`, wantErr: errModel},
		{name: "model an object", give: `{"model":{"a":1}}`, wantErr: errModel},
		{name: "model with a control character", give: `{"model":"a\u0000b"}`, wantErr: errModel},
		{name: "negative max_tokens", give: `{"max_tokens":-1}`, wantErr: errMaxTokens},
		{name: "fractional max_tokens", give: `{"max_tokens":1.5}`, wantErr: errMaxTokens},
		{name: "string max_tokens", give: `{"max_tokens":"5"}`, wantErr: errMaxTokens},
		{name: "negative n", give: `{"n":-2}`, wantErr: errChoices},
		{
			name:    "partial: what the prefix holds",
			give:    `{"model":"gpt-4o","max_tokens":7,"messages":[{"content":"abcdef`,
			partial: true,
			want:    Body{Model: "gpt-4o", MaxTokens: 7, HasMaxTokens: true, Choices: 1},
		},
		{
			name:    "partial: cut inside a key",
			give:    `{"model":"gpt-4o","max_tok`,
			partial: true,
			want:    Body{Model: "gpt-4o", Choices: 1},
		},
		{name: "partial: still not JSON", give: `model=gpt`, partial: true, wantErr: errNotJSON},
		{name: "partial: a bad field before the cut", give: `{"max_tokens":-1,"messages":[`, partial: true, wantErr: errMaxTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseBody([]byte(tt.give), "model", EndpointAny, tt.partial)
			if tt.wantErr != nil {
				if be := (*bodyError)(nil); !errors.As(err, &be) || *be != *tt.wantErr {
					t.Fatalf("ParseBody error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseBody: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseBody (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseBodyModelField(t *testing.T) {
	t.Parallel()
	got, err := ParseBody([]byte(`{"model":"a","engine":"b"}`), "engine", EndpointAny, false)
	if err != nil || got.Model != "b" {
		t.Errorf("ParseBody = %+v, %v; want model b", got, err)
	}
	got, err = ParseBody([]byte(`{"model":"a"}`), "", EndpointAny, false)
	if err != nil || got.Model != "" {
		t.Errorf("ParseBody with no model field = %+v, %v; want no model", got, err)
	}
}

func TestEstimate(t *testing.T) {
	t.Parallel()
	set := &Settings{CharsPerToken: 4, DefaultMaxTokens: 256}
	// Chat: a cap below the default counts (see TestEstimateImagesAndEndpoints).
	tests := []struct {
		name      string
		give      Body
		partial   bool
		bodyBytes int64
		want      uint64
		// wantPrompt is the prompt's part of want.
		wantPrompt uint64
	}{
		{name: "default completion", give: Body{Endpoint: EndpointChat, Choices: 1, PromptChars: 10}, want: 3 + 256, wantPrompt: 3},
		{name: "max_tokens", give: Body{Endpoint: EndpointChat, Choices: 1, PromptChars: 8, MaxTokens: 10, HasMaxTokens: true}, want: 2 + 10, wantPrompt: 2},
		{name: "max_tokens 0", give: Body{Endpoint: EndpointChat, Choices: 1, MaxTokens: 0, HasMaxTokens: true}, want: 0},
		{name: "n completions", give: Body{Endpoint: EndpointChat, Choices: 3, MaxTokens: 10, HasMaxTokens: true}, want: 30},
		{name: "token IDs", give: Body{Endpoint: EndpointChat, Choices: 1, PromptTokens: 7, HasMaxTokens: true}, want: 7, wantPrompt: 7},
		{name: "partial counts every byte", give: Body{Endpoint: EndpointChat, Choices: 1, PromptChars: 10, HasMaxTokens: true}, partial: true, bodyBytes: 1001, want: 251, wantPrompt: 251},
		{name: "partial never under the text", give: Body{Endpoint: EndpointChat, Choices: 1, PromptChars: 4000, HasMaxTokens: true}, partial: true, bodyBytes: 100, want: 1000, wantPrompt: 1000},
		{name: "clamped", give: Body{Endpoint: EndpointChat, Choices: maxChoices, MaxTokens: maxCost, HasMaxTokens: true}, want: maxCost},
		{name: "clamped prompt", give: Body{Endpoint: EndpointChat, Choices: 1, PromptTokens: maxCost + 5, HasMaxTokens: true}, want: maxCost, wantPrompt: maxCost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got, prompt := estimate(&tt.give, set, tt.partial, tt.bodyBytes); got != tt.want || prompt != tt.wantPrompt {
				t.Errorf("estimate = %d, prompt %d; want %d, prompt %d", got, prompt, tt.want, tt.wantPrompt)
			}
		})
	}
}

// FuzzBody: any bytes, complete or partial, give an answer without a
// panic, in time linear in their length; and a complete body is refused
// or charged for the model, output cap and choices a Go backend decodes
// from it (checkAsDecoded), whatever its keys' case, escapes or repeats.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		`{"messages":[{"content":[{"type":"text","text":"a"},"b",{"text":null}]}]}`,
		`{"prompt":["a",[1,2],3,{"x":[]}],"n":2,"max_completion_tokens":1e3}`,
		`{"model":"a\u0000"}`, `[[[[[[[[[[`, `{"messages":[[[[{`, `{"max_tokens":-0}`, `{"a":1}x`,
		strings.Repeat(`{"a":`, 500),
		`{"Model":"big"}`, `{"model":"cheap","MODEL":"big"}`, `{"max_tokens":1,"MAX_TOKENS":30000}`, `{"mod\u0065l":"x","N":3}`,
		`{"max_to\u212Aens":9,"best_ofſ":1}`, `{"messages":[{"content":"a","CONTENT":"bbbb"}]}`, `{"Max_Output_Tokens":2,"max_completion_tokens":1}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, partial bool) {
		if len(data) > 1<<16 {
			return
		}
		start := time.Now()
		b, err := ParseBody(data, "model", EndpointAny, partial)
		if err != nil {
			var be *bodyError
			if !errors.As(err, &be) {
				t.Fatalf("ParseBody error %T %v is not a bodyError", err, err)
			}
			if be.code == "ambiguous_key" && !ambiguousIn(data, be.param) {
				t.Fatalf("ParseBody(%q) refuses an ambiguous %q, but no object has one", data, be.param)
			}
			return
		}
		if b.Choices < 1 || b.Choices > maxChoices || b.MaxTokens > maxCost {
			t.Fatalf("ParseBody = %+v out of range", b)
		}
		if b.PromptChars > uint64(len(data)) || b.PromptTokens > uint64(len(data)) {
			t.Fatalf("ParseBody counted %d chars, %d tokens in %d bytes", b.PromptChars, b.PromptTokens, len(data))
		}
		if !printable(b.Model) {
			t.Fatalf("model %q is not printable", b.Model)
		}
		if !partial {
			checkAsDecoded(t, data, b)
		}
		// Linear work: far under a second even for the largest input, on
		// the slowest CI machine with the race detector.
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("ParseBody took %v on %d bytes", d, len(data))
		}
	})
}

// decoded is what a Go backend reads of the fields the estimate reads
// on every path: encoding/json matches keys case-insensitively and lets
// the last win.
type decoded struct {
	Model               *string      `json:"model"`
	MaxTokens           *json.Number `json:"max_tokens"`
	MaxCompletionTokens *json.Number `json:"max_completion_tokens"`
	MaxOutputTokens     *json.Number `json:"max_output_tokens"`
	N                   *json.Number `json:"n"`
	BestOf              *json.Number `json:"best_of"`
}

// checkAsDecoded fails t unless b, which ParseBody read from data with
// EndpointAny, charges the model, output cap and choices encoding/json
// decodes from data into a struct with those fields.
func checkAsDecoded(t *testing.T, data []byte, b Body) {
	t.Helper()
	var d decoded
	if err := json.Unmarshal(data, &d); err != nil {
		if len(bytes.TrimSpace(data)) == 0 {
			return
		}
		t.Fatalf("ParseBody read %q, which encoding/json refuses: %v", data, err)
	}
	count := func(n *json.Number) (uint64, bool) {
		if n == nil {
			return 0, false
		}
		f, err := strconv.ParseFloat(string(*n), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			t.Fatalf("ParseBody read %q, whose number %q does not parse: %v", data, *n, err)
		}
		return uint64(min(f, maxCost)), true
	}
	want := Body{Choices: 1}
	if d.Model != nil {
		want.Model = *d.Model
	}
	for _, n := range []*json.Number{d.MaxTokens, d.MaxCompletionTokens, d.MaxOutputTokens} {
		if v, ok := count(n); ok {
			want.MaxTokens, want.HasMaxTokens = max(want.MaxTokens, v), true
		}
	}
	if v, ok := count(d.N); ok {
		want.Choices = min(max(v, 1), maxChoices)
	}
	if v, ok := count(d.BestOf); ok {
		want.BestOf = min(v, maxChoices)
	}
	if b.Model != want.Model || b.MaxTokens != want.MaxTokens || b.HasMaxTokens != want.HasMaxTokens ||
		b.Choices != want.Choices || b.BestOf != want.BestOf {
		t.Fatalf("ParseBody(%q) charges %+v; encoding/json decodes %+v", data, b, want)
	}
}

// TestReadBodyRawOrString: Envoy sends the body as a string, or as
// raw_body bytes when pack_as_bytes is set; both read the same.
func TestReadBodyRawOrString(t *testing.T) {
	t.Parallel()
	set := newSettings(t, testSettings)
	body := `{"model":"gpt-4o","messages":[{"content":"héllo\n"}],"max_tokens":5}`
	want := Body{Model: "gpt-4o", MaxTokens: 5, HasMaxTokens: true, Choices: 1, PromptChars: 6}
	for _, h := range []*authv3.AttributeContext_HttpRequest{{Body: body}, {RawBody: []byte(body)}} {
		got, err := readBody(set, h, bodyShape{sent: int64(len(body)), size: int64(len(body)), least: int64(len(body))})
		if err != nil {
			t.Fatalf("readBody: %v", err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("readBody (-want +got):\n%s", diff)
		}
	}
}

// TestParseBodyAllocs: a chat body costs one allocation, its model,
// however many messages it has, and however its keys are escaped (keys.go
// matches a key as it decodes it). Not parallel: AllocsPerRun counts the
// whole process's allocations.
func TestParseBodyAllocs(t *testing.T) {
	body := chatBody("gpt-4o", 1900, 256)
	body = body[:len(body)-1] + `,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"stream":true}`
	raw := []byte(body)
	escaped := keysBody(escapeFirst)
	escapedStr := string(escaped)
	for _, run := range []func(){
		func() { _, _ = ParseBody(raw, "model", EndpointChat, false) },
		func() { _, _ = parseBody(body, "model", EndpointChat, false) },
		func() { _, _ = ParseBody(escaped, "model", EndpointChat, false) },
		func() { _, _ = parseBody(escapedStr, "model", EndpointChat, false) },
	} {
		if n := testing.AllocsPerRun(100, run); n > 1 {
			t.Errorf("ParseBody allocates %v times, want 1", n)
		}
	}
}
