package extproc

import "context"

// Usage is what one response said about the tokens it cost, as far as the
// reader could see it.
type Usage struct {
	// Input, Output and Total are the token counts of the response's
	// usage object (chat/completions prompt_tokens, completion_tokens,
	// total_tokens; Responses API input_tokens, output_tokens,
	// total_tokens). Total is total_tokens, or Input+Output when that is
	// larger or total_tokens is absent (saturating). All three are 0
	// unless Reported.
	Input, Output, Total uint64
	// Reported says the response carried a valid usage object: a JSON
	// body's, or, in a text/event-stream, the last event's that had one
	// before data: [DONE].
	Reported bool
	// StreamedChars counts the characters of the streamed text deltas
	// (chat choices[].delta.content, reasoning_content and tool call
	// arguments; Responses API output text, refusal, reasoning and
	// function call argument deltas), so that a stream without usage can
	// still be charged for what it sent.
	StreamedChars uint64
	// Complete says the response body's end was seen (end_of_stream on
	// the body or the headers, or the trailers). False means the stream
	// ended early: the client went away, the upstream reset, or Envoy
	// closed the ext_proc stream before the body ended.
	Complete bool
	// Status is the response's :status, 0 when the headers were not seen.
	Status int
}

// Settler settles the reservation a ticket stands for, once, with what
// the response said. Settle is called at most once per ext_proc stream,
// on the stream's goroutine after the response ended (Envoy does not
// wait for it in observability mode), with a context that carries the
// settle timeout and is not cancelled when Envoy closes the stream. The
// ticket is the raw string Check put in the dynamic metadata: the Settler
// verifies it.
type Settler interface {
	Settle(ctx context.Context, ticket string, u Usage)
}
