package envoysim

import (
	"context"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// alsLogger is one instance's http_grpc access logger: a batch that
// grows until buffer_size_bytes (by each entry's encoded size, as
// Envoy's GrpcAccessLogger adds ByteSizeLong) or until the
// buffer_flush_interval timer fires, sent on one long-lived
// StreamAccessLogs stream, whose first message alone carries the
// identifier (StreamAccessLogsMessage.identifier: "only sent in the first
// message on the stream"). A stream that fails loses the batch being
// sent; the next flush opens a new one (Envoy does not retry a stream
// that was set up, envoy-ext-authz.yaml grpc_stream_retry_policy).
type alsLogger struct {
	g       *Gateway
	cc      *grpc.ClientConn
	node    *corev3.Node
	entries chan *datav3.HTTPAccessLogEntry
	done    chan error
	tick    func(time.Duration) (<-chan time.Time, func())
}

func newALSLogger(g *Gateway, instance int, cc *grpc.ClientConn, tick func(time.Duration) (<-chan time.Time, func()), unbuffered bool) *alsLogger {
	queue := 1024
	if unbuffered {
		queue = 0
	}
	l := &alsLogger{
		g:  g,
		cc: cc,
		// The bootstraps set no node; Envoy then reports the node it was
		// started with (--service-node), named here after the instance.
		node:    &corev3.Node{Id: "envoysim-" + strconv.Itoa(instance), UserAgentName: "envoy"},
		entries: make(chan *datav3.HTTPAccessLogEntry, queue),
		done:    make(chan error, 1),
		tick:    tick,
	}
	go l.run()
	return l
}

// log hands an entry over; it blocks only when a thousand wait, which a
// loopback stream does not let happen.
func (l *alsLogger) log(e *datav3.HTTPAccessLogEntry) { l.entries <- e }

// close flushes what is buffered and ends the stream.
func (l *alsLogger) close() error {
	close(l.entries)
	return <-l.done
}

func (l *alsLogger) run() {
	s := l.g.s.als
	tc, stop := l.tick(s.flushInterval)
	defer stop()
	var (
		stream grpc.ClientStreamingClient[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]
		cancel context.CancelFunc = func() {}
		batch  []*datav3.HTTPAccessLogEntry
		size   int
	)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		msg := &alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: batch},
		}}
		if stream == nil {
			ctx, c := context.WithCancel(context.Background())
			st, err := alsv3.NewAccessLogServiceClient(l.cc).StreamAccessLogs(ctx)
			if err != nil {
				c()
				l.g.stats.alsErrors.Add(1)
				batch, size = batch[:0], 0
				return
			}
			stream, cancel = st, c
			l.g.stats.alsStreams.Add(1)
			msg.Identifier = &alsv3.StreamAccessLogsMessage_Identifier{Node: l.node, LogName: s.logName}
		}
		if err := stream.Send(msg); err != nil {
			l.g.stats.alsErrors.Add(1)
			cancel()
			stream = nil
		} else {
			l.g.stats.alsMessages.Add(1)
			l.g.stats.alsEntries.Add(int64(len(batch)))
		}
		batch, size = nil, 0 // the message holds the slice until gRPC is done with it
	}
	for {
		select {
		case e, ok := <-l.entries:
			if !ok {
				flush()
				var err error
				if stream != nil {
					_, err = stream.CloseAndRecv()
					cancel()
				}
				l.done <- err
				return
			}
			batch = append(batch, e)
			size += proto.Size(e) // ByteSizeLong in Envoy
			if size >= s.bufferSize {
				flush()
			}
		case <-tc:
			flush()
		}
	}
}

// entry is the request's HTTPAccessLogEntry as Envoy's
// http_grpc_access_log_impl.cc and grpc_access_log_utils.cc fill it.
func (x *exchange) entry() *datav3.HTTPAccessLogEntry {
	als := x.g.s.als
	c := &datav3.AccessLogCommon{
		DownstreamRemoteAddress:       x.client,
		DownstreamDirectRemoteAddress: x.client,
		DownstreamLocalAddress:        socketAddress("127.0.0.1", x.g.s.listenerPort),
		StartTime:                     timestamppb.New(x.start),
		Duration:                      durationpb.New(x.doneAt),
		TimeToLastRxByte:              dur(x.lastRx),
		TimeToFirstUpstreamTxByte:     dur(x.firstUpTx),
		TimeToLastUpstreamTxByte:      dur(x.lastUpTx),
		TimeToFirstUpstreamRxByte:     dur(x.firstUpRx),
		TimeToLastUpstreamRxByte:      dur(x.lastUpRx),
		TimeToFirstDownstreamTxByte:   dur(x.firstDownTx),
		TimeToLastDownstreamTxByte:    dur(x.lastDownTx),
		RouteName:                     x.routeName,
		ResponseFlags:                 x.flags,
		StreamId:                      x.requestID, // the stream id provider is x-request-id
		AccessLogType:                 datav3.AccessLogType_DownstreamEnd,
	}
	if x.upstreamAddr != nil {
		// Set only once a host was picked (upstreamInfo().upstreamHost()).
		c.UpstreamRemoteAddress = x.upstreamAddr
		c.UpstreamLocalAddress = x.upstreamLoc
		c.UpstreamCluster = x.g.s.route.cluster
	}
	if x.attempts > 0 {
		c.UpstreamRequestAttemptCount = uint32(x.attempts)
	}
	if len(x.meta) > 0 {
		c.Metadata = &corev3.Metadata{FilterMetadata: x.meta}
	}
	req := &datav3.HTTPRequestProperties{
		RequestMethod:       corev3.RequestMethod(corev3.RequestMethod_value[x.r.Method]),
		Scheme:              "http",
		Authority:           x.g.authority,
		Path:                x.r.Path,
		ForwardedFor:        "127.0.0.1",
		RequestId:           x.requestID,
		RequestHeadersBytes: x.req.byteSize(),
		RequestBodyBytes:    uint64(len(x.r.Body)),
	}
	if ua, ok := x.req.get("user-agent"); ok {
		req.UserAgent = ua
	}
	resp := &datav3.HTTPResponseProperties{
		ResponseCodeDetails:  x.details,
		ResponseHeadersBytes: x.resp.byteSize(),
		ResponseBodyBytes:    x.bytesSent,
	}
	if x.status != 0 {
		resp.ResponseCode = wrapperspb.UInt32(uint32(x.status))
	}
	if als != nil {
		req.RequestHeaders = x.req.pick(als.requestHeadersToLog)
		resp.ResponseHeaders = x.resp.pick(als.responseHeadersToLog)
		resp.ResponseTrailers = x.trailers.pick(als.responseTrailersToLog)
	}
	return &datav3.HTTPAccessLogEntry{
		CommonProperties: c,
		ProtocolVersion:  datav3.HTTPAccessLogEntry_HTTP11,
		Request:          req,
		Response:         resp,
	}
}

func dur(s since) *durationpb.Duration {
	if !s.ok {
		return nil
	}
	return durationpb.New(s.d)
}
