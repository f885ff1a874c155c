package extauthz

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestEndpointOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		give string
		want Endpoint
	}{
		{give: "/v1/chat/completions", want: EndpointChat},
		{give: "/v1/chat/completions?stream=true", want: EndpointChat},
		{give: "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", want: EndpointChat},
		{give: "/v1/completions", want: EndpointCompletions},
		{give: "/v1/responses", want: EndpointResponses},
		{give: "/v1/embeddings", want: EndpointEmbeddings},
		{give: "/v1/embeddings#/chat/completions", want: EndpointEmbeddings},
		{give: "/v1/chat/completions?next=/v1/embeddings", want: EndpointChat},
		{give: "/v1/chat/completions/", want: EndpointAny},
		{give: "/v1/embeddings/x", want: EndpointAny},
		{give: "/v1/messages", want: EndpointAny},
		{give: "", want: EndpointAny},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			t.Parallel()
			if got := EndpointOf(tt.give); got != tt.want {
				t.Errorf("EndpointOf(%q) = %d, want %d", tt.give, got, tt.want)
			}
		})
	}
}

// TestParseBodyEndpoints: each row reads its own fields, and only them.
func TestParseBodyEndpoints(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		ep      Endpoint
		give    string
		want    Body
		wantErr *bodyError
	}{
		{
			name: "chat: image details, part-level or in image_url, the later wins",
			ep:   EndpointChat,
			give: `{"messages":[{"content":[{"type":"image_url","image_url":{"url":"u","detail":"low"}},` +
				`{"image_url":{"detail":"high","url":"u"}},{"type":"image_url","image_url":"u","detail":"original"},` +
				`{"detail":"low","image_url":{"detail":"high"}},{"type":"text","text":"ab"}]}]}`,
			want: Body{Endpoint: EndpointChat, Choices: 1, PromptChars: 2, Images: [imageDetails]uint64{ImageLow: 1, ImageHigh: 2, ImageAuto: 1}},
		},
		{
			name: "chat: fields of other endpoints are not read",
			ep:   EndpointChat,
			give: `{"input":"abcd","prompt":"abcd","instructions":"x","max_output_tokens":9,"best_of":3}`,
			want: Body{Endpoint: EndpointChat, Choices: 1},
		},
		{
			name: "chat: a legacy function_call and functions",
			ep:   EndpointChat,
			give: `{"functions":[{"name":"f"}],"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`,
			want: Body{Endpoint: EndpointChat, Choices: 1, ToolChars: uint64(len(`"name":"f"`) + len("f{}"))},
		},
		{
			name: "chat: a tool's function object is flattened one level only",
			ep:   EndpointChat,
			give: `{"tools":[{"function":{"function":{"a":1}}},"x",7]}`,
			want: Body{Endpoint: EndpointChat, Choices: 1, ToolChars: uint64(len(`"function":{"a":1}`) + len(`"x"`) + len(`7`))},
		},
		{
			name: "responses: string input, instructions, max_output_tokens",
			ep:   EndpointResponses,
			give: `{"instructions":"be brief","input":"héllo","max_output_tokens":30,"max_tokens":5000,"n":4}`,
			want: Body{Endpoint: EndpointResponses, Choices: 1, PromptChars: 8 + 5, MaxTokens: 30, HasMaxTokens: true},
		},
		{
			name: "responses: items, parts, an image by file, a call, its output as parts, a reasoning summary",
			ep:   EndpointResponses,
			give: `{"input":[{"role":"user","content":[{"type":"input_text","text":"abc"},{"type":"input_image","file_id":"file-1"}]},` +
				`{"type":"function_call","name":"fn","arguments":"{}"},{"type":"function_call_output","output":[{"type":"input_text","text":"ok"}]},` +
				`{"type":"reasoning","summary":[{"type":"summary_text","text":"why"}]},"raw",{"type":"input_image","image_url":"u","detail":"low"}]}`,
			want: Body{Endpoint: EndpointResponses, Choices: 1, PromptChars: 3 + 2 + 3 + 3, ToolChars: 4,
				Images: [imageDetails]uint64{ImageLow: 1, ImageAuto: 1}},
		},
		{
			name: "responses: instructions as items",
			ep:   EndpointResponses,
			give: `{"instructions":[{"role":"developer","content":"abcd"}]}`,
			want: Body{Endpoint: EndpointResponses, Choices: 1, PromptChars: 4},
		},
		{
			name: "completions: suffix, best_of, token ID lists",
			ep:   EndpointCompletions,
			give: `{"prompt":[[1,2],[3]],"suffix":"xy","best_of":4,"n":2,"max_tokens":3}`,
			want: Body{Endpoint: EndpointCompletions, Choices: 2, BestOf: 4, PromptChars: 2, PromptTokens: 3, MaxTokens: 3, HasMaxTokens: true},
		},
		{name: "completions: bad best_of", ep: EndpointCompletions, give: `{"best_of":-1}`, wantErr: errBestOf},
		{
			name: "embeddings: strings and token IDs; output caps not read",
			ep:   EndpointEmbeddings,
			give: `{"input":["ab","cd",[1,2],3],"max_tokens":99}`,
			want: Body{Endpoint: EndpointEmbeddings, Choices: 1, PromptChars: 4, PromptTokens: 3},
		},
		{
			name: "any path: every field, the largest output cap",
			ep:   EndpointAny,
			give: `{"messages":[{"content":"ab"}],"prompt":"cd","input":"ef","instructions":"gh","suffix":"ij","max_tokens":5,"max_output_tokens":50,"max_completion_tokens":7}`,
			want: Body{Choices: 1, PromptChars: 10, MaxTokens: 50, HasMaxTokens: true},
		},
		{name: "an endpoint out of the table reads as any", ep: Endpoint(200), give: `{"input":"ab"}`, want: Body{Choices: 1, PromptChars: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseBody([]byte(tt.give), "model", tt.ep, false)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
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

func TestEstimateImagesAndEndpoints(t *testing.T) {
	t.Parallel()
	set := &Settings{CharsPerToken: 4, DefaultMaxTokens: 256, ImageTokens: [imageDetails]uint64{ImageLow: 85, ImageHigh: 1445, ImageAuto: 1000}}
	tests := []struct {
		name string
		give Body
		want uint64
	}{
		{name: "images by detail", give: Body{Endpoint: EndpointChat, Choices: 1, HasMaxTokens: true, Images: [imageDetails]uint64{2, 1, 3}}, want: 2*85 + 1445 + 3*1000},
		{name: "tool characters count with the prompt's", give: Body{Endpoint: EndpointChat, Choices: 1, HasMaxTokens: true, PromptChars: 2, ToolChars: 2}, want: 1},
		{name: "embeddings: no output", give: Body{Endpoint: EndpointEmbeddings, Choices: 1, PromptChars: 8, MaxTokens: 50, HasMaxTokens: true}, want: 2},
		{name: "any path: at least the default output", give: Body{Choices: 1, MaxTokens: 10, HasMaxTokens: true}, want: 256},
		{name: "any path: a cap above the default", give: Body{Choices: 1, MaxTokens: 300, HasMaxTokens: true}, want: 300},
		{name: "chat: a cap below the default", give: Body{Endpoint: EndpointChat, Choices: 1, MaxTokens: 10, HasMaxTokens: true}, want: 10},
		{name: "best_of above n", give: Body{Endpoint: EndpointCompletions, Choices: 2, BestOf: 5, MaxTokens: 10, HasMaxTokens: true}, want: 50},
		{name: "n above best_of", give: Body{Endpoint: EndpointCompletions, Choices: 6, BestOf: 5, MaxTokens: 10, HasMaxTokens: true}, want: 60},
		{name: "images clamped", give: Body{Choices: 1, HasMaxTokens: true, Images: [imageDetails]uint64{0, maxCost, 0}}, want: maxCost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got, _ := estimate(&tt.give, set, false, 0); got != tt.want {
				t.Errorf("estimate = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestParseSettingsImageTokens(t *testing.T) {
	t.Parallel()
	const head = "domain: ai\nkeys_file: k\ndescriptors: [[{key: tenant, from: tenant}]]\n"
	tests := []struct {
		name    string
		give    string
		want    [imageDetails]uint64
		wantErr string
	}{
		{name: "defaults", give: head, want: [imageDetails]uint64{85, 1445, 1445}},
		{name: "some set", give: head + "estimate: {image_tokens: {high: 2000}}\n", want: [imageDetails]uint64{85, 2000, 1445}},
		{name: "not a mapping", give: head + "estimate: {image_tokens: 5}\n", wantErr: "authz.yaml:4: estimate.image_tokens: want a mapping with keys low|high|auto, got 5"},
		{name: "unknown detail", give: head + "estimate: {image_tokens: {medium: 5}}\n", wantErr: "authz.yaml:4: estimate.image_tokens.medium: unknown key"},
		{name: "negative", give: head + "estimate: {image_tokens: {low: -1}}\n", wantErr: "authz.yaml:4: estimate.image_tokens.low:"},
		{name: "too large", give: head + "estimate: {image_tokens: {auto: 2000000}}\n", wantErr: "authz.yaml:4: estimate.image_tokens.auto:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := ParseSettings("authz.yaml", []byte(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSettings error = %v, want one starting %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSettings: %v", err)
			}
			if s.ImageTokens != tt.want {
				t.Errorf("ImageTokens = %v, want %v", s.ImageTokens, tt.want)
			}
		})
	}
}

// FuzzEstimateTable: for any body and every row of the table, ParseBody
// answers without a panic, counts no more than the body holds, never
// reads less than a second reader over encoding/json's tree of the same
// body finds in the row's fields (a body whose keys repeat a read field,
// or fold to one, is refused, with such a key in it), and an unknown
// path never estimates less than a known one.
func FuzzEstimateTable(f *testing.F) {
	for _, s := range referenceSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"abc"},{"type":"input_image","image_url":"u","detail":"high"}]},{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":"ok"}],"instructions":"x","max_output_tokens":9}`,
		`{"input":["ab",[1,2],3,{"content":"x"}],"prompt":[[1],"a"],"suffix":"s","best_of":3,"n":2}`,
		`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"u","detail":"low"}},{"text":"a","detail":"high","type":"input_image"}],"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"instructions":[{"content":[{"text":"é"}]}],"input":{"x":1},"tools":"t","functions":[1,[2]]}`,
		`{"input":[{"content":"a","Content":"bbbb"}],"INSTRUCTIONS":"x","max_output_tokens":1,"max_output_tokens":9}`,
		`{"\u0069nput":[{"t\u0065xt":"abc","ty\u017fe":"input_image"}],"tools":[{"function":{},"\u0066unction":{}}]}`,
		`{"messages":[{"content":[{"image_url":{"detail":"low","DETAIL":"high"}}],"tool_calls":[{"function":{"name":"f","NAME":"ggggg"}}]}]}`,
	} {
		f.Add([]byte(s))
	}
	set := &Settings{CharsPerToken: 4, DefaultMaxTokens: 256, ImageTokens: [imageDetails]uint64{85, 1445, 1445}}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		var tree map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		treeErr := dec.Decode(&tree)
		var any uint64
		anyOK := false
		for _, ep := range []Endpoint{EndpointAny, EndpointChat, EndpointCompletions, EndpointResponses, EndpointEmbeddings} {
			b, err := ParseBody(data, "model", ep, false)
			if err != nil {
				var be *bodyError
				if !errors.As(err, &be) {
					t.Fatalf("ParseBody(%d) error %T %v is not a bodyError", ep, err, err)
				}
				if be.code == "ambiguous_key" && !ambiguousIn(data, be.param) {
					t.Fatalf("ParseBody(%d) refuses an ambiguous %q, but no object has one", ep, be.param)
				}
				if (be == errNotJSON || be == errNotObject) && treeErr == nil && tree != nil && dec.InputOffset() == int64(len(bytes.TrimRight(data, " \t\r\n"))) {
					t.Fatalf("ParseBody(%d) refused a body encoding/json reads: %v", ep, err)
				}
				continue
			}
			n := uint64(len(data))
			if b.PromptChars > n || b.PromptTokens > n || b.ToolChars > n || b.Images[ImageLow]+b.Images[ImageHigh]+b.Images[ImageAuto] > n {
				t.Fatalf("ParseBody(%d) = %+v, more than %d bytes hold", ep, b, n)
			}
			if treeErr == nil && tree != nil {
				var want treeCount
				want.row(tree, &endpoints[ep])
				images := b.Images[ImageLow] + b.Images[ImageHigh] + b.Images[ImageAuto]
				if b.PromptChars < want.chars || b.PromptTokens < want.tokens || images < want.images || b.MaxTokens < want.maxTokens {
					t.Fatalf("ParseBody(%d) = %+v; encoding/json's tree holds %+v", ep, b, want)
				}
			}
			total, _ := estimate(&b, set, false, 0)
			if ep == EndpointAny {
				any, anyOK = total, true
			} else if anyOK && total > any {
				t.Fatalf("an unknown path estimates %d, endpoint %d %d", any, ep, total)
			}
		}
	})
}

// treeCount is what a row's fields hold in encoding/json's tree of a
// body: an independent reading of the table, for FuzzEstimateTable.
type treeCount struct {
	chars, tokens, images, maxTokens uint64
}

func (c *treeCount) row(body map[string]any, row *endpoint) {
	for _, f := range row.fields {
		v, ok := body[f.name]
		if !ok {
			continue
		}
		switch f.kind {
		case kindOutput:
			if n, ok := v.(json.Number); ok {
				if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
					c.maxTokens = max(c.maxTokens, min(u, maxCost))
				}
			}
		case kindMessages:
			for _, m := range asList(v) {
				if m, ok := m.(map[string]any); ok {
					c.content(m["content"])
				}
			}
		case kindPrompt:
			c.text(v)
			for _, p := range asList(v) {
				c.text(p)
				c.ids(p)
				for _, id := range asList(p) {
					c.ids(id)
				}
			}
		case kindInput, kindText:
			c.text(v)
			for _, it := range asList(v) {
				c.item(it)
			}
		}
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func (c *treeCount) text(v any) {
	if s, ok := v.(string); ok {
		c.chars += uint64(utf8.RuneCountInString(s))
	}
}

func (c *treeCount) ids(v any) {
	if _, ok := v.(json.Number); ok {
		c.tokens++
	}
}

func (c *treeCount) content(v any) {
	c.text(v)
	for _, p := range asList(v) {
		c.text(p)
		if m, ok := p.(map[string]any); ok {
			c.part(m)
		}
	}
}

func (c *treeCount) part(m map[string]any) {
	c.text(m["text"])
	_, hasURL := m["image_url"]
	if typ, _ := m["type"].(string); hasURL || typ == "image_url" || typ == "input_image" {
		c.images++
	}
}

func (c *treeCount) item(v any) {
	c.text(v)
	c.ids(v)
	for _, id := range asList(v) {
		c.ids(id)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	c.part(m)
	c.content(m["content"])
	c.content(m["output"])
	c.content(m["summary"])
}
