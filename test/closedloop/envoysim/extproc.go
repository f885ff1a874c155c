package envoysim

import (
	"context"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// procStream is one ext_proc stream in observability mode: the request's
// goroutine queues messages and never waits (ExternalProcessor
// observability_mode: "Envoy sends ... without waiting for a response");
// one goroutine per stream sends them, then holds the stream open up to
// deferred_close_timeout for Tollgate to close it, as Envoy's deferred
// close does, and resets it after that.
type procStream struct {
	mu    sync.Mutex
	q     []*extprocv3.ProcessingRequest
	ended bool
	wake  chan struct{}
	md    *corev3.Metadata // metadata_context of every message
	mode  *extprocfv3.ProcessingMode
}

// openProc starts the response's ext_proc stream with its headers, when
// the processing mode sends them. The bootstraps skip every request
// phase, so the stream opens on the response (ext_proc.cc opens it on
// the first message it sends).
func (x *exchange) openProc(endOfStream bool) {
	ep := x.g.s.extProc
	if ep == nil {
		return
	}
	p := &procStream{wake: make(chan struct{}, 1), mode: ep.mode}
	// metadata_options.forwarding_namespaces.untyped: the request's
	// dynamic metadata of those namespaces, in every message
	// (ext_proc_integration_test.cc,
	// SendAndReceiveDynamicMetadataObservabilityMode).
	for _, ns := range ep.namespaces {
		if s, ok := x.meta[ns]; ok {
			if p.md == nil {
				p.md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
			}
			p.md.FilterMetadata[ns] = s
		}
	}
	x.proc = p
	if ep.mode.GetResponseHeaderMode() != extprocfv3.ProcessingMode_SKIP {
		p.push(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: x.resp.headerMap(), EndOfStream: endOfStream},
		}})
	}
	i := x.in.procRR.Add(1) - 1
	cc := x.in.conns[i%uint64(len(x.in.conns))]
	x.g.stats.extProcStreams.Add(1)
	x.g.bg.Add(1)
	go func() {
		defer x.g.bg.Done()
		p.run(x.g, cc, ep.deferredClose)
	}()
}

// sendBody queues one body chunk (STREAMED: "as it arrives"). The chunk
// is copied: the read buffer is reused at once.
func (x *exchange) sendBody(b []byte, end bool) {
	p := x.proc
	if p == nil || p.mode.GetResponseBodyMode() != extprocfv3.ProcessingMode_STREAMED || len(b) == 0 && !end {
		return
	}
	p.push(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), b...), EndOfStream: end},
	}})
}

// endBody sends the body's last bytes and its end. With trailers, the
// last chunk has no end_of_stream and the trailers follow (HttpBody:
// "no trailers will be sent" when end_of_stream is true); without, the
// end is on the last chunk, an empty one when the data came earlier (the
// HTTP/1 codec's onMessageComplete dispatches an empty end-of-stream).
func (x *exchange) endBody(last []byte) {
	p := x.proc
	if p == nil {
		return
	}
	sendTrailers := len(x.trailers) > 0 && p.mode.GetResponseTrailerMode() == extprocfv3.ProcessingMode_SEND
	x.sendBody(last, !sendTrailers && len(x.trailers) == 0)
	if sendTrailers {
		p.push(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{Trailers: x.trailers.headerMap()},
		}})
	}
}

func (p *procStream) push(m *extprocv3.ProcessingRequest) {
	m.MetadataContext = p.md
	m.ObservabilityMode = true
	p.mu.Lock()
	p.q = append(p.q, m)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// end says the response is over: no more messages.
func (p *procStream) end() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *procStream) run(g *Gateway, cc *grpc.ClientConn, deferredClose time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		g.stats.extProcErrors.Add(1)
	}
	closed := err != nil // Tollgate closed it, or it never opened: send nothing more
	var batch []*extprocv3.ProcessingRequest
	for {
		p.mu.Lock()
		batch, p.q = p.q, batch[:0]
		ended := p.ended
		p.mu.Unlock()
		for _, m := range batch {
			if closed {
				break
			}
			if err := stream.Send(m); err != nil {
				// io.EOF: Tollgate closed the stream ("it may still close
				// the stream to indicate that no more messages are
				// needed"); anything else is a failure, and
				// failure_mode_allow lets the response go on.
				closed = true
				continue
			}
			g.stats.extProcMessages.Add(1)
		}
		clear(batch)
		if ended {
			p.mu.Lock()
			more := len(p.q) > 0
			p.mu.Unlock()
			if !more {
				break
			}
			continue
		}
		<-p.wake
	}
	if stream == nil {
		return
	}
	t := time.AfterFunc(deferredClose, cancel)
	defer t.Stop()
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}
