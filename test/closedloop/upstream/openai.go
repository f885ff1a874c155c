package upstream

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// chatRequest is what the upstream reads of an OpenAI chat completions
// body. n is not read: every response has one choice.
type chatRequest struct {
	model        []byte // the model, JSON-quoted, to echo back
	promptTokens int
	maxTokens    int
	stream       bool
	includeUsage bool
}

// chatBody is the JSON shape parseChat decodes.
type chatBody struct {
	Model    string `json:"model"`
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	Stream              bool   `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// contentPart is one part of a message's content given as a list.
type contentPart struct {
	Text string `json:"text"`
}

// clientError is a malformed request's message, fit for the client: it
// never quotes the body.
type clientError string

func (e clientError) Error() string { return string(e) }

const (
	errBodyJSON      clientError = "The request body is not a valid chat completions JSON object."
	errBodyMessages  clientError = "messages must be a non-empty list."
	errBodyContent   clientError = "A message's content must be a string, a list of parts or null."
	errBodyMaxTokens clientError = "max_tokens and max_completion_tokens must be integers from 1 to the limit."
)

// parseChat reads a chat completions body: its prompt tokens are the
// characters (runes) of every message's text over c.CharsPerToken, rounded
// up, as Tollgate estimates them; its max_tokens is the larger of
// max_tokens and max_completion_tokens, as Tollgate reads them. The
// errors are fit for the client: they never quote the body.
func parseChat(body []byte, c *Config) (chatRequest, error) {
	var b chatBody
	if err := json.Unmarshal(body, &b); err != nil {
		return chatRequest{}, errBodyJSON
	}
	if len(b.Messages) == 0 {
		return chatRequest{}, errBodyMessages
	}
	chars := 0
	for _, m := range b.Messages {
		n, err := contentChars(m.Content)
		if err != nil {
			return chatRequest{}, err
		}
		chars += n
	}
	maxTokens := int64(c.DefaultMaxTokens)
	if b.MaxTokens != nil || b.MaxCompletionTokens != nil {
		maxTokens = max(deref(b.MaxTokens), deref(b.MaxCompletionTokens))
		if maxTokens < 1 || maxTokens > int64(c.MaxTokensLimit) ||
			b.MaxTokens != nil && *b.MaxTokens < 1 || b.MaxCompletionTokens != nil && *b.MaxCompletionTokens < 1 {
			return chatRequest{}, errBodyMaxTokens
		}
	}
	model, err := json.Marshal(b.Model)
	if err != nil {
		return chatRequest{}, errBodyJSON
	}
	return chatRequest{
		model:        model,
		promptTokens: int(math.Ceil(float64(chars) / c.CharsPerToken)),
		maxTokens:    int(maxTokens),
		stream:       b.Stream,
		includeUsage: b.Stream && b.StreamOptions != nil && b.StreamOptions.IncludeUsage,
	}, nil
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// contentChars counts the runes of a message's content: a string, or the
// text of each part of a list; null or absent is empty.
func contentChars(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, errBodyContent
		}
		return utf8.RuneCountInString(s), nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return 0, errBodyContent
		}
		n := 0
		for _, p := range parts {
			n += utf8.RuneCountInString(p.Text)
		}
		return n, nil
	}
	return 0, errBodyContent
}

// tokenText is one generated token's text: four characters, so that the
// completion's text at CharsPerToken 4 counts as many tokens as usage says.
const tokenText = "tok "

// completion is one response's identity and size.
type completion struct {
	id      uint64
	created int64
	req     *chatRequest
	tokens  int // completion tokens
}

func (c *completion) finishReason() string {
	if c.tokens >= c.req.maxTokens {
		return `"length"`
	}
	return `"stop"`
}

func appendUsage(b []byte, prompt, completion int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	return append(b, '}')
}

func appendHead(b []byte, c *completion, object string) []byte {
	b = append(b, `{"id":"chatcmpl-sim-`...)
	b = strconv.AppendUint(b, c.id, 10)
	b = append(b, `","object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, c.created, 10)
	b = append(b, `,"model":`...)
	return append(b, c.req.model...)
}

func appendTokens(b []byte, n int) []byte {
	for range n {
		b = append(b, tokenText...)
	}
	return b
}

// appendJSON appends the whole chat.completion response.
func appendJSON(b []byte, c *completion) []byte {
	b = appendHead(b, c, "chat.completion")
	b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	b = appendTokens(b, c.tokens)
	b = append(b, `"},"logprobs":null,"finish_reason":`...)
	b = append(b, c.finishReason()...)
	b = append(b, `}],"usage":`...)
	b = appendUsage(b, c.req.promptTokens, c.tokens)
	return append(b, "}\n"...)
}

// appendChunk appends one SSE event with the tokens (from, to] of the
// completion; the first carries the assistant role, and the one with the
// last token is followed by the finish_reason event, the usage event when
// include_usage asked for it, and data: [DONE].
func appendChunk(b []byte, c *completion, from, to int) []byte {
	b = append(b, "data: "...)
	b = appendHead(b, c, "chat.completion.chunk")
	b = append(b, `,"choices":[{"index":0,"delta":{`...)
	if from == 0 {
		b = append(b, `"role":"assistant",`...)
	}
	b = append(b, `"content":"`...)
	b = appendTokens(b, to-from)
	b = append(b, `"},"logprobs":null,"finish_reason":null}]`...)
	b = appendNullUsage(b, c)
	if to < c.tokens {
		return b
	}
	b = append(b, "data: "...)
	b = appendHead(b, c, "chat.completion.chunk")
	b = append(b, `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
	b = append(b, c.finishReason()...)
	b = append(b, "}]"...)
	b = appendNullUsage(b, c)
	if c.req.includeUsage {
		b = append(b, "data: "...)
		b = appendHead(b, c, "chat.completion.chunk")
		b = append(b, `,"choices":[],"usage":`...)
		b = appendUsage(b, c.req.promptTokens, c.tokens)
		b = append(b, "}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

// appendNullUsage ends a chunk: with include_usage every chunk but the
// last carries "usage":null, as OpenAI's do.
func appendNullUsage(b []byte, c *completion) []byte {
	if c.req.includeUsage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, "}\n\n"...)
}

// writeError answers an OpenAI-style error JSON.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b := make([]byte, 0, 96+len(msg))
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	if code == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, code)
	}
	b = append(b, "}}\n"...)
	_, _ = w.Write(b)
}

// appendJSONString appends s as a JSON string. s may echo input (a mode's
// decoding error), which strconv.Quote would not always make valid JSON.
func appendJSONString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // a string always encodes
		return append(b, `""`...)
	}
	return append(b, q...)
}

// write429 answers as a vendor over its rate limit: Retry-After in whole
// seconds (at least 1) and the x-ratelimit-*-requests headers OpenAI sends.
func write429(w http.ResponseWriter, rate float64, wait time.Duration) {
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(max(wait.Seconds(), 1))), 10))
	h.Set("X-Ratelimit-Limit-Requests", strconv.FormatFloat(rate, 'f', -1, 64))
	h.Set("X-Ratelimit-Remaining-Requests", "0")
	h.Set("X-Ratelimit-Reset-Requests", wait.Round(time.Millisecond).String())
	writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
		"Rate limit reached for requests on this simulated upstream; retry after the time in Retry-After.")
}
