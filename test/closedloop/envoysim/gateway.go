// Package envoysim is a closedloop.Gateway that does, for each request,
// what Envoy's filter chain in one of the shipped bootstraps does: the
// ext_authz Check with the body, the upstream call with the headers
// Check set and the router's retries, the response observed through
// ext_proc, and batched access log entries on long-lived streams
// (envoy/envoy-ext-authz.yaml); or ShouldRateLimit before the request
// and the apply_on_stream_done cost report after it (envoy/envoy.yaml).
//
// The settings come from the bootstrap itself, decoded into Envoy's
// protos: timeouts, body buffering, failure modes, processing modes,
// forwarded metadata namespaces, access log buffering, route timeout,
// retry policy and circuit breakers. A bootstrap using something the
// simulator does not mirror is refused by New rather than simulated
// wrongly. Where a message's shape follows Envoy's source rather than a
// setting, the code names the source.
//
// It simulates Config.Instances Envoy processes; each request goes to
// one of them in turn. Each instance holds one gRPC connection per
// Tollgate replica (its tollgate cluster), sends Checks round robin over
// them (lb_policy ROUND_ROBIN), opens one ext_proc stream per response
// (round robin too), and keeps one access log stream, to one replica, for
// its lifetime (Envoy's logger keeps a stream per worker; one worker per
// instance here).
package envoysim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/test/closedloop"
)

// DefaultInstances is how many Envoy processes a Gateway simulates when
// Config.Instances is 0.
const DefaultInstances = 3

// Config configures a Gateway.
type Config struct {
	// Bootstrap is the Envoy bootstrap to mirror (Required):
	// envoy/envoy-ext-authz.yaml (ext_authz, ext_proc, gRPC access log) or
	// envoy/envoy.yaml (ratelimit with a stream-done cost report).
	Bootstrap string
	// Replicas are the Tollgate replicas' gRPC addresses, the endpoints
	// of the bootstrap's tollgate cluster (Required).
	Replicas []string
	// Upstream is the model upstream's base URL, http://host:port,
	// standing for the endpoints of the route's cluster (Required).
	Upstream string
	// Instances is how many Envoy processes to simulate (Optional;
	// default DefaultInstances).
	Instances int
	// Authority is the :authority clients send (Optional; default
	// localhost:<listener port>).
	Authority string

	// tick makes the access log flush timer; tests replace it.
	tick func(time.Duration) (<-chan time.Time, func())
	// unbufferedLog makes a logged entry's handover wait for the logger,
	// so that a test's tick finds it in the batch.
	unbufferedLog bool
}

// Gateway is the simulated fleet of Envoy instances.
type Gateway struct {
	s         *settings
	upstream  string
	upHost    string
	authority string
	instances []*instance
	next      atomic.Uint64
	stats     counters
	conns     []*grpc.ClientConn
	closeOnce sync.Once
	closeErr  error
	bg        sync.WaitGroup // ext_proc streams and stream-done reports
}

var _ closedloop.Gateway = (*Gateway)(nil)

// instance is one simulated Envoy process.
type instance struct {
	id       int
	conns    []*grpc.ClientConn // one per replica: the tollgate cluster's connections
	checkRR  atomic.Uint64
	procRR   atomic.Uint64
	logger   *alsLogger // nil without an http_grpc access logger
	client   *http.Client
	inflight atomic.Int64 // upstream requests, against max_requests
	retrying atomic.Int64 // retries in progress, against max_retries
	connSeq  atomic.Uint32
}

// New dials every replica (lazily: gRPC connects on first use, as Envoy's
// cluster does) and returns a Gateway following cfg.Bootstrap.
func New(cfg Config) (*Gateway, error) {
	if cfg.Bootstrap == "" || len(cfg.Replicas) == 0 || cfg.Upstream == "" {
		return nil, errors.New("envoysim: Bootstrap, Replicas and Upstream are required")
	}
	s, err := loadSettings(cfg.Bootstrap)
	if err != nil {
		return nil, fmt.Errorf("envoysim: %w", err)
	}
	if (s.authz == nil) == (s.rls == nil || s.rls.domain == "") {
		return nil, errors.New("envoysim: the bootstrap needs exactly one of the ext_authz and ratelimit filters")
	}
	if s.rls != nil {
		if err := checkRateLimits(s.rls.rateLimits); err != nil {
			return nil, fmt.Errorf("envoysim: %w", err)
		}
	}
	if cfg.Instances <= 0 {
		cfg.Instances = DefaultInstances
	}
	if cfg.Authority == "" {
		cfg.Authority = "localhost:" + strconv.Itoa(int(s.listenerPort))
	}
	if cfg.tick == nil {
		cfg.tick = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	g := &Gateway{s: s, upstream: cfg.Upstream, authority: cfg.Authority}
	if u, err := parseHostPort(cfg.Upstream); err == nil {
		g.upHost = u
	} else {
		return nil, fmt.Errorf("envoysim: upstream: %w", err)
	}
	for i := range cfg.Instances {
		in := &instance{id: i, client: newUpstreamClient(s)}
		for _, addr := range cfg.Replicas {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				_ = g.Close()
				return nil, fmt.Errorf("envoysim: dial %s: %w", addr, err)
			}
			g.conns = append(g.conns, cc)
			in.conns = append(in.conns, cc)
		}
		if s.als != nil {
			// Instance i's stream lands on replica i mod R: Envoy's round
			// robin picks a host when the stream opens, and instances
			// start at different points of it.
			in.logger = newALSLogger(g, i, in.conns[i%len(in.conns)], cfg.tick, cfg.unbufferedLog)
		}
		g.instances = append(g.instances, in)
	}
	return g, nil
}

// Do sends r through one instance and returns what the client saw.
func (g *Gateway) Do(ctx context.Context, r *closedloop.Request) closedloop.Result {
	in := g.instances[(g.next.Add(1)-1)%uint64(len(g.instances))]
	g.stats.requests.Add(1)
	x := newExchange(g, in, r)
	dctx, cancel := ctx, context.CancelFunc(func() {})
	if r.Timeout > 0 {
		dctx, cancel = context.WithTimeout(ctx, r.Timeout)
	}
	x.run(dctx)
	cancel()
	x.settle()
	res := x.result()
	x.finish()
	return res
}

// Close flushes the access log batches still buffered, waits for the
// ext_proc streams and cost reports in flight, and closes the
// connections.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() {
		g.bg.Wait()
		var errs []error
		for _, in := range g.instances {
			if in.logger != nil {
				errs = append(errs, in.logger.close())
			}
			in.client.CloseIdleConnections()
		}
		for _, cc := range g.conns {
			errs = append(errs, cc.Close())
		}
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

// Stats is a snapshot of what the gateway itself did, cumulative since
// New; the bench takes one per second and differences them.
type Stats struct {
	// Requests is every Do call.
	Requests int64
	// Checks and CheckErrors count ext_authz Check calls and the calls
	// that failed (gRPC error or the filter's timeout).
	Checks, CheckErrors int64
	// RateLimits and RateLimitErrors count request-phase ShouldRateLimit
	// calls and the failed ones; Reports and ReportErrors count the
	// stream-done cost reports.
	RateLimits, RateLimitErrors, Reports, ReportErrors int64
	// Attempts counts requests sent upstream, Retries the ones of those
	// that were retries, RetryOverflows the retries the cluster's
	// max_retries stopped, Overflows the requests its max_requests refused.
	Attempts, Retries, RetryOverflows, Overflows int64
	// ClientTimeouts counts requests whose client gave up.
	ClientTimeouts int64
	// ExtProcStreams, ExtProcMessages and ExtProcErrors count ext_proc
	// streams opened, messages sent on them, and streams that failed.
	ExtProcStreams, ExtProcMessages, ExtProcErrors int64
	// AccessLogStreams, AccessLogMessages, AccessLogEntries and
	// AccessLogErrors count access log streams opened, batches and
	// entries sent, and batches lost to a failed stream.
	AccessLogStreams, AccessLogMessages, AccessLogEntries, AccessLogErrors int64
}

type counters struct {
	requests, checks, checkErrors                      atomic.Int64
	rateLimits, rateLimitErrors, reports, reportErrors atomic.Int64
	attempts, retries, retryOverflows, overflows       atomic.Int64
	clientTimeouts                                     atomic.Int64
	extProcStreams, extProcMessages, extProcErrors     atomic.Int64
	alsStreams, alsMessages, alsEntries, alsErrors     atomic.Int64
}

// Stats returns the counters now.
func (g *Gateway) Stats() Stats {
	c := &g.stats
	return Stats{
		Requests: c.requests.Load(), Checks: c.checks.Load(), CheckErrors: c.checkErrors.Load(),
		RateLimits: c.rateLimits.Load(), RateLimitErrors: c.rateLimitErrors.Load(),
		Reports: c.reports.Load(), ReportErrors: c.reportErrors.Load(),
		Attempts: c.attempts.Load(), Retries: c.retries.Load(),
		RetryOverflows: c.retryOverflows.Load(), Overflows: c.overflows.Load(),
		ClientTimeouts: c.clientTimeouts.Load(),
		ExtProcStreams: c.extProcStreams.Load(), ExtProcMessages: c.extProcMessages.Load(),
		ExtProcErrors:    c.extProcErrors.Load(),
		AccessLogStreams: c.alsStreams.Load(), AccessLogMessages: c.alsMessages.Load(),
		AccessLogEntries: c.alsEntries.Load(), AccessLogErrors: c.alsErrors.Load(),
	}
}

// newUpstreamClient is one instance's connection pool to the route's
// cluster: HTTP/1.1 (the bootstrap's http_protocol_options), one request
// per connection, connections kept for reuse up to max_requests.
func newUpstreamClient(s *settings) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext, // inference_backend connect_timeout: 2s
		MaxIdleConns:        int(s.maxRequests),
		MaxIdleConnsPerHost: int(s.maxRequests),
		IdleConnTimeout:     time.Hour, // Envoy's idle_timeout default: 1h
		DisableCompression:  true,      // Envoy adds no accept-encoding
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

func parseHostPort(base string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, base, nil)
	if err != nil {
		return "", err
	}
	if req.URL.Host == "" {
		return "", fmt.Errorf("%q has no host", base)
	}
	return req.URL.Host, nil
}
