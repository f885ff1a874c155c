// Package extproc serves Envoy's ExternalProcessor v3 (Process, the
// ext_proc HTTP filter) to read the real token usage from inference
// responses: the JSON body's usage object, or a text/event-stream's last
// usage before data: [DONE], in the OpenAI chat/completions and Responses
// API shapes. It hands that, once per request, with the reservation
// ticket Check put in the ext_authz dynamic metadata, to a Settler.
//
// The filter it is made for sits after ext_authz in observability mode
// (Envoy sends and never waits, so no response is delayed): request
// phases skipped, response headers SEND, response body STREAMED, response
// trailers SEND, and metadata_options.forwarding_namespaces.untyped
// listing envoy.filters.http.ext_authz, so that every ProcessingRequest
// carries the ticket in metadata_context. The body is read as it
// streams, split at any byte, with a fixed-size state (no copy of the
// body is kept; a gzip body adds the decoder's window) and work linear
// in each chunk. A stream without a ticket is closed at once: Envoy then
// sends nothing more.
//
// Optionally, a second ext_proc filter (not observability mode: request
// headers SEND, request body BUFFERED) lets Process add
// stream_options.include_usage to streaming chat/completions requests,
// so that their streams end with a usage chunk (see withIncludeUsage).
//
// Facts about Envoy this relies on, from the ext_proc protos
// (go-control-plane envoy v1.40.0) and Envoy's changelogs:
//   - observability_mode (Envoy 1.31+): each part is sent without waiting;
//     responses from the server are ignored; ProcessingRequest
//     observability_mode is true, and the server "should not respond",
//     but may close the stream to say it needs no more messages.
//   - Header values arrive in raw_value (value on older Envoys).
//   - HttpBody end_of_stream marks the last chunk when no trailers follow;
//     HttpHeaders end_of_stream means no body at all.
//   - In observability mode Envoy keeps the stream open after the
//     response for deferred_close_timeout (5s by default), then closes
//     it. A client that goes away mid-body shows here as a stream that
//     ends (EOF, or a cancel when Envoy resets it) without end_of_stream.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Defaults for the zero values of Options.
const (
	// DefaultNamespace is where Envoy's ext_authz filter puts Check's
	// dynamic metadata.
	DefaultNamespace = "envoy.filters.http.ext_authz"
	// DefaultTicketField is the ticket's key in that namespace.
	DefaultTicketField = "tollgate_reservation"
	// DefaultSettleTimeout bounds one Settle call.
	DefaultSettleTimeout = 2 * time.Second
	// DefaultMaxDecodedBytes bounds what one gzip body may decode to:
	// above the longest streamed completion (100k streamed tokens are
	// about 30 MiB of chat chunks), below what a gzip bomb would cost.
	DefaultMaxDecodedBytes = 64 << 20
)

// MaxTicketBytes bounds a ticket taken from the metadata; a longer one is
// malformed and never reaches the Settler.
const MaxTicketBytes = 64 << 10

// Options configure a Service; the zero value is usable.
type Options struct {
	// Namespace is the dynamic metadata namespace holding the ticket
	// (Optional; default DefaultNamespace).
	Namespace string
	// TicketField is the ticket's key in Namespace (Optional; default
	// DefaultTicketField).
	TicketField string
	// SettleTimeout bounds one Settle call (Optional; default 2s).
	SettleTimeout time.Duration
	// MaxDecodedBytes bounds the decoded size of a gzip response body;
	// past it the body is not read further and the stream settles
	// without usage (Optional; default 64 MiB).
	MaxDecodedBytes int64
}

// Service implements extprocv3.ExternalProcessorServer over a Settler.
type Service struct {
	extprocv3.UnimplementedExternalProcessorServer

	settler Settler
	opts    Options
	log     *zap.Logger
	metrics *metrics
}

var _ extprocv3.ExternalProcessorServer = (*Service)(nil)

// New returns a Service that settles with s, logging to log (nil:
// nowhere) and registering its metrics on reg. s and reg are Required;
// it fails when reg already holds metrics of the same names.
func New(s Settler, log *zap.Logger, reg prometheus.Registerer, opts Options) (*Service, error) {
	if s == nil || reg == nil {
		return nil, errors.New("extproc: a Settler and a Registerer are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.TicketField == "" {
		opts.TicketField = DefaultTicketField
	}
	if opts.SettleTimeout <= 0 {
		opts.SettleTimeout = DefaultSettleTimeout
	}
	if opts.MaxDecodedBytes <= 0 {
		opts.MaxDecodedBytes = DefaultMaxDecodedBytes
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Service{settler: s, opts: opts, log: log, metrics: m}, nil
}

// Register adds the service to a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	extprocv3.RegisterExternalProcessorServer(r, s)
}

// Process handles one HTTP request's ext_proc stream. In observability
// mode it only reads; otherwise it answers every message (unchanged,
// except for the request-phase option). It settles once, when the
// response body ends or the stream does, and then returns.
func (s *Service) Process(srv grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	ctx := srv.Context()
	st := stream{svc: s}
	defer st.stop()
	for {
		req, err := srv.Recv()
		if err != nil {
			st.end(ctx, err)
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if !st.started {
			st.start(req)
		}
		reply := !req.GetObservabilityMode()
		resp, finished := st.handle(req, reply)
		if reply && resp != nil {
			if err := srv.Send(resp); err != nil {
				st.end(ctx, err)
				return err
			}
		}
		if finished || st.ticket == "" && !reply {
			// The response is over, or there is nothing to account: in
			// observability mode, closing tells Envoy to send no more.
			st.end(ctx, nil)
			return nil
		}
	}
}

// stream is one Process call's state.
type stream struct {
	svc     *Service
	started bool
	ended   bool

	ticket    string
	ticketErr bool // the metadata held a ticket that is no string or too long

	// Request phase.
	chatPath   bool // the path is a chat/completions or completions endpoint
	reqEncoded bool // the request body has a content-encoding

	// Response phase.
	response bool // a response message came: this stream reads a response
	status   int
	reader   *usageReader // nil until the response is read
	gz       *gunzipper
	skip     string // why the body is not read: reasonEncoding
	decodeTo error  // why gzip decoding stopped early
	complete bool
}

// start takes the ticket from the first message's metadata.
func (st *stream) start(req *extprocv3.ProcessingRequest) {
	st.started = true
	o := &st.svc.opts
	v, ok := req.GetMetadataContext().GetFilterMetadata()[o.Namespace].GetFields()[o.TicketField]
	if !ok {
		return
	}
	switch k := v.GetKind().(type) {
	case nil, *structpb.Value_NullValue:
	case *structpb.Value_StringValue:
		if len(k.StringValue) > MaxTicketBytes {
			st.ticketErr = true
			return
		}
		st.ticket = k.StringValue
	default:
		st.ticketErr = true
	}
}

// handle takes one message; with reply, it returns the answer Envoy
// waits for. finished says the response is over.
func (st *stream) handle(req *extprocv3.ProcessingRequest, reply bool) (*extprocv3.ProcessingResponse, bool) {
	var resp *extprocv3.ProcessingResponse
	finished := false
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		st.requestHeaders(r.RequestHeaders)
		if reply {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
		}
	case *extprocv3.ProcessingRequest_RequestBody:
		if reply {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: st.requestBody(r.RequestBody)}}
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if reply {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
		}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.response = true
		finished = st.responseHeaders(r.ResponseHeaders)
		if reply {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		st.response = true
		finished = st.responseBody(r.ResponseBody)
		if reply {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		// Trailers come only after the whole body.
		st.response, st.complete, finished = true, true, true
		if reply {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		}
	}
	return resp, finished
}

// header returns a header's value: raw_value, or value from an Envoy
// that does not send raw values.
func header(h *corev3.HeaderValue) string {
	if v := h.GetRawValue(); len(v) > 0 {
		return string(v)
	}
	return h.GetValue()
}

func (st *stream) requestHeaders(h *extprocv3.HttpHeaders) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":path":
			p, _, _ := strings.Cut(header(hv), "?")
			st.chatPath = strings.HasSuffix(p, "/chat/completions") || strings.HasSuffix(p, "/completions")
		case "content-encoding":
			if v := strings.TrimSpace(header(hv)); v != "" && !strings.EqualFold(v, "identity") {
				st.reqEncoded = true
			}
		}
	}
}

// requestBody answers a request body, adding include_usage where it is
// due (see withIncludeUsage). A body that is not the whole body
// (end_of_stream false: trailers follow, or a partial buffer) is left
// alone.
func (st *stream) requestBody(b *extprocv3.HttpBody) *extprocv3.BodyResponse {
	m := st.svc.metrics
	if st.ticket == "" {
		m.byBody[bodyNoTicket].Inc()
		return &extprocv3.BodyResponse{}
	}
	if !st.chatPath || st.reqEncoded || !b.GetEndOfStream() {
		m.byBody[bodyUnchanged].Inc()
		return &extprocv3.BodyResponse{}
	}
	body, ok := withIncludeUsage(b.GetBody())
	if !ok {
		m.byBody[bodyUnchanged].Inc()
		return &extprocv3.BodyResponse{}
	}
	m.byBody[bodyAdded].Inc()
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		// Envoy rejects a body mutation whose length disagrees with a
		// content-length the request still has, and some versions
		// blank a content-length set here; without one, Envoy frames
		// the new body itself (chunked to an HTTP/1.1 upstream).
		HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}},
		BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}},
	}}
}

// responseHeaders sets the reading up; true if the response has no body.
func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) bool {
	var contentType, encoding string
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			if n, err := strconv.Atoi(header(hv)); err == nil && n > 0 && n < 1000 {
				st.status = n
			}
		case "content-type":
			contentType = header(hv)
		case "content-encoding":
			encoding = header(hv)
		}
	}
	if st.ticket != "" && st.reader == nil && st.skip == "" {
		st.startReading(kindOf(contentType), encoding)
	}
	if h.GetEndOfStream() {
		st.complete = true
		return true
	}
	return false
}

func (st *stream) startReading(kind bodyKind, encoding string) {
	switch e := strings.ToLower(strings.TrimSpace(encoding)); e {
	case "", "identity":
		st.reader = newUsageReader(kind)
	case "gzip", "x-gzip":
		st.reader = newUsageReader(kind)
		st.gz = startGunzip(st.reader, st.svc.opts.MaxDecodedBytes)
	default:
		// br, zstd, deflate, or a list of encodings: not decoded. The
		// body is still drained to learn whether it completed.
		st.skip = reasonEncoding
	}
}

// responseBody reads a chunk; true at the body's end.
func (st *stream) responseBody(b *extprocv3.HttpBody) bool {
	if st.ticket != "" {
		st.svc.metrics.bodyBytes.Add(float64(len(b.GetBody())))
		if st.reader == nil && st.skip == "" {
			// No response headers were sent (response_header_mode SKIP):
			// sniff the body, which is then taken as not encoded.
			st.startReading(kindSniff, "")
		}
		switch {
		case st.gz != nil:
			if !st.gz.write(b.GetBody()) {
				st.stopGzip()
			}
		case st.reader != nil:
			st.reader.write(b.GetBody())
		}
	}
	if b.GetEndOfStream() {
		st.complete = true
		return true
	}
	return false
}

// stopGzip ends the decoder and records why it stopped.
func (st *stream) stopGzip() {
	if st.gz == nil {
		return
	}
	st.decodeTo = st.gz.close()
	st.gz = nil
}

// stop releases what the stream holds; Process defers it.
func (st *stream) stop() { st.stopGzip() }

// end settles the stream, once. err is why the gRPC stream ended, nil if
// the response did.
func (st *stream) end(ctx context.Context, err error) {
	if st.ended {
		return
	}
	st.ended = true
	if !st.response {
		// Only request messages: the request-phase filter's stream,
		// which knows nothing of the response. The reading filter's
		// stream settles the reservation.
		return
	}
	s := st.svc
	m := s.metrics
	switch {
	case st.ticketErr:
		m.byResult[resultError].Inc()
		s.log.Debug("ext_proc stream with a malformed reservation ticket; not settled")
		return
	case st.ticket == "":
		m.byResult[resultNoTicket].Inc()
		return
	}
	u := st.usage()
	failed := err != nil && !errors.Is(err, io.EOF) && status.Code(err) != codes.Canceled
	switch {
	case failed:
		m.byResult[resultError].Inc()
		s.log.Debug("ext_proc stream failed; settling what was read", zap.Error(err), zap.Int("status", u.Status))
	case u.Reported:
		m.byResult[resultUsage].Inc()
	default:
		m.byResult[resultNoUsage].Inc()
	}
	if !u.Reported {
		m.byReason[st.noUsageReason(u)].Inc()
	}
	// Envoy may have reset the stream: the settle still runs, bounded.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.SettleTimeout)
	defer cancel()
	start := time.Now()
	s.settler.Settle(sctx, st.ticket, u)
	m.settle.Observe(time.Since(start).Seconds())
}

// usage finishes reading and returns what the response said.
func (st *stream) usage() Usage {
	st.stopGzip()
	var u Usage
	if st.reader != nil {
		st.reader.finish()
		u = st.reader.result()
	}
	u.Complete, u.Status = st.complete, st.status
	return u
}

func (st *stream) noUsageReason(u Usage) string {
	switch {
	case st.skip != "":
		return st.skip
	case errors.Is(st.decodeTo, errTooLarge):
		return reasonTooLarge
	case st.decodeTo != nil && u.Complete:
		// A complete body that does not decode; a cut one fails to
		// decode because it is cut.
		return reasonEncoding
	case !u.Complete:
		return reasonCut
	}
	return reasonNotReported
}

// String names a stream's result for logs and tests.
func (u Usage) String() string {
	return fmt.Sprintf("usage{in=%d out=%d total=%d reported=%t chars=%d complete=%t status=%d}",
		u.Input, u.Output, u.Total, u.Reported, u.StreamedChars, u.Complete, u.Status)
}
