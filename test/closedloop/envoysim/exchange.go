package envoysim

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tollgate-dev/tollgate/test/closedloop"
)

// Response code details Envoy sets, from its StreamInfo
// ResponseCodeDetailValues (stream_info.h) as they appear in access logs.
const (
	detailsViaUpstream      = "via_upstream"
	detailsAuthzDenied      = "ext_authz_denied"
	detailsAuthzError       = "ext_authz_error"
	detailsRateLimited      = "request_rate_limited"
	detailsRateLimitError   = "rate_limiter_error"
	detailsTooLarge         = "request_payload_too_large"
	detailsDirectResponse   = "direct_response"
	detailsNoRoute          = "route_not_found"
	detailsUpstreamTimeout  = "upstream_response_timeout"
	detailsDownstreamGone   = "downstream_remote_disconnect"
	detailsResetBeforeStart = "upstream_reset_before_response_started"
	detailsResetAfterStart  = "upstream_reset_after_response_started"
)

// bodyChunk is how much of a body one read moves, as Envoy's 16 KiB
// buffer slices do.
const bodyChunk = 16 << 10

// since is a time since the stream started; ok says it was recorded
// (Envoy's optional timings in StreamInfo).
type since struct {
	d  time.Duration
	ok bool
}

// exchange is one request through one instance: Envoy's StreamInfo and
// header maps for it.
type exchange struct {
	g  *Gateway
	in *instance
	r  *closedloop.Request

	start     time.Time
	streamID  uint64
	requestID string
	client    *corev3.Address
	req       headers // the request headers as the filters see them

	// Timings since start (AccessLogCommon time_to_*).
	lastRx, firstUpTx, lastUpTx, firstUpRx, lastUpRx, firstDownTx, lastDownTx since
	doneAt                                                                    time.Duration

	status       int // sent downstream; 0 before any
	details      string
	source       closedloop.Source
	flags        *datav3.ResponseFlags
	meta         map[string]*structpb.Struct // dynamic metadata by namespace
	resp         headers                     // downstream response headers
	trailers     headers
	addResponse  []*corev3.HeaderValueOption // ext_authz OK response_headers_to_add
	addRLSResp   []*corev3.HeaderValue       // ratelimit OK response_headers_to_add
	bytesSent    uint64
	usage        []byte // the response body kept for its usage, up to maxUsageBody
	attempts     int
	maxRetries   int           // x-envoy-max-retries after ext_authz; -1 without one
	checkTook    time.Duration // the Check's send to its answer or timeout
	checkAfter   time.Duration // the exchange's start to the Check's send
	replica      int           // the Check's replica index; -1 without one
	upstreamAddr *corev3.Address
	upstreamLoc  *corev3.Address
	routeName    string
	complete     bool // the client has its last byte
	gaveUp       bool
	proc         *procStream
}

func newExchange(g *Gateway, in *instance, r *closedloop.Request) *exchange {
	x := &exchange{g: g, in: in, r: r, start: time.Now(), streamID: rand.Uint64(), maxRetries: -1, replica: -1}
	x.requestID = uuid4()
	// A made-up client port per request: each simulated client
	// connection is its own.
	port := 20000 + in.connSeq.Add(1)%40000
	x.client = socketAddress("127.0.0.1", port)
	x.req = make(headers, 0, len(r.Header)+10)
	// Envoy's HTTP/1 codec turns the request line and Host into
	// pseudo-headers; the connection manager then adds x-forwarded-for
	// (use_remote_address: true, envoy-ext-authz.yaml line "use_remote_address"),
	// x-forwarded-proto and a fresh x-request-id, and drops the
	// x-envoy-* headers an edge client may not set.
	x.req.add(":authority", g.authority)
	x.req.add(":path", r.Path)
	x.req.add(":method", r.Method)
	x.req.add(":scheme", "http")
	for k, vs := range r.Header {
		lk := strings.ToLower(k)
		if lk == "host" || strings.HasPrefix(lk, "x-envoy-") || lk == "x-request-id" || lk == "x-forwarded-for" || lk == "x-forwarded-proto" {
			continue
		}
		for _, v := range vs {
			x.req.add(lk, v)
		}
	}
	if len(r.Body) > 0 {
		x.req.set("content-length", strconv.Itoa(len(r.Body)))
	}
	x.req.add("x-forwarded-for", "127.0.0.1")
	x.req.add("x-forwarded-proto", "http")
	x.req.add("x-request-id", x.requestID)
	return x
}

// run takes the request through the filter chain until the client has
// its answer, or gives up (ctx).
func (x *exchange) run(ctx context.Context) {
	s := x.g.s
	// The client sends its whole request at once.
	x.lastRx = x.at()
	if !x.routes() {
		if dr := s.missingRoute; dr != nil {
			x.localReply(int(dr.status), nil, dr.body, detailsDirectResponse, closedloop.SourceEnvoy)
			return
		}
		x.flag().NoRouteFound = true
		x.localReply(http.StatusNotFound, nil, "", detailsNoRoute, closedloop.SourceEnvoy)
		return
	}
	x.routeName = s.route.name
	if s.authz != nil && !x.authorize(ctx) {
		return
	}
	if s.rls != nil && s.rls.domain != "" && !x.rateLimit(ctx) {
		return
	}
	x.forward(ctx)
}

// routes says whether the first route matches (prefix and present
// headers); the bootstraps have one forwarding route.
func (x *exchange) routes() bool {
	rs := &x.g.s.route
	if !strings.HasPrefix(x.r.Path, rs.prefix) {
		return false
	}
	for _, h := range rs.present {
		if _, ok := x.req.get(h); !ok {
			return false
		}
	}
	return true
}

// authorize is the ext_authz filter: buffer the body, Check, act on the
// answer. It says whether the request goes on.
func (x *exchange) authorize(ctx context.Context) bool {
	a := x.g.s.authz
	body := x.r.Body
	if len(body) > a.maxRequestBytes && a.maxRequestBytes > 0 && !a.allowPartial {
		// BufferSettings.max_request_bytes: "Envoy will return HTTP 413
		// and will not initiate the authorization process when the buffer
		// reaches the number set in this field" (ext_authz.proto).
		x.localReply(http.StatusRequestEntityTooLarge, nil, "Payload Too Large", detailsTooLarge, closedloop.SourceEnvoy)
		return false
	}
	req := x.checkRequest()
	x.g.stats.checks.Add(1)
	i := x.in.checkRR.Add(1) - 1
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	x.replica = int(i % uint64(len(x.in.conns)))
	sent := time.Now()
	x.checkAfter = sent.Sub(x.start)
	resp, err := authv3.NewAuthorizationClient(x.in.conns[x.replica]).Check(cctx, req)
	x.checkTook = time.Since(sent)
	cancel()
	if ctx.Err() != nil {
		return false // the client went away; the filter's onDestroy cancels the call
	}
	if err != nil || resp.GetErrorResponse() != nil {
		// A transport error, the filter's timeout, or (Envoy 1.37)
		// CheckResponse.error_response: ext_authz_error, decided by
		// failure_mode_allow.
		x.g.stats.checkErrors.Add(1)
		if a.failureModeAllow {
			return true
		}
		x.flag().UnauthorizedDetails = &datav3.ResponseFlags_Unauthorized{Reason: datav3.ResponseFlags_Unauthorized_EXTERNAL_SERVICE}
		status := a.statusOnError
		if er := resp.GetErrorResponse(); er != nil && er.GetStatus().GetCode() != 0 {
			status = int(er.GetStatus().GetCode())
		}
		x.localReply(status, nil, "", detailsAuthzError, closedloop.SourceEnvoy)
		return false
	}
	// ext_authz.cc onComplete: dynamic metadata goes to the filter's
	// namespace whatever the verdict; OkHttpResponse.dynamic_metadata
	// (deprecated) overrides CheckResponse.dynamic_metadata.
	md := resp.GetDynamicMetadata()
	if ok := resp.GetOkResponse(); ok != nil && ok.GetDynamicMetadata() != nil { //nolint:staticcheck // Envoy still honours it
		md = ok.GetDynamicMetadata() //nolint:staticcheck // as above
	}
	if len(md.GetFields()) > 0 {
		x.setMeta(filterExtAuthz, md)
	}
	if resp.GetStatus().GetCode() != 0 {
		d := resp.GetDeniedResponse()
		status := int(d.GetStatus().GetCode())
		if status == 0 {
			status = defaultDeniedStatus
		}
		x.flag().UnauthorizedDetails = &datav3.ResponseFlags_Unauthorized{Reason: datav3.ResponseFlags_Unauthorized_EXTERNAL_SERVICE}
		x.localReplyWith(status, d.GetBody(), detailsAuthzDenied, closedloop.SourceTollgate, func(h *headers) {
			for _, o := range d.GetHeaders() {
				h.apply(o)
			}
		})
		return false
	}
	ok := resp.GetOkResponse()
	for _, o := range ok.GetHeaders() {
		x.req.apply(o)
	}
	for _, k := range ok.GetHeadersToRemove() {
		k = strings.ToLower(k)
		if k == "" || k[0] == ':' || k == "host" {
			continue // "Pseudo headers ... as well as the header Host, may not be removed"
		}
		x.req.del(k)
	}
	x.addResponse = ok.GetResponseHeadersToAdd()
	if v, ok := x.req.get("x-envoy-max-retries"); ok {
		// What the router will read: a value it cannot parse counts as
		// none, as the router then uses the route's num_retries.
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
			x.maxRetries = int(n)
		}
	}
	return true
}

// checkRequest builds the CheckRequest as Envoy's
// check_request_utils.cc (createHttpCheck, setHttpRequest) does: the
// stream id as id, every header (pseudo-headers included, duplicates
// joined with ","), the body cut at max_request_bytes in raw_body
// (pack_as_bytes) or body, and x-envoy-auth-partial-body "true"/"false"
// whenever a body is buffered. size is the bytes received when the
// Check goes: the buffer, which Envoy fills one chunk past the limit
// before it checks (envoy-ext-authz.yaml, per_connection_buffer_limit_bytes).
func (x *exchange) checkRequest() *authv3.CheckRequest {
	a := x.g.s.authz
	body := x.r.Body
	received := len(body)
	if a.maxRequestBytes > 0 && received > a.maxRequestBytes {
		received = min(received, (a.maxRequestBytes/bodyChunk+1)*bodyChunk)
	}
	hm := make(map[string]string, len(x.req)+1)
	for _, f := range x.req {
		if f.k == "x-envoy-auth-partial-body" {
			continue
		}
		if v, ok := hm[f.k]; ok {
			hm[f.k] = v + "," + sanitizeUTF8(f.v)
		} else {
			hm[f.k] = sanitizeUTF8(f.v)
		}
	}
	hr := &authv3.AttributeContext_HttpRequest{
		Id:       strconv.FormatUint(x.streamID, 10),
		Method:   x.r.Method,
		Headers:  hm,
		Path:     x.r.Path,
		Host:     x.g.authority,
		Scheme:   "http",
		Size:     int64(received),
		Protocol: "HTTP/1.1",
	}
	if a.maxRequestBytes > 0 && len(body) > 0 {
		n := min(len(body), a.maxRequestBytes)
		if a.packAsBytes {
			hr.RawBody = body[:n]
		} else {
			hr.Body = sanitizeUTF8(string(body[:n]))
		}
		hm["x-envoy-auth-partial-body"] = strconv.FormatBool(n != received)
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: x.client},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress("127.0.0.1", x.g.s.listenerPort)},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(x.start),
			Http: hr,
		},
		// createHttpCheck assigns both, so they are present though empty.
		MetadataContext:      &corev3.Metadata{},
		RouteMetadataContext: &corev3.Metadata{},
	}}
}

// localReply answers the client from Envoy itself (sendLocalReply).
func (x *exchange) localReply(status int, extra headers, body, details string, src closedloop.Source) {
	x.localReplyWith(status, body, details, src, func(h *headers) { *h = append(*h, extra...) })
}

func (x *exchange) localReplyWith(status int, body, details string, src closedloop.Source, mutate func(*headers)) {
	x.status, x.details, x.source = status, details, src
	x.resp = headers{{":status", strconv.Itoa(status)}}
	if body != "" {
		x.resp.add("content-length", strconv.Itoa(len(body)))
		x.resp.add("content-type", "text/plain")
	}
	mutate(&x.resp)
	x.firstDownTx = x.at()
	x.bytesSent = uint64(len(body))
	x.lastDownTx = x.at()
	x.complete = true
}

func (x *exchange) setMeta(ns string, s *structpb.Struct) {
	if x.meta == nil {
		x.meta = make(map[string]*structpb.Struct, 2)
	}
	x.meta[ns] = s
}

func (x *exchange) flag() *datav3.ResponseFlags {
	if x.flags == nil {
		x.flags = &datav3.ResponseFlags{}
	}
	return x.flags
}

func (x *exchange) at() since { return since{time.Since(x.start), true} }

// result is what the client saw.
func (x *exchange) result() closedloop.Result {
	res := closedloop.Result{Status: x.status, Source: x.source, Attempts: x.attempts, Latency: x.lastDownTx.d,
		MaxRetries: x.maxRetries, Check: x.checkTook, CheckAfter: x.checkAfter, Replica: x.replica}
	if x.gaveUp {
		res.Latency = x.doneAt
		res.Source = closedloop.SourceClient
		return res
	}
	if x.source == closedloop.SourceTollgate {
		res.Reason, _ = x.resp.get("x-tollgate-reason")
		if res.Reason == "" && x.status == 429 {
			// A refusal by a limit carries no x-tollgate-reason
			// (docs/operator-guide.md): the laws and the CSV count it as
			// "limit", which they otherwise never saw.
			res.Reason = "limit"
		}
	}
	if v, ok := x.resp.get("retry-after"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			res.RetryAfter = time.Duration(n) * time.Second
		}
	}
	// The answer's own content type says whether it streamed: a gateway
	// does not know what the client asked for.
	ct, _ := x.resp.get("content-type")
	res.PromptTokens, res.CompletionTokens = closedloop.ParseUsage(x.usage, strings.HasPrefix(strings.ToLower(ct), "text/event-stream"))
	return res
}

// settle records the end of the stream: a client that gave up is
// recorded as Envoy records a downstream disconnect.
func (x *exchange) settle() {
	x.doneAt = time.Since(x.start)
	if !x.complete {
		x.gaveUp = true
		x.g.stats.clientTimeouts.Add(1)
		// The connection manager's reset on a client close: flag DC and
		// details downstream_remote_disconnect; the response code stays
		// what was sent, 0 when nothing was.
		x.flag().DownstreamConnectionTermination = true
		x.details = detailsDownstreamGone
	}
}

// finish lets the ext_proc stream go (its deferred close), writes the
// access log entry and sends the stream-done rate limit report.
func (x *exchange) finish() {
	if x.proc != nil {
		x.proc.end()
	}
	if l := x.in.logger; l != nil {
		l.log(x.entry())
	}
	if rls := x.g.s.rls; rls != nil && rls.domain != "" {
		x.streamDone()
	}
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// uuid4 is an x-request-id as Envoy's UUIDRequestIDExtension makes it.
func uuid4() string {
	var b [16]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		b[i], b[8+i] = byte(hi>>(8*i)), byte(lo>>(8*i))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}

// sanitizeUTF8 is Envoy's MessageUtil::sanitizeUtf8String: each byte of
// an invalid sequence becomes '!'.
func sanitizeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 {
			b = append(b, '!')
			i++
			continue
		}
		b = append(b, s[i:i+n]...)
		i += n
	}
	return string(b)
}
