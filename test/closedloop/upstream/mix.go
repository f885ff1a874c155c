package upstream

import (
	"encoding/json"
	"strings"
)

// ChatBody is a chat completions body of model with one user message of
// promptChars characters (promptChars/4 prompt tokens, rounded up) and
// max_tokens maxTokens; with stream it asks for SSE with
// stream_options.include_usage. ChatBody("m", MixPromptChars,
// MixMaxTokens, false) is a request of the default mix.
func ChatBody(model string, promptChars, maxTokens int, stream bool) []byte {
	type options struct {
		IncludeUsage bool `json:"include_usage"`
	}
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := struct {
		Model         string    `json:"model"`
		Messages      []message `json:"messages"`
		MaxTokens     int       `json:"max_tokens"`
		Stream        bool      `json:"stream,omitempty"`
		StreamOptions *options  `json:"stream_options,omitempty"`
	}{
		Model:     model,
		Messages:  []message{{Role: "user", Content: strings.Repeat("word", max(promptChars, 0)/4) + "wor"[:max(promptChars, 0)%4]}},
		MaxTokens: maxTokens,
		Stream:    stream,
	}
	if stream {
		body.StreamOptions = &options{IncludeUsage: true}
	}
	b, _ := json.Marshal(body) // strings, ints and bools always encode
	return b
}
