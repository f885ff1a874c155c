// Package server runs Tollgate's two listeners: one gRPC port that carries
// every Envoy-facing API (rate limit now; ext_authz and access logs are
// registered the same way), plus health and reflection, and an admin HTTP
// port with /metrics, /healthz, /readyz, /debug/config and, when asked
// for, /debug/pprof/. It knows
// nothing of the APIs it carries: each one registers itself. The gRPC
// port may serve TLS or mutual TLS, with certificates re-read on rotation
// (see TLS).
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// Service is an API served on the gRPC port; it registers itself, so the
// server needs no knowledge of its protos.
type Service interface {
	Register(grpc.ServiceRegistrar)
}

// Defaults for the zero values of Config.
const (
	DefaultDrainTimeout         = 10 * time.Second
	DefaultReadyTimeout         = time.Second
	DefaultHealthInterval       = 2 * time.Second
	DefaultMaxRecvMsgSize       = 4 << 20
	DefaultMaxConcurrentStreams = 1024
	DefaultMaxInFlight          = 4096
	DefaultMaxConnections       = 4096
	DefaultConnectionTimeout    = 5 * time.Second
	adminShutdownTimeout        = 5 * time.Second
)

// Warm-up pacing.
const (
	// WarmRetry is how soon a failed Warm is tried again, and WarmTimeout
	// bounds one try.
	WarmRetry   = 250 * time.Millisecond
	WarmTimeout = 5 * time.Second
	// DefaultWarmMax is Config.WarmMax's default: two tries timed out.
	DefaultWarmMax = 2 * WarmTimeout
	// warmLogEvery is how often a Warm that keeps failing is logged.
	warmLogEvery = 10 * time.Second
)

// Config is what a Server is built from.
type Config struct {
	// Services are the APIs on the gRPC port (Required: at least one).
	Services []Service
	// Logger (Optional; default a no-op logger).
	Logger *zap.Logger
	// Gatherer serves /metrics (Required).
	Gatherer prometheus.Gatherer
	// Ready says whether this replica should take traffic: nil when it
	// should, else why not. It drives /readyz and the gRPC health status.
	// (Optional; default always ready.)
	Ready func(ctx context.Context) error
	// ReadyDetail adds lines to /readyz's body after its first, which
	// says ready or why not: what an operator wants to know either way,
	// such as a store answered by a failure policy (Optional). It must
	// hold no secret.
	ReadyDetail func() string
	// Warm readies what the first calls need (Optional). Serve calls it
	// before the gRPC port serves, and again every WarmRetry until it
	// returns nil; until then the replica is not ready (/readyz says
	// "warming up" and why) and connections to the gRPC port wait in the
	// listener's backlog, for WarmMax at most. Each call is bounded by
	// WarmTimeout.
	Warm func(ctx context.Context) error
	// WarmMax bounds how long the gRPC port waits for Warm (Optional;
	// default DefaultWarmMax). Past it the port serves, and says so in
	// the log, while Warm is retried and the replica stays unready until
	// it succeeds: a start never hangs on a store that answers slowly.
	WarmMax time.Duration
	// DebugConfig returns the value /debug/config renders as JSON. Its
	// type decides what is shown, so it should be a view built for the
	// purpose, with secrets left out or redacted. (Optional; without it
	// /debug/config is 404.)
	DebugConfig func() any
	// DrainTimeout bounds how long in-flight calls may finish after
	// shutdown starts before they are cut (Optional; default 10s).
	DrainTimeout time.Duration
	// ReadyTimeout bounds one Ready call (Optional; default 1s).
	ReadyTimeout time.Duration
	// HealthInterval is how often the gRPC health status is re-checked
	// (Optional; default 2s).
	HealthInterval time.Duration
	// MaxRecvMsgSize is the largest request accepted (Optional; default
	// 4 MiB, which holds the largest descriptor set the limiter accepts).
	MaxRecvMsgSize int
	// MaxConcurrentStreams caps calls in flight per connection; Envoy
	// opens another connection when it reaches it (Optional; default 1024).
	MaxConcurrentStreams uint32
	// MaxInFlight caps the unary calls this server handles at once, health
	// checks left out; a call past it gets Overloaded's answer at once
	// instead of queueing (Optional; default 4096; negative: no cap). By
	// Little's law 4096 in flight at a replica's tens of thousands of
	// decisions a second is a queue of 40-200ms, already past Envoy's
	// 20ms rate limit timeout, so calls beyond it would be answered too
	// late anyway; and it caps what they hold (a goroutine and a request
	// each, ~10 KiB) at about 40 MiB.
	MaxInFlight int
	// Overloaded answers a call past MaxInFlight; method is the full gRPC
	// method name (Optional; default codes.ResourceExhausted). It must
	// not block: it runs because the server has no room.
	Overloaded func(ctx context.Context, method string, req any) (any, error)
	// MaxConnections caps open connections on the gRPC port; past it a
	// connection is closed as soon as it is accepted (Optional; default
	// 4096; negative: no cap). Envoy keeps one or a few connections per
	// worker thread to each replica, so thousands means thousands of
	// Envoys, or a client that leaks connections.
	MaxConnections int
	// ConnectionTimeout bounds a new connection's TLS and HTTP/2
	// handshake, so a client that connects and sends nothing frees its
	// slot (Optional; default 5s).
	ConnectionTimeout time.Duration
	// Registerer receives the server's own metrics: calls in flight,
	// overloads, connections (Optional; nil leaves them unregistered).
	Registerer prometheus.Registerer
	// TLS serves the gRPC port over TLS, or mutual TLS (Optional; nil
	// serves plaintext). The admin port stays plaintext.
	TLS *TLS
	// Admin are more admin HTTP routes: http.ServeMux pattern -> handler,
	// such as "GET /debug/pressure" (Optional). A pattern that clashes
	// with the built-in ones makes New fail.
	Admin map[string]http.Handler
	// UnaryInterceptors run inside the server's own (panic recovery, then
	// the MaxInFlight bound), in order, around every unary call (Optional).
	UnaryInterceptors []grpc.UnaryServerInterceptor
	// Callers restricts APIs to the clients whose verified certificate has
	// an allowed URI SAN (Optional; default every API is open to every
	// client TLS admits). It needs TLS with a ClientCAFile: without client
	// certificates no caller could match.
	Callers *Callers
	// Pprof serves net/http/pprof under /debug/pprof/ on the admin port
	// (Optional; default off: a profile shows the command line and costs
	// CPU while it runs, so an operator asks for it). net/http/pprof
	// extends the write deadline of a CPU profile or trace by its length.
	Pprof bool
	// Cmdline is what /debug/pprof/cmdline shows, secrets already redacted
	// (Optional; default the program name alone). net/http/pprof's own
	// handler would show os.Args, where a Redis URL carries its password.
	Cmdline []string
	// DebugToken, when set, is the bearer token every path under /debug/
	// needs (Optional; default none: the caller binds the admin port to
	// loopback instead). It is compared in constant time and never logged.
	DebugToken string
}

// Server is the gRPC and admin HTTP servers of one process.
type Server struct {
	cfg      Config
	log      *zap.Logger
	grpc     *grpc.Server
	health   *health.Server
	services []string // gRPC service names whose health follows readiness
	admin    *http.Server
	draining atomic.Bool
	tls      *tlsFiles // nil for plaintext
	protect  *protection

	// warm is nil once Warm succeeded (or without one), else why the
	// replica is not warm yet.
	warm atomic.Pointer[error]
}

// New builds a Server; Serve starts it.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, protect: newProtection(cfg)}
	if cfg.Warm != nil {
		s.setWarm(errNotWarm)
	}
	if err := s.protect.register(cfg.Registerer); err != nil {
		return nil, err
	}
	if err := s.buildGRPC(); err != nil {
		return nil, err
	}
	admin, err := s.adminHandler()
	if err != nil {
		return nil, err
	}
	s.admin = &http.Server{
		Handler:           admin,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          zap.NewStdLog(s.log.Named("admin")),
	}
	return s, nil
}

// withDefaults is cfg with its unset options at their defaults, or why
// it cannot serve.
func (cfg Config) withDefaults() (Config, error) {
	if len(cfg.Services) == 0 {
		return cfg, errors.New("server: no services")
	}
	if cfg.Gatherer == nil {
		return cfg, errors.New("server: no metrics gatherer")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Ready == nil {
		cfg.Ready = func(context.Context) error { return nil }
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if cfg.MaxConcurrentStreams == 0 {
		cfg.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.ConnectionTimeout <= 0 {
		cfg.ConnectionTimeout = DefaultConnectionTimeout
	}
	if cfg.WarmMax <= 0 {
		cfg.WarmMax = DefaultWarmMax
	}
	return cfg, nil
}

// buildGRPC builds s.grpc, its interceptors, codec and credentials, and
// registers the services, health (not serving until Ready says so) and
// reflection on it.
func (s *Server) buildGRPC() error {
	cfg := s.cfg
	codec := newUTF8Codec()
	if err := codec.register(cfg.Registerer); err != nil {
		return err
	}
	unary := []grpc.UnaryServerInterceptor{recoverUnary(s.log)}
	stream := []grpc.StreamServerInterceptor{recoverStream(s.log)}
	if cfg.Callers != nil {
		g, err := s.guardCallers()
		if err != nil {
			return err
		}
		unary, stream = append(unary, g.unary()), append(stream, g.stream())
	}
	var creds []grpc.ServerOption
	if cfg.TLS != nil {
		files, err := newTLSFiles(*cfg.TLS, s.log)
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		s.tls = files
		creds = append(creds, grpc.Creds(credentials.NewTLS(files.serverConfig())))
	}
	s.grpc = grpc.NewServer(append(creds,
		grpc.ChainUnaryInterceptor(append(append(unary, s.protect.unary()), cfg.UnaryInterceptors...)...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.ForceServerCodecV2(codec),
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.ConnectionTimeout(cfg.ConnectionTimeout),
		// An idle connection gives its 32 KiB write buffer back to a pool,
		// so thousands of Envoy connections that are mostly idle cost
		// their goroutines, not their buffers. grpc-go does this by default
		// now, and deprecated the SharedWriteBuffer option that asked for it.
		// Envoy keeps its connections for a long time: ping idle ones so a
		// peer that vanished (node gone, no FIN) is noticed, and tolerate
		// Envoy's own keepalive pings down to 10s, with or without calls.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
	for _, svc := range cfg.Services {
		svc.Register(s.grpc)
	}
	for name := range s.grpc.GetServiceInfo() {
		s.services = append(s.services, name)
	}
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	// health.NewServer reports "" as SERVING; nothing is until Ready says so.
	s.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	return nil
}

func (s *Server) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	for _, name := range s.services {
		s.health.SetServingStatus(name, st)
	}
}

// Serve serves gRPC on grpcLis and the admin API on adminLis until ctx is
// done, then shuts down gracefully: it reports not ready (/readyz and
// gRPC health), lets calls in flight finish for up to DrainTimeout, cuts
// the rest, and stops the admin server. It returns once all of that is
// done: nil after ctx ends, or the error that stopped a listener early.
// Serve closes both listeners.
func (s *Server) Serve(ctx context.Context, grpcLis, adminLis net.Listener) error {
	// The two servers are one group: the first to fail ends gctx, which
	// starts the shutdown below as the end of ctx does, and Wait returns
	// that first error once both have stopped.
	g, gctx := errgroup.WithContext(ctx)
	warmCtx, stopWarm := context.WithCancel(ctx)
	defer stopWarm()
	warmDone := make(chan struct{})
	g.Go(func() error {
		if !s.waitWarm(warmCtx, warmDone) {
			_ = grpcLis.Close()
			return nil
		}
		// Serve after GracefulStop (shutdown began as warm-up ended)
		// returns ErrServerStopped at once: a normal end.
		if err := s.grpc.Serve(s.protect.listener(grpcLis)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve grpc on %s: %w", grpcLis.Addr(), err)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.admin.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve admin on %s: %w", adminLis.Addr(), err)
		}
		return nil
	})
	// Readiness is not in the group: shutdown stops it first, so that
	// Envoy and Kubernetes see the replica go unready before the drain.
	hctx, hcancel := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		s.followReadiness(hctx)
	}()
	s.log.Info("serving", zap.Stringer("grpc_addr", grpcLis.Addr()), zap.Stringer("admin_addr", adminLis.Addr()),
		zap.Bool("grpc_tls", s.tls != nil), zap.Bool("grpc_mtls", s.tls != nil && s.tls.mutual()))

	<-gctx.Done()
	s.shutdown(hcancel, healthDone)
	stopWarm()
	<-warmDone
	return g.Wait()
}

// shutdown stops taking traffic, in the order that lets Envoy and
// Kubernetes see it first: readiness, then gRPC drain, then admin.
func (s *Server) shutdown(stopHealth context.CancelFunc, healthDone <-chan struct{}) {
	s.log.Info("shutting down", zap.Duration("drain_timeout", s.cfg.DrainTimeout))
	s.draining.Store(true)
	stopHealth()
	<-healthDone
	s.health.Shutdown() // NOT_SERVING for every service, and stays so

	drained := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(drained)
	}()
	t := time.NewTimer(s.cfg.DrainTimeout)
	select {
	case <-drained:
		t.Stop()
	case <-t.C:
		s.log.Warn("drain timed out; closing calls still in flight")
		s.grpc.Stop()
		<-drained
	}

	ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	if err := s.admin.Shutdown(ctx); err != nil {
		s.log.Warn("admin shutdown", zap.Error(err))
		_ = s.admin.Close()
	}
	s.log.Info("stopped")
}

// followReadiness keeps the gRPC health status in step with Ready until
// ctx is done, so Envoy's and Kubernetes' gRPC health checks see what
// /readyz says.
func (s *Server) followReadiness(ctx context.Context) {
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	var last error
	first := true
	for {
		err := s.ready(ctx)
		if ctx.Err() != nil {
			return
		}
		if first || (err == nil) != (last == nil) {
			if err == nil {
				s.log.Info("ready")
				s.setHealth(healthpb.HealthCheckResponse_SERVING)
			} else {
				s.log.Warn("not ready", zap.Error(err))
				s.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
			}
		}
		first, last = false, err
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// errDraining is the readiness answer once shutdown has begun.
var errDraining = errors.New("shutting down")

// errNotWarm is the readiness answer before the first Warm returned.
var errNotWarm = errors.New("warming up")

func (s *Server) setWarm(err error) {
	if err == nil {
		s.warm.Store(nil)
		return
	}
	s.warm.Store(&err)
}

// waitWarm runs warmUp, closing done when it returns, and reports when
// the gRPC port may serve: true once Warm succeeded or WarmMax passed
// (warmUp then goes on), false when ctx ended first.
func (s *Server) waitWarm(ctx context.Context, done chan<- struct{}) bool {
	if s.cfg.Warm == nil {
		close(done)
		return true
	}
	warmed := make(chan bool, 1)
	go func() {
		defer close(done)
		warmed <- s.warmUp(ctx)
	}()
	t := time.NewTimer(s.cfg.WarmMax)
	defer t.Stop()
	select {
	case ok := <-warmed:
		return ok
	case <-t.C:
		why := errNotWarm
		if err := s.warm.Load(); err != nil {
			why = *err
		}
		s.log.Warn("warm-up unfinished; the gRPC port serves without it, and the replica stays unready until it succeeds",
			zap.Duration("warm_max", s.cfg.WarmMax), zap.Error(why))
		return true
	}
}

// warmUp calls Warm until it succeeds, and reports whether it did before
// ctx ended. A Warm that keeps failing is logged once, then every
// warmLogEvery.
func (s *Server) warmUp(ctx context.Context) bool {
	if s.cfg.Warm == nil {
		return true
	}
	var logged time.Time
	for {
		wctx, cancel := context.WithTimeout(ctx, WarmTimeout)
		err := s.cfg.Warm(wctx)
		cancel()
		if err == nil {
			s.setWarm(nil)
			s.log.Info("warmed up")
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		s.setWarm(fmt.Errorf("%w: %w", errNotWarm, err))
		if time.Since(logged) >= warmLogEvery {
			s.log.Warn("warm-up failed; the gRPC port waits until it succeeds", zap.Error(err), zap.Duration("retry_every", WarmRetry))
			logged = time.Now()
		}
		t := time.NewTimer(WarmRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

func (s *Server) ready(ctx context.Context) error {
	if s.draining.Load() {
		return errDraining
	}
	if err := s.warm.Load(); err != nil {
		return *err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	return s.cfg.Ready(ctx)
}
