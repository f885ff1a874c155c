package closedloop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// maxResponseBytes bounds what Direct reads of one answer: a model
// answer of the sizes the driver asks for is a few kilobytes, and a
// hostile or broken upstream must not make the bench hold gigabytes.
const maxResponseBytes = 4 << 20

// Direct is the "no gateway" Gateway: each request goes straight to the
// upstream over plain HTTP, with no Tollgate and no retries. It is the
// comparison the issue measures Tollgate against (an unprotected FIFO
// upstream) and what the bench's own tests run on.
type Direct struct {
	base   string
	client *http.Client
}

var _ Gateway = (*Direct)(nil)

// NewDirect returns a Direct gateway to the upstream at baseURL
// (http://host:port, no trailing slash). maxConns bounds its connections,
// as Envoy's cluster circuit breaker max_connections does; 0 means 1024.
func NewDirect(baseURL string, maxConns int) *Direct {
	if maxConns <= 0 {
		maxConns = 1024
	}
	tr := &http.Transport{
		MaxConnsPerHost:     maxConns,
		MaxIdleConnsPerHost: maxConns,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Direct{base: baseURL, client: &http.Client{Transport: tr}}
}

// Do sends r to the upstream and waits for the whole answer or r.Timeout.
func (d *Direct) Do(ctx context.Context, r *Request) Result {
	start := time.Now()
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, d.base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		// A Request the driver built is always valid; a broken one is
		// answered as Envoy answers a request it cannot route.
		return Result{Status: http.StatusBadRequest, Source: SourceEnvoy, Latency: time.Since(start)}
	}
	for k, vs := range r.Header {
		req.Header[k] = vs
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return failed(ctx, start, 0)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		// A cut answer after the headers: the client saw the status but
		// not the body, as Envoy reports a reset after headers.
		return failed(ctx, start, 1)
	}
	res := Result{
		Status:     resp.StatusCode,
		Source:     SourceUpstream,
		Latency:    time.Since(start),
		Attempts:   1,
		RetryAfter: RetryAfter(resp.Header.Get("Retry-After")),
	}
	if resp.StatusCode/100 == 2 {
		res.PromptTokens, res.CompletionTokens = ParseUsage(body, r.Stream)
	}
	return res
}

// failed is the Result of a request that got no whole answer: the
// client's give-up when its context ended, else a connection failure
// answered as Envoy answers one (503, upstream connect error).
func failed(ctx context.Context, start time.Time, attempts int) Result {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.Canceled) {
		return Result{Source: SourceClient, Latency: time.Since(start), Attempts: max(attempts, 1)}
	}
	return Result{Status: http.StatusServiceUnavailable, Source: SourceEnvoy, Latency: time.Since(start), Attempts: attempts}
}

// Close releases Direct's idle connections; it owes nothing else.
func (d *Direct) Close() error {
	d.client.CloseIdleConnections()
	return nil
}

// RetryAfter reads a Retry-After header given in seconds (the form
// Tollgate and the simulated upstream send); anything else is 0.
func RetryAfter(v string) time.Duration {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 86400 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// usageDoc is the part of an OpenAI chat completion (or SSE chunk) that
// carries usage.
type usageDoc struct {
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// ParseUsage returns the usage an answer reports: the JSON body's usage,
// or for a stream the last SSE data chunk that carries one (with
// stream_options.include_usage the final chunk before [DONE]). A body
// without usage, or one that is not what it claims, is 0, 0.
func ParseUsage(body []byte, stream bool) (prompt, completion int64) {
	if !stream {
		var d usageDoc
		if json.Unmarshal(body, &d) != nil || d.Usage == nil {
			return 0, 0
		}
		return max(d.Usage.PromptTokens, 0), max(d.Usage.CompletionTokens, 0)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 4096), maxResponseBytes)
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		line = bytes.TrimSpace(line)
		if !bytes.Contains(line, []byte(`"usage"`)) {
			continue
		}
		var d usageDoc
		if json.Unmarshal(line, &d) == nil && d.Usage != nil {
			prompt, completion = max(d.Usage.PromptTokens, 0), max(d.Usage.CompletionTokens, 0)
		}
	}
	return prompt, completion
}
