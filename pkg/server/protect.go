package server

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errOverloaded is the default answer to a call past MaxInFlight: at
// once, so the caller's own failure policy (Envoy's failure_mode_deny)
// decides, instead of the call queueing behind thousands of others.
var errOverloaded = status.Error(codes.ResourceExhausted, "tollgate: too many calls in flight on this replica")

// protection holds the per-process bounds on calls and connections and
// their metrics.
type protection struct {
	maxInFlight int64 // <= 0: unbounded
	inFlight    atomic.Int64
	overloaded  func(ctx context.Context, method string, req any) (any, error)
	overloads   *prometheus.CounterVec

	maxConns int64 // <= 0: unbounded
	conns    atomic.Int64
	rejected prometheus.Counter
}

func newProtection(cfg Config) *protection {
	p := &protection{
		maxInFlight: int64(cfg.MaxInFlight),
		overloaded:  cfg.Overloaded,
		maxConns:    int64(cfg.MaxConnections),
		overloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_grpc_overloaded_total",
			Help: "Unary calls answered at once by the overload answer because MaxInFlight calls were in flight, by method.",
		}, []string{"method"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_grpc_connections_rejected_total",
			Help: "gRPC connections closed as soon as accepted because the connection cap was reached.",
		}),
	}
	if p.overloaded == nil {
		p.overloaded = func(context.Context, string, any) (any, error) { return nil, errOverloaded }
	}
	return p
}

// collectors are the metrics to register.
func (p *protection) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		p.overloads,
		p.rejected,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_grpc_calls_in_flight",
			Help: "Unary calls being handled now (health checks left out).",
		}, func() float64 { return float64(p.inFlight.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_grpc_max_calls_in_flight",
			Help: "The cap on unary calls in flight (--max-in-flight); 0 when there is none.",
		}, func() float64 { return float64(max(p.maxInFlight, 0)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_grpc_connections",
			Help: "Open connections on the gRPC port.",
		}, func() float64 { return float64(p.conns.Load()) }),
	}
}

// exempt reports whether a method stays outside the bound: a health
// check must tell Kubernetes and Envoy the truth under load, not be
// refused by it.
func exempt(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/")
}

// unary bounds the unary calls in flight. The semaphore never blocks: a
// call past the bound gets the overload answer at once. Queueing would
// only add latency to every call and hold its memory while Envoy's
// timeout runs out.
func (p *protection) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if exempt(info.FullMethod) {
			return handler(ctx, req)
		}
		if n := p.inFlight.Add(1); p.maxInFlight > 0 && n > p.maxInFlight {
			p.inFlight.Add(-1)
			p.overloads.WithLabelValues(info.FullMethod).Inc()
			return p.overloaded(ctx, info.FullMethod, req)
		}
		defer p.inFlight.Add(-1)
		return handler(ctx, req)
	}
}

// listener caps the open connections of l. Past the cap a connection is
// closed as soon as it is accepted rather than left in the kernel's
// backlog (as netutil.LimitListener does): the client learns at once and
// tries another replica, and a flood costs accept calls, not memory.
func (p *protection) listener(l net.Listener) net.Listener {
	return &limitListener{Listener: l, p: p}
}

type limitListener struct {
	net.Listener
	p *protection
}

// Accept returns the next connection under the cap.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.p.conns.Add(1)
		if l.p.maxConns > 0 && n > l.p.maxConns {
			l.p.conns.Add(-1)
			l.p.rejected.Inc()
			_ = c.Close()
			continue
		}
		return &countedConn{Conn: c, p: l.p}, nil
	}
}

// countedConn gives its slot back on the first Close.
type countedConn struct {
	net.Conn
	p    *protection
	once sync.Once
}

// Close closes the connection and frees its slot.
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.p.conns.Add(-1) })
	return err
}

// register puts the metrics on reg; a nil reg keeps them unregistered.
func (p *protection) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range p.collectors() {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("server: register metrics: %w", err)
		}
	}
	return nil
}
