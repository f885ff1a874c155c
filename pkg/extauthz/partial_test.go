package extauthz

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// envoyBody is how Envoy's ext_authz filter is set up, and what the
// client sent, for envoyCheck.
type envoyBody struct {
	// maxRequestBytes is with_request_body.max_request_bytes, with
	// allow_partial_message and pack_as_bytes; 0 is no with_request_body.
	maxRequestBytes int
	// noLength: the client sent no content-length (HTTP/2 may not; a
	// chunked HTTP/1.1 body has none).
	noLength bool
	// exact: Envoy's buffer filled to exactly max_request_bytes, so it
	// had received no more than it sent and, since it compares the two,
	// wrote partial-body false though more was to come.
	exact bool
}

// envoyChunk is how many bytes past the cut Envoy has received when it
// makes the Check: its buffer fills on a chunk boundary, and the chunk
// that fills it is counted in StreamInfo's bytesReceived.
const envoyChunk = 64

// envoyCheck is the CheckRequest Envoy's ext_authz filter makes for a
// client's POST of body with headers kv (name, value pairs), as
// check_request_utils.cc fills it: it drops the client's
// x-envoy-auth-partial-body, sends at most max_request_bytes of the body
// in raw_body with its own x-envoy-auth-partial-body, and puts the body
// bytes received so far, not the content-length, in size.
func envoyCheck(body string, e envoyBody, kv ...string) *authv3.CheckRequest {
	r := checkRequest("", kv...)
	h := r.Attributes.Request.Http
	delete(h.Headers, PartialBodyHeader)
	if !e.noLength {
		h.Headers["content-length"] = strconv.Itoa(len(body))
	}
	h.Size = 0 // without with_request_body, Envoy checks on the headers
	if e.maxRequestBytes > 0 && body != "" {
		sent := min(len(body), e.maxRequestBytes)
		h.RawBody = []byte(body[:sent])
		h.Headers[PartialBodyHeader] = strconv.FormatBool(sent < len(body) && !e.exact)
		h.Size = int64(min(len(body), sent+envoyChunk))
		if e.exact {
			h.Size = int64(sent)
		}
	}
	return r
}

// with sets headers on r (name, value pairs) after Envoy filled it.
func with(r *authv3.CheckRequest, kv ...string) *authv3.CheckRequest {
	for i := 0; i+1 < len(kv); i += 2 {
		r.Attributes.Request.Http.Headers[kv[i]] = kv[i+1]
	}
	return r
}

// modelLastBody is chatBody with the model after the messages, where the
// OpenAI Python SDK puts it.
func modelLastBody(model string, promptChars, maxTokens int) string {
	prompt := make([]byte, promptChars)
	for i := range prompt {
		prompt[i] = 'a' + byte(i%26)
	}
	return fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"model":%q,"max_tokens":%d}`, prompt, model, maxTokens)
}

// TestModelLastBody: the same request as chatBody's, of the same length.
func TestModelLastBody(t *testing.T) {
	t.Parallel()
	var got, want map[string]any
	if err := json.Unmarshal([]byte(modelLastBody("gpt-4o", 30, 5)), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(chatBody("gpt-4o", 30, 5)), &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("modelLastBody (-chatBody +got):\n%s", diff)
	}
	if a, b := len(modelLastBody("gpt-4o", 2000, 5)), len(chatBody("gpt-4o", 2000, 5)); a != bigBody || b != bigBody {
		t.Errorf("bodies of %d and %d bytes, want %d", a, b, bigBody)
	}
}

// cutAt is where Envoy cuts bodies in TestCheckPartialBody: under
// testSettings' max_body_bytes 4096, so that a cut body can be within it.
const cutAt = 256

const (
	// bigBody is chatBody("gpt-4o", 2000, 5)'s length; charged whole as
	// prompt, at 4 characters a token, with default_max_tokens 100 since
	// its max_tokens is after the cut: 519 + 100.
	bigBody       = 2075
	bigBodyTokens = 619
)

func TestCheckPartialBody(t *testing.T) {
	t.Parallel()
	edit := func(old, new string) string {
		if strings.Count(testSettings, old) != 1 {
			t.Fatalf("%q is not in testSettings once", old)
		}
		return strings.Replace(testSettings, old, new, 1)
	}
	headerModel := edit("model: {body_field: model, header: x-model}", `model: {body_field: "", header: x-model}`)
	estimateOption := edit("max_body_bytes: 4096}", "max_body_bytes: 4096, partial_body: estimate}")
	cut := envoyBody{maxRequestBytes: cutAt}
	okHeaders := func(model string) []*corev3.HeaderValueOption {
		return []*corev3.HeaderValueOption{hv(HeaderTenant, "acme"), hv(HeaderTier, "premium"), hv(HeaderModel, model)}
	}
	// rlHeaders are an admission's headers with tokens reserved, and
	// the estimate marker when partial.
	rlHeaders := func(tokens uint64, partial bool) []*corev3.HeaderValueOption {
		hs := rateHeaders(limitHeader, 10000, tokens)
		if partial {
			hs = append(hs, hv(HeaderEstimate, "partial-body"))
		}
		return hs
	}
	// reservedMeta is the metadata of an admission that reserved tokens,
	// prompt of them the prompt's.
	reservedMeta := func(model string, tokens, prompt uint64) map[string]*structpb.Value {
		return map[string]*structpb.Value{
			"tenant": str("acme"), "tier": str("premium"), "model": str(model),
			"reservation_id": str("req.1"), "reserved_tokens": num(float64(tokens)), "reserved_at_ms": num(float64(t0.UnixMilli())),
			"tollgate_reservation": reserved("req.1", "acme", model, tokens, prompt, nil),
		}
	}
	too := func(msg string) *authv3.CheckResponse {
		return deniedResp(codes.InvalidArgument, 413, `{"error":{"message":"`+msg+`","type":"invalid_request_error","code":"request_too_large"}}`)
	}
	const (
		modelAfterCut = "Only the first 256 bytes of a request body are checked, and the model field is not within them. Put model before the other fields, or send at most 256 bytes."
		noLength      = "Only the first 256 bytes of a request body are checked, and this one has no valid Content-Length. Send a Content-Length header, or at most 256 bytes."
	)
	notSent := deniedResp(codes.Internal, 500,
		`{"error":{"message":"The gateway did not pass the request body on to be checked, so the request cannot be admitted. Its operator must set with_request_body on the ext_authz filter.","type":"server_error","code":"request_body_not_checked"}}`)
	key := []string{"authorization", bearer(keyAcme)}
	tests := []checkCase{
		{
			name: "model after the cut is 413",
			give: envoyCheck(modelLastBody("gpt-4o", 2000, 5), cut, key...),
			want: too(modelAfterCut),
		},
		{
			name: "model after the cut is 413 even when the header names one",
			give: envoyCheck(modelLastBody("gpt-4o", 2000, 5), cut, "authorization", bearer(keyAcme), "x-model", "tiny"),
			want: too(modelAfterCut),
		},
		{
			name: "model inside the prefix is charged to it, estimated from content-length",
			give: envoyCheck(chatBody("gpt-4o", 2000, 5), cut, key...),
			want: okResp(okHeaders("gpt-4o"), nil, rlHeaders(bigBodyTokens, true), reservedMeta("gpt-4o", bigBodyTokens, bigBodyTokens-100)),
		},
		{
			name: "a cut body without content-length is 413",
			give: envoyCheck(chatBody("gpt-4o", 2000, 5), envoyBody{maxRequestBytes: cutAt, noLength: true}, key...),
			want: too(noLength),
		},
		{
			name: "a malformed content-length is none",
			give: with(envoyCheck(chatBody("gpt-4o", 2000, 5), cut, key...), "content-length", "2075,2075"),
			want: too(noLength),
		},
		{
			name: "a content-length under the bytes received is none",
			give: with(envoyCheck(chatBody("gpt-4o", 2000, 5), cut, key...), "content-length", "300"),
			want: too(noLength),
		},
		{
			name: "a cut body whose content-length is over max_body_bytes is 413, whatever was sent",
			give: envoyCheck(chatBody("gpt-4o", 5000, 5), cut, key...),
			want: too("The request body is larger than 4096 bytes."),
		},
		{
			// Envoy writes "false" when its buffer holds exactly
			// max_request_bytes, though more is to come.
			name: "partial-body false with a longer content-length is a cut",
			give: with(envoyCheck(modelLastBody("gpt-4o", 2000, 5), cut, key...), PartialBodyHeader, "false"),
			want: too(modelAfterCut),
		},
		{
			name: "partial-body false from a buffer full to the byte, with a longer content-length, is a cut",
			give: envoyCheck(modelLastBody("gpt-4o", 2000, 5), envoyBody{maxRequestBytes: cutAt, exact: true}, key...),
			want: too(modelAfterCut),
		},
		{
			name: "partial-body false with more bytes received than sent is a cut",
			give: with(envoyCheck(chatBody("gpt-4o", 2000, 5), envoyBody{maxRequestBytes: cutAt, noLength: true}, key...), PartialBodyHeader, "false"),
			want: too(noLength),
		},
		{
			// Envoy drops the client's header and writes its own "false".
			name: "a client's partial-body true on a whole body: Envoy's false stands",
			give: envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{maxRequestBytes: 4096}, "authorization", bearer(keyAcme), PartialBodyHeader, "true"),
			want: okResp(okHeaders("gpt-4o"), nil, rlHeaders(1000, false), reservedMeta("gpt-4o", 1000, 100)),
		},
		{
			// Not as Envoy sends it; whoever wrote it, the body is charged
			// from its content-length, every byte a prompt character.
			name: "partial-body true on a whole body is charged no less than the whole body",
			give: with(envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{maxRequestBytes: 4096}, key...), PartialBodyHeader, "true"),
			// 477 bytes at 4 a token and max_tokens 900; whole, 100 + 900.
			want: okResp(okHeaders("gpt-4o"), nil, rlHeaders(120+900, true), reservedMeta("gpt-4o", 120+900, 120)),
		},
		{
			name: "a client's partial-body false without with_request_body: Envoy drops it, the body is not sent",
			give: envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{}, "authorization", bearer(keyAcme), PartialBodyHeader, "false"),
			want: notSent,
		},
		{
			name: "without with_request_body a body that names the model is 500, the header notwithstanding",
			give: envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{}, "authorization", bearer(keyAcme), "x-model", "gpt-4o"),
			want: notSent,
		},
		{
			name: "without with_request_body a chunked body is 500",
			give: envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{noLength: true}, "authorization", bearer(keyAcme), "transfer-encoding", "chunked"),
			want: notSent,
		},
		{
			name:     "without with_request_body and a model from the header only: estimated from content-length",
			settings: headerModel,
			give:     envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{}, "authorization", bearer(keyAcme), "x-model", "gpt-4o"),
			// 477 bytes, every one a prompt character, and no max_tokens seen.
			want: okResp(okHeaders("gpt-4o"), nil, rlHeaders(120+100, true), reservedMeta("gpt-4o", 120+100, 120)),
		},
		{
			name:     "without with_request_body, a chunked body and a model from the header only is 500: no size",
			settings: headerModel,
			give:     envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{noLength: true}, "authorization", bearer(keyAcme), "x-model", "gpt-4o", "transfer-encoding", "chunked"),
			want:     notSent,
		},
		{
			name: "a request without a body is whole",
			give: func() *authv3.CheckRequest {
				r := envoyCheck("", envoyBody{maxRequestBytes: cutAt, noLength: true}, "authorization", bearer(keyAcme), "x-model", "gpt-4o")
				r.Attributes.Request.Http.Method = "GET"
				return r
			}(),
			want: okResp(okHeaders("gpt-4o"), nil, rlHeaders(100, false), reservedMeta("gpt-4o", 100, 0)),
		},
		{
			name:     "model from the header only: a cut body is charged from content-length",
			settings: headerModel,
			give:     envoyCheck(modelLastBody("gpt-4o", 2000, 5), cut, "authorization", bearer(keyAcme), "x-model", "gpt-4o"),
			want:     okResp(okHeaders("gpt-4o"), nil, rlHeaders(bigBodyTokens, true), reservedMeta("gpt-4o", bigBodyTokens, bigBodyTokens-100)),
		},
		{
			name:     "model from the header only: a cut body without content-length is 413",
			settings: headerModel,
			give:     envoyCheck(modelLastBody("gpt-4o", 2000, 5), envoyBody{maxRequestBytes: cutAt, noLength: true}, "authorization", bearer(keyAcme), "x-model", "gpt-4o"),
			want:     too(noLength),
		},
		{
			name:     "partial_body estimate: model after the cut is taken from the header",
			settings: estimateOption,
			give:     envoyCheck(modelLastBody("gpt-4o", 2000, 5), cut, "authorization", bearer(keyAcme), "x-model", "tiny"),
			want:     okResp(okHeaders("tiny"), nil, rlHeaders(bigBodyTokens, true), reservedMeta("tiny", bigBodyTokens, bigBodyTokens-100)),
		},
		{
			name:     "partial_body estimate: without content-length, estimated from the bytes received",
			settings: estimateOption,
			give:     envoyCheck(chatBody("gpt-4o", 2000, 5), envoyBody{maxRequestBytes: cutAt, noLength: true}, key...),
			// 256 + 64 bytes at 4 a token, and default_max_tokens.
			want: okResp(okHeaders("gpt-4o"), nil, rlHeaders(80+100, true), reservedMeta("gpt-4o", 80+100, 80)),
		},
		{
			name:     "partial_body estimate: a body not sent is admitted without a model",
			settings: estimateOption,
			give:     envoyCheck(chatBody("gpt-4o", 400, 900), envoyBody{}, key...),
			want: okResp([]*corev3.HeaderValueOption{hv(HeaderTenant, "acme"), hv(HeaderTier, "premium")}, []string{HeaderModel},
				append(rateHeaders(`1000, 1000;w=60;name="tenant_requests"`, 0, 0), hv(HeaderEstimate, "partial-body")),
				map[string]*structpb.Value{"tenant": str("acme"), "tier": str("premium"), "tollgate_reservation": str(fmt.Sprintf("%+v", ticket.Ticket{
					ID: "req.1", Domain: "ai", At: t0, Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}}}},
				}))}),
		},
		{
			name:     "partial_body estimate: max_body_bytes still holds",
			settings: estimateOption,
			give:     envoyCheck(modelLastBody("gpt-4o", 5000, 5), envoyBody{}, key...),
			want:     too("The request body is larger than 4096 bytes."),
		},
	}
	runCheckCases(t, tests)
}

// TestPartialBodyDefaultOverGRPC shows the default as Envoy sees it, over
// gRPC, with the shipped sizes: max_request_bytes equal to max_body_bytes
// (1 MiB), so any body Envoy cuts is over the limit. Whatever the client
// does with the model, Content-Length or partial-body header, Envoy gets a
// non-OK CheckResponse whose denied_response is a 413 with an OpenAI-style
// JSON error naming the limit; nothing is charged, and the next request
// sees its whole budget.
func TestPartialBodyDefaultOverGRPC(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	settings := strings.Replace(testSettings, "max_body_bytes: 4096", "max_body_bytes: "+strconv.Itoa(limit), 1)
	shipped := envoyBody{maxRequestBytes: limit}
	big := 3 * limit / 2
	tests := []struct {
		name string
		give *authv3.CheckRequest
	}{
		{name: "model first", give: envoyCheck(chatBody("gpt-4o", big, 5), shipped, "authorization", bearer(keyAcme))},
		{name: "model after the cut", give: envoyCheck(modelLastBody("gpt-4o", big, 5), shipped, "authorization", bearer(keyAcme))},
		{name: "no content-length", give: envoyCheck(modelLastBody("gpt-4o", big, 5), envoyBody{maxRequestBytes: limit, noLength: true}, "authorization", bearer(keyAcme))},
		{name: "a client's partial-body false", give: envoyCheck(modelLastBody("gpt-4o", big, 5), shipped, "authorization", bearer(keyAcme), PartialBodyHeader, "false")},
		{name: "Envoy's buffer full to the byte", give: envoyCheck(modelLastBody("gpt-4o", big, 5), envoyBody{maxRequestBytes: limit, exact: true}, "authorization", bearer(keyAcme))},
	}
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, sk.Make(t), newSettings(t, settings), nil)
			for _, tt := range tests {
				resp := h.check(t, tt.give)
				if c := codes.Code(resp.GetStatus().GetCode()); c == codes.OK {
					t.Fatalf("%s: CheckResponse status OK: Envoy would let the request through", tt.name)
				}
				d := resp.GetDeniedResponse()
				if d.GetStatus().GetCode() != 413 || resp.GetDynamicMetadata() != nil {
					t.Fatalf("%s: answer %v, want a 413 denial without metadata", tt.name, resp)
				}
				if len(d.GetHeaders()) != 1 || d.GetHeaders()[0].GetHeader().GetKey() != "content-type" || d.GetHeaders()[0].GetHeader().GetValue() != "application/json" {
					t.Errorf("%s: headers %v, want content-type: application/json", tt.name, d.GetHeaders())
				}
				var e struct {
					Error struct{ Message, Type, Code string }
				}
				if err := json.Unmarshal([]byte(d.GetBody()), &e); err != nil {
					t.Fatalf("%s: body %q: %v", tt.name, d.GetBody(), err)
				}
				if e.Error.Type != "invalid_request_error" || e.Error.Code != "request_too_large" || !strings.Contains(e.Error.Message, strconv.Itoa(limit)+" bytes") {
					t.Errorf("%s: error %+v, want invalid_request_error, request_too_large and the limit", tt.name, e.Error)
				}
			}
			if got := testutil.Gather(t, h.reg)[`tollgate_authz_checks_total{domain="ai",result="bad_request",tier="none"}`]; got != float64(len(tests)) {
				t.Errorf("bad_request checks = %v, want %d", got, len(tests))
			}
			whole := h.check(t, envoyCheck(chatBody("gpt-4o", 400, 900), shipped, "authorization", bearer(keyAcme)))
			remaining := ""
			for _, o := range whole.GetOkResponse().GetResponseHeadersToAdd() {
				if o.GetHeader().GetKey() == "x-ratelimit-remaining" {
					remaining = o.GetHeader().GetValue()
				}
			}
			if remaining != "999" {
				t.Errorf("a whole body after the refusals: %v, want x-ratelimit-remaining 999", whole)
			}
		})
	}
}

func TestContentLength(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		give   string
		want   int64
		wantOK bool
	}{
		{name: "zero", give: "0", want: 0, wantOK: true},
		{name: "a length", give: "2075", want: 2075, wantOK: true},
		{name: "leading zeros", give: "007", want: 7, wantOK: true},
		{name: "the longest", give: "999999999999999999", want: 999999999999999999, wantOK: true},
		{name: "too long to add up", give: "9999999999999999999"},
		{name: "absent", give: ""},
		{name: "negative", give: "-1"},
		{name: "signed", give: "+1"},
		{name: "spaces", give: " 1"},
		{name: "repeated, as Envoy joins them", give: "10,10"},
		{name: "not decimal", give: "0x10"},
		{name: "exponent", give: "1e3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got, ok := contentLength(tt.give); got != tt.want || ok != tt.wantOK {
				t.Errorf("contentLength(%q) = %d, %v; want %d, %v", tt.give, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
