package envoysim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/tollgate-dev/tollgate/test/closedloop"
)

// maxUsageBody bounds the response bytes kept to read the usage from.
const maxUsageBody = 1 << 20

var chunkPool = sync.Pool{New: func() any { b := make([]byte, bodyChunk); return &b }}

// retryPolicy is the router's RetryState for one request: the route's
// retry_policy merged with x-envoy-retry-on, its count overridden by
// x-envoy-max-retries (router docs, "x-envoy-max-retries": a request
// without a retry policy or x-envoy-retry-on is never retried).
type retryPolicy struct {
	on        map[string]bool
	codes     []uint32
	remaining int
	base, max time.Duration
	step      int // Envoy's JitteredExponentialBackOffStrategy current_retry_
}

func (x *exchange) retryPolicy() *retryPolicy {
	rp := x.g.s.route.retry
	var on []string
	if rp != nil {
		on = append(on, strings.Split(rp.GetRetryOn(), ",")...)
	}
	if v, ok := x.req.get("x-envoy-retry-on"); ok {
		on = append(on, strings.Split(v, ",")...)
	}
	p := &retryPolicy{on: map[string]bool{}, remaining: defaultNumRetries, base: defaultRetryBase, step: 1}
	for _, o := range on {
		if o = strings.TrimSpace(o); o != "" {
			p.on[o] = true
		}
	}
	if len(p.on) == 0 {
		return nil
	}
	if rp != nil {
		if n := rp.GetNumRetries(); n != nil {
			p.remaining = int(n.GetValue())
		}
		p.codes = rp.GetRetriableStatusCodes()
		if b := rp.GetRetryBackOff(); b != nil {
			p.base = b.GetBaseInterval().AsDuration()
			if b.GetMaxInterval() != nil {
				p.max = b.GetMaxInterval().AsDuration()
			}
		}
	}
	if p.max == 0 {
		p.max = 10 * p.base // retry_back_off.max_interval: "defaults to 10 times the base_interval"
	}
	if v, ok := x.req.get("x-envoy-max-retries"); ok {
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
			p.remaining = int(n)
		}
	}
	return p
}

// retriableStatus follows the retry_on conditions of the router docs.
func (p *retryPolicy) retriableStatus(code int) bool {
	switch {
	case p.on["5xx"] && code >= 500:
		return true
	case p.on["gateway-error"] && (code == 502 || code == 503 || code == 504):
		return true
	case p.on["retriable-4xx"] && code == 409:
		return true
	case p.on["retriable-status-codes"]:
		for _, c := range p.codes {
			if int(c) == code {
				return true
			}
		}
	}
	return false
}

func (p *retryPolicy) retriableReset(connectFailure bool) bool {
	return p.on["5xx"] || p.on["gateway-error"] || p.on["reset"] || connectFailure && p.on["connect-failure"]
}

// backoff is Envoy's JitteredExponentialBackOffStrategy: a random wait in
// [0, (2^n-1)*base), capped at max.
func (p *retryPolicy) backoff() time.Duration {
	ceil := time.Duration((1<<p.step)-1) * p.base
	if ceil <= p.max {
		p.step++
	}
	if ceil <= 0 {
		return 0
	}
	return min(time.Duration(rand.Int64N(int64(ceil))), p.max)
}

type retryVerdict int

const (
	noRetry retryVerdict = iota
	retryNow
	retryLimitExceeded // URX
	retryOverflow      // the cluster's max_retries or retry_budget: UO
)

// shouldRetry is RetryStateImpl::shouldRetry after the condition
// matched: out of retries, or out of the cluster's retry budget.
func (x *exchange) shouldRetry(p *retryPolicy) retryVerdict {
	if p.remaining == 0 {
		return retryLimitExceeded
	}
	full := x.in.retrying.Load() >= int64(x.g.s.maxRetries)
	if b := x.g.s.retryBudget; b != nil {
		full = !b.allows(x.in.retrying.Load(), x.in.inflight.Load())
	}
	if full {
		x.g.stats.retryOverflows.Add(1)
		return retryOverflow
	}
	p.remaining--
	return retryNow
}

// forward is the router: it sends the request upstream within the route
// timeout, retries as the policy says, and streams the answer back.
func (x *exchange) forward(ctx context.Context) {
	s := x.g.s
	rctx, cancel := context.WithTimeout(ctx, s.route.timeout)
	defer cancel()
	pol := x.retryPolicy()
	hdr := x.req.toHTTP()
	// router.cc: the expected timeout goes upstream in this header.
	hdr.Set("X-Envoy-Expected-Rq-Timeout-Ms", strconv.FormatInt(s.route.timeout.Milliseconds(), 10))
	url := x.g.upstream + x.r.Path
	retrying := false
	release := func() {
		if retrying {
			x.in.retrying.Add(-1)
			retrying = false
		}
	}
	defer release()
	for {
		if x.in.inflight.Load() >= int64(s.maxRequests) {
			// The cluster's circuit breaker: max_requests reached.
			x.g.stats.overflows.Add(1)
			x.flag().UpstreamOverflow = true
			x.localReply(http.StatusServiceUnavailable, nil, "upstream connect error or disconnect/reset before headers. reset reason: overflow",
				detailsResetBeforeStart+"{overflow}", closedloop.SourceEnvoy)
			return
		}
		x.attempts++
		x.g.stats.attempts.Add(1)
		x.in.inflight.Add(1)
		resp, err := x.attempt(rctx, url, hdr)
		if err != nil {
			x.in.inflight.Add(-1)
			release()
			if ctx.Err() != nil {
				return // the client went away: finish logs DC
			}
			if rctx.Err() != nil {
				x.flag().UpstreamRequestTimeout = true
				x.localReply(http.StatusGatewayTimeout, nil, "upstream request timeout", detailsUpstreamTimeout, closedloop.SourceEnvoy)
				return
			}
			connectFailure := isConnectFailure(err)
			if pol != nil && pol.retriableReset(connectFailure) {
				switch x.shouldRetry(pol) {
				case retryNow:
					if !x.wait(ctx, rctx, pol) {
						return
					}
					retrying = true
					x.in.retrying.Add(1)
					x.g.stats.retries.Add(1)
					continue
				case retryLimitExceeded:
					x.flag().UpstreamRetryLimitExceeded = true
				case retryOverflow:
					x.flag().UpstreamOverflow = true
				}
			}
			reason := "connection_termination"
			if connectFailure {
				reason = "remote_connection_failure"
				x.flag().UpstreamConnectionFailure = true
			} else {
				x.flag().UpstreamConnectionTermination = true
			}
			x.localReply(http.StatusServiceUnavailable, nil,
				"upstream connect error or disconnect/reset before headers. reset reason: "+strings.ReplaceAll(reason, "_", " "),
				detailsResetBeforeStart+"{"+reason+"}", closedloop.SourceEnvoy)
			return
		}
		x.firstUpRx = x.at()
		release()
		if pol != nil && pol.retriableStatus(resp.StatusCode) {
			switch x.shouldRetry(pol) {
			case retryNow:
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxUsageBody))
				resp.Body.Close()
				x.in.inflight.Add(-1)
				if !x.wait(ctx, rctx, pol) {
					return
				}
				retrying = true
				x.in.retrying.Add(1)
				x.g.stats.retries.Add(1)
				continue
			case retryLimitExceeded:
				x.flag().UpstreamRetryLimitExceeded = true
			case retryOverflow:
				x.flag().UpstreamOverflow = true
			}
		}
		x.respond(ctx, rctx, resp)
		x.in.inflight.Add(-1)
		return
	}
}

// wait sleeps the retry backoff; false when the route timeout or the
// client ended it first.
func (x *exchange) wait(ctx, rctx context.Context, p *retryPolicy) bool {
	t := time.NewTimer(p.backoff())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-rctx.Done():
		if ctx.Err() == nil {
			// The route timeout during a backoff: the router answers 504.
			x.flag().UpstreamRequestTimeout = true
			x.localReply(http.StatusGatewayTimeout, nil, "upstream request timeout", detailsUpstreamTimeout, closedloop.SourceEnvoy)
		}
		return false
	}
}

// attempt sends one upstream request and records its timings and
// addresses.
func (x *exchange) attempt(ctx context.Context, url string, hdr http.Header) (*http.Response, error) {
	trace := &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) {
			x.upstreamAddr = netAddress(ci.Conn.RemoteAddr())
			x.upstreamLoc = netAddress(ci.Conn.LocalAddr())
			x.firstUpTx = x.at()
		},
		WroteRequest: func(httptrace.WroteRequestInfo) { x.lastUpTx = x.at() },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), x.r.Method, url, bytes.NewReader(x.r.Body))
	if err != nil {
		return nil, err
	}
	req.Header = hdr
	req.Host = x.g.authority
	return x.in.client.Do(req)
}

// respond streams the upstream response to the client and, through
// ext_proc, to Tollgate.
func (x *exchange) respond(ctx, rctx context.Context, resp *http.Response) {
	defer resp.Body.Close()
	x.status, x.details, x.source = resp.StatusCode, detailsViaUpstream, closedloop.SourceUpstream
	x.resp = make(headers, 0, len(resp.Header)+4)
	x.resp.add(":status", strconv.Itoa(resp.StatusCode))
	x.resp.fromHTTP(resp.Header)
	// router.cc adds the upstream's time to first byte.
	x.resp.add("x-envoy-upstream-service-time", strconv.FormatInt((x.firstUpRx.d-x.firstUpTx.d).Milliseconds(), 10))
	for _, o := range x.addResponse {
		x.resp.apply(o)
	}
	for _, h := range x.addRLSResp {
		x.resp.add(strings.ToLower(h.GetKey()), headerValue(h))
	}
	x.firstDownTx = x.at()
	noBody := resp.ContentLength == 0 && len(resp.Trailer) == 0
	x.openProc(noBody)
	if noBody {
		x.lastUpRx, x.lastDownTx, x.complete = x.at(), x.at(), true
		x.proc.end()
		return
	}
	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			x.bytesSent += uint64(n)
			if len(x.usage)+n <= maxUsageBody {
				x.usage = append(x.usage, buf[:n]...)
			}
			x.lastUpRx, x.lastDownTx = x.at(), x.at()
		}
		if err == nil {
			x.sendBody(buf[:n], false)
			continue
		}
		if errors.Is(err, io.EOF) {
			for k, vs := range resp.Trailer {
				for _, v := range vs {
					x.trailers.add(strings.ToLower(k), v)
				}
			}
			x.endBody(buf[:n])
			x.complete = true
			return
		}
		x.sendBody(buf[:n], false)
		switch {
		case ctx.Err() != nil:
			// The client went away mid-body: finish logs DC.
		case rctx.Err() != nil:
			x.flag().UpstreamRequestTimeout = true
			x.details = detailsUpstreamTimeout
			x.complete = true // Envoy reset the stream; the client did not give up
		default:
			x.flag().UpstreamConnectionTermination = true
			x.details = detailsResetAfterStart + "{connection_termination}"
			x.complete = true
		}
		return
	}
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

func isConnectFailure(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED)
}

func netAddress(a net.Addr) *corev3.Address {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return nil
	}
	return socketAddress(ta.IP.String(), uint32(ta.Port))
}
