// Package closedloop is issue 13's closed-loop test bench: a model
// upstream with real capacity, a gateway that behaves as Envoy's filter
// chain does in front of it (envoysim), a traffic driver, and scenarios
// that assert the laws of overload control on three tollgate replicas and
// one real Redis.
//
// This file is the contract between the parts: the driver sends Requests
// through a Gateway and records Results. envoysim.Gateway is the Envoy-
// faithful one; Direct (no gateway at all) is the comparison.
package closedloop

import (
	"context"
	"net/http"
	"time"
)

// Request is one client request, as the client sends it to Envoy.
type Request struct {
	// Tenant, Tier and Model label the request for the recorder; the
	// gateway sees only what Header and Body carry.
	Tenant, Tier, Model string
	// Method and Path are the HTTP request line (POST
	// /v1/chat/completions).
	Method, Path string
	// Header holds the client's headers (authorization, content-type,
	// x-sim-tenant for the upstream's own accounting).
	Header http.Header
	// Body is the JSON body (OpenAI chat completions).
	Body []byte
	// Stream is true when the body asks for SSE (stream: true).
	Stream bool
	// Timeout is the client's: it gives up (and cancels) after it.
	Timeout time.Duration
}

// Source says who answered a request.
type Source int

const (
	// SourceUpstream: the model upstream answered (any status).
	SourceUpstream Source = iota
	// SourceTollgate: Tollgate denied it (ext_authz Denied or RLS
	// OVER_LIMIT turned into a local reply).
	SourceTollgate
	// SourceEnvoy: Envoy answered itself (a Check that failed or timed out
	// under failure_mode_allow: false, a 413 body, no healthy upstream).
	SourceEnvoy
	// SourceClient: the client gave up before an answer (its Timeout).
	SourceClient
)

// Result is what the client saw, plus what the gateway knows of it.
type Result struct {
	Status int
	Source Source
	// Reason is x-tollgate-reason on a Tollgate denial (rate_limited,
	// shed, breaker, ...), empty otherwise.
	Reason string
	// RetryAfter is the Retry-After the client got, 0 without one.
	RetryAfter time.Duration
	// Latency is from the client's send to its last byte (or its give-up).
	Latency time.Duration
	// Attempts is how many times the gateway sent it upstream (retries
	// included); 0 when it never went upstream.
	Attempts int
	// PromptTokens and CompletionTokens are the usage the upstream
	// reported in the response the client got (0 when none).
	PromptTokens, CompletionTokens int64
	// MaxRetries is the x-envoy-max-retries the router saw after the
	// authorization filter (Tollgate's retry budget); -1 when the request
	// had none (or never got that far), since 0 is a budget.
	MaxRetries int
	// Check is how long the authorization call took, from its send to its
	// answer or the filter's timeout (0 when none was made): a request the
	// admission queue held waited at most this long. CheckAfter is from
	// the client's send to the Check's.
	Check, CheckAfter time.Duration
	// Replica is the index, in GatewayConfig.Replicas, of the replica that
	// answered the authorization call; -1 when none was made.
	Replica int
}

// Gateway sends a request the way a client's request goes through a
// proxy to the upstream. Do is safe for concurrent use and returns when
// the client has its answer or gave up; it never blocks past r.Timeout
// plus the gateway's own bounded work (flushing nothing synchronously).
type Gateway interface {
	Do(ctx context.Context, r *Request) Result
	// Close flushes what the gateway still owes (access log batches) and
	// releases its connections.
	Close() error
}
