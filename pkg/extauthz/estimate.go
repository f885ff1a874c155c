package extauthz

import "math"

// estimate is a request's token cost: its prompt at charsPerToken
// characters a token, plus the completions it may generate. A partial
// body counts every byte of the whole body (bodyBytes: its size, or the
// fewest bytes it can have when that is unknown) as a prompt character,
// which can only overestimate the prompt.
// It also returns the prompt's part of the total (the rest is the
// completions' allowance), which a stream that ends without a usage
// report is settled from.
//
// Images cost Settings.ImageTokens by their detail; an endpoint that
// generates nothing (embeddings) has no completions, and an unknown path
// at least the default.
func estimate(b *Body, s *Settings, partial bool, bodyBytes int64) (total, promptPart uint64) {
	// Both counts are at most the body's length: no overflow.
	chars := b.PromptChars + b.ToolChars
	if partial {
		chars = max(chars, uint64(max(bodyBytes, 0)))
	}
	prompt := math.Ceil(float64(chars) / s.CharsPerToken)
	for d, n := range b.Images {
		prompt += float64(n) * float64(s.ImageTokens[d])
	}
	completion := s.DefaultMaxTokens
	switch {
	case int(b.Endpoint) < len(endpoints) && endpoints[b.Endpoint].noOutput:
		completion = 0
	case b.Endpoint == EndpointAny:
		// A cap is read from every row's fields, and a row that does not
		// have the field given would take the default: at least that.
		completion = max(completion, b.MaxTokens)
	case b.HasMaxTokens:
		completion = b.MaxTokens
	}
	in := prompt + float64(b.PromptTokens)
	all := in + float64(completion)*float64(max(b.Choices, b.BestOf, 1))
	if all >= maxCost {
		return maxCost, uint64(min(in, maxCost))
	}
	return uint64(all), uint64(in)
}
