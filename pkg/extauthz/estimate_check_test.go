package extauthz

import (
	"fmt"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// estimateSettings is testSettings with room for larger bodies; images at
// their default costs (85 low, 1445 high and auto).
const estimateSettings = `
domain: ai
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
model: {body_field: model, header: x-model}
estimate: {chars_per_token: 4, default_max_tokens: 100, max_body_bytes: 65536}
`

// apiRequest is checkRequest for a POST to path.
func apiRequest(path, body string, kv ...string) *authv3.CheckRequest {
	req := checkRequest(body, kv...)
	req.GetAttributes().GetRequest().GetHttp().Path = path
	return req
}

// acmeRequest is apiRequest with the acme key, for model m when the body
// names none: the token budget is per model.
func acmeRequest(path, body string) *authv3.CheckRequest {
	return apiRequest(path, body, "authorization", bearer(keyAcme), "x-model", "m")
}

// reservedTokens is what an OK answer reserved; it fails the test on a
// denial.
func reservedTokens(t testing.TB, resp *authv3.CheckResponse) uint64 {
	t.Helper()
	if resp.GetOkResponse() == nil {
		t.Fatalf("Check denied: %v", resp.GetDeniedResponse())
	}
	v, ok := resp.GetDynamicMetadata().GetFields()["reserved_tokens"]
	if !ok {
		t.Fatalf("Check reserved nothing: %v", resp.GetDynamicMetadata())
	}
	return uint64(v.GetNumberValue())
}

// letters is n characters of text.
func letters(n int) string { return strings.Repeat("abcd", n/4) + "abcd"[:n%4] }

// chatTool is a function tool as chat/completions defines it, respTool
// the same tool as the Responses API does.
const (
	chatTool = `{"type":"function","function":{"name":"get_weather","description":"The weather in a city, now.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`
	respTool = `{"type":"function","name":"get_weather","description":"The weather in a city, now.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`
)

// toolChars is what chatTool and respTool count as: each member's key in
// quotes, its colon and its value, a chat tool's function members as
// the tool's own.
var toolChars = len(`"type":"function"`) + len(`"name":"get_weather"`) + len(`"description":"The weather in a city, now."`) +
	len(`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)

// TestCheckEstimatesEveryAPI: Check reserves a request's prompt and
// output for every API of the table, by the request path. On the code
// before the table, the Responses-API, image, tool, best_of and
// embeddings cases reserved the default output and no prompt.
func TestCheckEstimatesEveryAPI(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		path string
		give string
		want uint64
	}{
		{
			name: "responses: a large string input and max_output_tokens",
			path: "/v1/responses",
			give: fmt.Sprintf(`{"model":"m","input":%q,"max_output_tokens":500}`, letters(20000)),
			want: 20000/4 + 500, // 20,000 characters at 4 a token, and the output asked for
		},
		{
			name: "responses: instructions, items with parts, an image, a function call and its output",
			path: "/v1/responses",
			give: fmt.Sprintf(`{"model":"m","instructions":%q,"input":[`+
				`{"role":"user","content":[{"type":"input_text","text":%q},{"type":"input_image","image_url":"https://img.example/x.png","detail":"low"}]},`+
				`{"type":"function_call","call_id":"c1","name":"f","arguments":%q},`+
				`{"type":"function_call_output","call_id":"c1","output":%q}],"max_output_tokens":50}`,
				letters(400), letters(800), letters(39), letters(80)),
			want: (400+800+1+39+80)/4 + 85 + 50,
		},
		{
			name: "chat: text and image parts, a tool, max_completion_tokens",
			path: "/v1/chat/completions",
			give: fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":%q},`+
				`{"type":"image_url","image_url":{"url":"https://img.example/x.png","detail":"high"}}]}],"tools":[%s],"max_completion_tokens":10}`,
				letters(400), chatTool),
			want: uint64((400+toolChars+3)/4) + 1445 + 10,
		},
		{
			name: "chat: an image without detail costs auto",
			path: "/openai/deployments/gpt/chat/completions?api-version=2024-10-21",
			give: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"max_tokens":0}`,
			want: 1445,
		},
		{
			name: "completions: prompt strings, best_of over n",
			path: "/v1/completions",
			give: fmt.Sprintf(`{"model":"m","prompt":[%q,%q],"max_tokens":10,"n":2,"best_of":5}`, letters(400), letters(400)),
			want: 200 + 5*10,
		},
		{
			name: "embeddings: input strings, no output",
			path: "/v1/embeddings",
			give: fmt.Sprintf(`{"model":"m","input":[%q,%q]}`, letters(400), letters(400)),
			want: 200,
		},
		{
			name: "embeddings: token IDs, no output",
			path: "/v1/embeddings",
			give: `{"model":"m","input":[[1,2,3],[4,5]]}`,
			want: 5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, memstore.New(), newSettings(t, estimateSettings), nil)
			if got := reservedTokens(t, h.check(t, acmeRequest(tt.path, tt.give))); got != tt.want {
				t.Errorf("Check reserved %d tokens, want %d", got, tt.want)
			}
		})
	}
}

// TestCheckResponsesReservesAtLeastChat: the same content sent through
// the Responses API reserves at least what it does through
// chat/completions, so that no client saves by switching APIs.
func TestCheckResponsesReservesAtLeastChat(t *testing.T) {
	t.Parallel()
	sys, user, args, result := letters(1200), letters(2000), `{"city":"Paris"}`, letters(300)
	tests := []struct {
		name      string
		chat      string
		responses string
	}{
		{
			name:      "instructions and a string input",
			chat:      fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":300}`, sys, user),
			responses: fmt.Sprintf(`{"instructions":%q,"input":%q,"max_output_tokens":300}`, sys, user),
		},
		{
			name:      "message items",
			chat:      fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, user),
			responses: fmt.Sprintf(`{"input":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, user),
		},
		{
			name: "text and image parts",
			chat: fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"text","text":%q},`+
				`{"type":"image_url","image_url":{"url":"https://img.example/a.png","detail":"low"}},`+
				`{"type":"image_url","image_url":{"url":"https://img.example/b.png"}}]}],"max_completion_tokens":40}`, user),
			responses: fmt.Sprintf(`{"input":[{"role":"user","content":[{"type":"input_text","text":%q},`+
				`{"type":"input_image","image_url":"https://img.example/a.png","detail":"low"},`+
				`{"type":"input_image","image_url":"https://img.example/b.png"}]}],"max_output_tokens":40}`, user),
		},
		{
			name:      "tools, a call and its result",
			chat:      fmt.Sprintf(`{"tools":[%s],"messages":[{"role":"user","content":%q},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":%q}}]},{"role":"tool","tool_call_id":"c1","content":%q}],"max_tokens":20}`, chatTool, user, args, result),
			responses: fmt.Sprintf(`{"tools":[%s],"input":[{"role":"user","content":%q},{"type":"function_call","call_id":"c1","name":"get_weather","arguments":%q},{"type":"function_call_output","call_id":"c1","output":%q}],"max_output_tokens":20}`, respTool, user, args, result),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, memstore.New(), newSettings(t, estimateSettings), nil)
			chat := reservedTokens(t, h.check(t, acmeRequest("/v1/chat/completions", tt.chat)))
			responses := reservedTokens(t, h.check(t, acmeRequest("/v1/responses", tt.responses)))
			if responses < chat {
				t.Errorf("Responses API reserved %d tokens, chat/completions %d for the same content", responses, chat)
			}
			// Content, not the default: the test would hold vacuously if
			// both read nothing.
			if min(chat, responses) < uint64(len(user))/4 {
				t.Errorf("reserved %d (chat) and %d (responses), less than the user text's %d tokens", chat, responses, len(user)/4)
			}
		})
	}
}
