package extauthz

import "strings"

// Endpoint is the API a request body is for, picked by the request path;
// it decides which body fields the estimate reads (endpoints).
type Endpoint uint8

const (
	// EndpointAny is a path the table does not know: every field of
	// every endpoint is read, and output is estimated, so that no path
	// buys a cheaper estimate than a known one.
	EndpointAny Endpoint = iota
	EndpointChat
	EndpointCompletions
	EndpointResponses
	EndpointEmbeddings
)

// fieldKind is how the estimate reads a body field.
type fieldKind uint8

const (
	// kindOutput is a cap on the tokens generated: the largest given
	// counts.
	kindOutput fieldKind = iota + 1
	// kindChoices is n: the completions asked for.
	kindChoices
	// kindBestOf is best_of: the completions generated server-side.
	kindBestOf
	// kindMessages is chat messages: each one's content (a string, or
	// parts: text and images), and its tool_calls' / function_call's
	// names and arguments.
	kindMessages
	// kindPrompt is a completions prompt: a string, a list of strings, or
	// token IDs (a list, or a list of lists).
	kindPrompt
	// kindInput is a Responses or embeddings input: a string, token IDs,
	// strings, or items whose content is a string or parts.
	kindInput
	// kindText is a string, or a list of items as kindInput reads them
	// (instructions may be either).
	kindText
	// kindTools is tool definitions (tools, functions), which the model
	// reads as text: each member's JSON counts as characters, a chat
	// tool's "function" object's members as the tool's own, so that the
	// same tool costs the same in chat and in the Responses API, which
	// does not nest them.
	kindTools
)

// field is one body field the estimate reads.
type field struct {
	name string
	kind fieldKind
}

// endpoint is one row of the estimate's table.
type endpoint struct {
	// suffix is the end of the path (without query) that picks the row.
	suffix string
	// noOutput: the API generates no tokens (embeddings), whatever the
	// body asks.
	noOutput bool
	fields   []field
}

// endpoints is the estimate's table: what each API's body costs. It is
// written out in docs/estimate.md; keep the two together.
var endpoints = [...]endpoint{
	EndpointChat: {suffix: "/chat/completions", fields: []field{
		{"messages", kindMessages},
		{"tools", kindTools}, {"functions", kindTools},
		{"max_tokens", kindOutput}, {"max_completion_tokens", kindOutput},
		{"n", kindChoices},
	}},
	EndpointCompletions: {suffix: "/completions", fields: []field{
		{"prompt", kindPrompt}, {"suffix", kindText},
		{"max_tokens", kindOutput},
		{"n", kindChoices}, {"best_of", kindBestOf},
	}},
	EndpointResponses: {suffix: "/responses", fields: []field{
		{"input", kindInput}, {"instructions", kindText},
		{"tools", kindTools},
		{"max_output_tokens", kindOutput},
	}},
	EndpointEmbeddings: {suffix: "/embeddings", noOutput: true, fields: []field{
		{"input", kindInput},
	}},
	EndpointAny: {fields: []field{
		{"messages", kindMessages}, {"prompt", kindPrompt}, {"suffix", kindText},
		{"input", kindInput}, {"instructions", kindText},
		{"tools", kindTools}, {"functions", kindTools},
		{"max_tokens", kindOutput}, {"max_completion_tokens", kindOutput}, {"max_output_tokens", kindOutput},
		{"n", kindChoices}, {"best_of", kindBestOf},
	}},
}

// EndpointOf picks the table's row for a request path: by its end, so
// that a prefix (/v1, /openai/deployments/NAME) or a query string
// (?api-version=...) does not matter. A path it does not know is
// EndpointAny.
func EndpointOf(path string) Endpoint {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	// /chat/completions before /completions: the longer suffix first.
	for _, e := range [...]Endpoint{EndpointChat, EndpointCompletions, EndpointResponses, EndpointEmbeddings} {
		if strings.HasSuffix(path, endpoints[e].suffix) {
			return e
		}
	}
	return EndpointAny
}
