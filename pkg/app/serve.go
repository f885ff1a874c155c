package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/rls"
	"github.com/tollgate-dev/tollgate/pkg/server"
	"github.com/tollgate-dev/tollgate/pkg/store/lease"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/overlimit"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
)

// serveFlags are serve's settings; each flag can also come from its
// TOLLGATE_* variable.
type serveFlags struct {
	config    string
	grpcAddr  string
	adminAddr string
	redisURL  string
	redis     redisFlags
	logLevel  string
	logFormat string
	tls       tlsFlags
	callers   callerFlags
	authz     authzFlags
	pressure  pressureFlags
	debug     debugFlags
	lease     leaseFlags
	protect   protectFlags
	failure   failureFlags
	tickets   ticketFlags
	metrics   metricFlags
}

func (a *App) parseServeFlags(args []string) (*serveFlags, error) {
	f := &serveFlags{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	fs.StringVar(&f.config, "config", "config", "rule file, or directory of *.yaml rule files, reloaded on change")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "gRPC address for Envoy's APIs, health and reflection")
	fs.StringVar(&f.adminAddr, "admin-addr", ":8080", "admin HTTP address: /metrics, /healthz, /readyz, /v1/pressure (with --pressure-token-file), /debug/config and /debug/pressure (with --debug), /debug/pprof/ (with --pprof)")
	fs.StringVar(&f.redisURL, "redis-url", "", "Redis URL (redis://, rediss://, unix://, redis+sentinel://, redis+cluster://); empty keeps counters in memory")
	f.redis.register(fs)
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or console")
	f.tls.register(fs)
	f.callers.register(fs)
	f.authz.register(fs)
	f.pressure.register(fs)
	f.debug.register(fs)
	f.lease.register(fs)
	f.failure.register(fs)
	f.protect.register(fs)
	f.tickets.register(fs)
	f.metrics.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tollgate serve [flags]\n\nEvery flag can also be set with TOLLGATE_<FLAG> (--grpc-addr: TOLLGATE_GRPC_ADDR); the flag wins.\n\n")
		fs.PrintDefaults()
	}
	if err := a.parseFlags(fs, args); err != nil {
		return nil, err
	}
	for _, check := range []func() error{f.tls.check, func() error { return f.callers.check(f.tls) }, f.pressure.check, f.lease.check, f.protect.check, f.failure.check, func() error { return f.redis.check(f.redisURL, a.lookupEnv) }, func() error { return f.debug.check(f.adminAddr) }, f.metrics.check} {
		if err := check(); err != nil {
			fmt.Fprintf(fs.Output(), "tollgate serve: %v\n", err)
			return nil, errUsage
		}
	}
	return f, nil
}

func (a *App) serve(ctx context.Context, args []string) int {
	f, err := a.parseServeFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		return ExitUsage
	}
	log, err := newLogger(a.Stderr, f.logLevel, f.logFormat)
	if err != nil {
		fmt.Fprintf(a.Stderr, "tollgate serve: %v\n", err)
		return ExitUsage
	}
	defer func() { _ = log.Sync() }()
	if err := a.runServe(ctx, f, args, log); err != nil {
		log.Error("serve", zap.Error(err))
		return ExitError
	}
	return ExitOK
}

// pingStore is a Store that can say whether it is reachable.
type pingStore interface {
	limit.Store
	Ping(ctx context.Context) error
}

var (
	_ pingStore = (*memstore.Store)(nil)
	_ pingStore = (*redisstore.Store)(nil)
)

// runServe serves with f; args are serve's arguments as given, which
// /debug/pprof/cmdline shows redacted.
func (a *App) runServe(ctx context.Context, f *serveFlags, args []string, log *zap.Logger) error {
	log.Info("starting", zap.String("version", a.versionString()))
	rules, err := config.Load(f.config)
	if err != nil {
		logProblems(log, "rules", err)
		return fmt.Errorf("load rules %q: the rules above must be fixed", f.config)
	}
	log.Info("rules loaded", zap.String("path", f.config), zap.Int("domains", len(rules.Domains())))

	// The client learns first that Redis is back (its probe, every
	// redisstore.RedialInterval); the store circuit, made below, then
	// probes at once instead of at the end of its backoff (issue 13).
	var recovered recoveries
	store, shared, closeStore, err := openStore(f.redisURL, append(f.redis.options(), redisstore.WithRecovered(recovered.retry))...)
	if err != nil {
		return err
	}
	defer closeStore()
	ticketKeys, keepKeys, err := f.tickets.ticketKeys(ctx, store, log.Named("tickets"))
	if err != nil {
		return fmt.Errorf("--ticket-key-file: %w", err)
	}
	raw, health := store, newStoreHealth(log.Named("store"), f.failure, shared.replicas, f.pressure.replica())
	stopHealth := health.start(ctx)
	defer stopHealth()
	var local *overlimit.Store
	var leases *lease.Store
	var guard *storeguard.Guard
	if f.redisURL != "" {
		// Busy keys with high limits are admitted from leases, and keys
		// known to be over their limit are denied, without a Redis round
		// trip (issue 5). Leases sit outside the over-limit cache: a
		// decision a lease admits must not be denied by a denial learnt
		// before the lease, and the leases' refunds pass through the
		// cache, which then forgets the keys they give room back to.
		// The leases' rest goes back to Redis once the server has
		// drained, before the client closes: hence not the serve
		// context, which ends before draining starts.
		guard = storeguard.New(store, storeguard.Options{OnChange: health.circuitChanged}) // a down Redis fails decisions fast (issue 6)
		recovered.guard.Store(guard)
		local = overlimit.New(guard, overlimit.Options{})
		var outer limit.Store
		var stopLeases func()
		leases, outer, stopLeases = f.lease.wrap(context.WithoutCancel(ctx), local, log)
		defer stopLeases()
		store = pingable{Store: outer, ping: store.Ping}
	}
	if a.wrapStore != nil {
		store = a.wrapStore(store)
	}
	if f.redisURL == "" {
		log.Info("store", zap.String("kind", "memory"))
	} else {
		log.Info("store", zap.String("kind", "redis"), zap.String("url", redactURL(f.redisURL)))
	}

	reg := prometheus.NewRegistry()
	if err := registerProcessMetrics(reg, a.versionString()); err != nil {
		return err
	}
	if local != nil {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tollgate_store_local_denials_total",
			Help: "Decisions denied without a store call because every key they charge was known to be over its limit.",
		}, func() float64 { return float64(local.LocalDenials()) })); err != nil {
			return err
		}
	}
	if leases != nil {
		if err := registerLeaseMetrics(reg, leases); err != nil {
			return err
		}
	}
	failures, err := newFailureMetrics(reg, guard, health)
	if err != nil {
		return err
	}
	reloads, err := newReloadMetrics(reg)
	if err != nil {
		return err
	}
	reloads.loaded()

	sh, err := newShedder(ctx, f.pressure, shared, log.Named("pressure"))
	if err != nil {
		return err
	}
	defer sh.stop()
	if err := reg.Register(newPressureCollector(sh)); err != nil {
		return fmt.Errorf("register pressure metrics: %w", err)
	}
	lim := admission.NewLimiter(store, limit.SystemClock{}, rules, append(sh.limiterOptions(), f.failure.option(failures, f.redisURL != "", health.replicas.get))...)
	loop, err := outcome.New(ticketKeys, lim, log.Named("outcome"), reg, outcome.Options{Completed: sh.completed})
	if err != nil {
		return err
	}
	rlsSvc, err := rls.New(lim, log.Named("rls"), reg, f.metrics.rlsOptions()...)
	if err != nil {
		return err
	}
	rlsSvc.SetSealer(loop.Sealer())
	az, err := newAuthz(f.authz, lim, loop, log, reg)
	if err != nil {
		return err
	}
	sh.als = az.als
	if err := sh.apply(rules); err != nil {
		return fmt.Errorf("pressure and breakers: %w", err)
	}
	admin := map[string]http.Handler{}
	var debugConfig func() any
	if f.debug.debug {
		admin["GET /debug/pressure"] = debugJSON(func() any { return sh.view() })
		debugConfig = func() any {
			return newConfigView(a.versionString(), f.config, f.redisURL, lim.Rules())
		}
	}
	if f.pressure.tokenFile != "" {
		admin["/v1/pressure"] = sh.handler()
	}
	storeReady := &storeReadiness{policy: f.failure.parsed, guard: guard, ping: store.Ping, health: health}
	srv, err := server.New(server.Config{
		Services: append([]server.Service{rlsSvc}, az.services()...),
		Logger:   log.Named("server"),
		Gatherer: reg,
		TLS:      f.tls.server(),
		Callers:  f.callers.parsed,
		Ready: func(ctx context.Context) error {
			if lim.Rules() == nil {
				return errors.New("rules not loaded")
			}
			return storeReady.ready(ctx)
		},
		Warm:                 storeReady.warmUp(raw),
		ReadyDetail:          func() string { return joinLines(health.detail(), az.detail()) },
		DebugConfig:          debugConfig,
		Admin:                admin,
		UnaryInterceptors:    sh.interceptors(),
		Pprof:                f.debug.pprof,
		Cmdline:              append([]string{"tollgate", "serve"}, redactArgs(args)...),
		DebugToken:           f.debug.token,
		Registerer:           reg,
		Overloaded:           overloadAnswer(f.failure.parsed),
		MaxInFlight:          f.protect.inFlight(),
		MaxConnections:       f.protect.connections(),
		MaxConcurrentStreams: f.protect.streams(),
	})
	if err != nil {
		return err
	}

	var lc net.ListenConfig
	grpcLis, err := lc.Listen(ctx, "tcp", f.grpcAddr)
	if err != nil {
		return fmt.Errorf("listen --grpc-addr: %w", err)
	}
	adminLis, err := lc.Listen(ctx, "tcp", f.adminAddr)
	if err != nil {
		_ = grpcLis.Close()
		return fmt.Errorf("listen --admin-addr: %w", err)
	}
	if a.Listening != nil {
		a.Listening(Addrs{GRPC: grpcLis.Addr(), Admin: adminLis.Addr()})
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		onChange := func(rs *limit.RuleSet, err error) {
			if err != nil {
				reloads.failed()
				logProblems(log, "rules reload rejected; the previous rules keep serving", err)
				return
			}
			lim.SetRules(rs)
			if err := sh.apply(rs); err != nil {
				log.Error("pressure and breakers reload incomplete", zap.Error(err))
			}
			reloads.reloaded()
			log.Info("rules reloaded", zap.String("path", f.config), zap.Int("domains", len(rs.Domains())))
		}
		if err := config.Watch(watchCtx, f.config, onChange); err != nil {
			// Serving the rules loaded at start beats not serving.
			log.Error("rules will not reload", zap.Error(err))
		}
	}()
	authzDone := make(chan struct{})
	go func() {
		defer close(authzDone)
		az.watch(watchCtx)
	}()
	keysDone := make(chan struct{})
	go func() {
		defer close(keysDone)
		keepKeys(watchCtx, loop.Sealer())
	}()
	defer func() {
		stopWatch()
		<-watchDone
		<-authzDone
		<-keysDone
	}()

	return srv.Serve(ctx, grpcLis, adminLis)
}

func (a *App) versionString() string {
	if a.Version == "" {
		return "dev"
	}
	return a.Version
}

// pingable gives a decorated store its inner store's Ping.
type pingable struct {
	limit.Store
	ping func(context.Context) error
}

// Ping checks the store under the decorator.
func (p pingable) Ping(ctx context.Context) error { return p.ping(ctx) }

// sharedState is where replicas meet besides the counters: the pressure
// board and the breakers' state, on the same store.
type sharedState struct {
	board    limit.Board
	breakers breaker.Store
	replicas peerBeater // nil for the in-memory store
	// The overload controller's shared state (issue 13).
	flights limit.Flights
	meters  limit.Meters
	cells   limit.Cells
}

// openStore returns the in-memory store for an empty URL, else a Redis
// store, with the board and breaker store beside it; close releases them.
func openStore(redisURL string, opts ...redisstore.Option) (store pingStore, shared sharedState, close func(), err error) {
	if redisURL == "" {
		return memstore.New(), sharedState{
			board: memstore.NewBoard(), breakers: memstore.NewBreakers(),
			flights: memstore.NewFlights(), meters: memstore.NewMeters(), cells: memstore.NewCells(),
		}, func() {}, nil
	}
	c, err := redisstore.NewClient(redisURL, opts...)
	if err != nil {
		return nil, sharedState{}, nil, fmt.Errorf("--redis-url: %w", err) // redisstore's errors never hold the password
	}
	s := redisstore.New(c)
	return s, sharedState{
		board: redisstore.NewBoard(c), breakers: s.Breakers(), replicas: redisstore.NewReplicas(c),
		flights: redisstore.NewFlights(c), meters: redisstore.NewMeters(c), cells: redisstore.NewCells(c),
	}, func() { _ = s.Close() }, nil
}

// debugJSON serves what view returns as indented JSON.
func debugJSON(view func() any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		b, err := json.MarshalIndent(view(), "", "  ")
		if err != nil {
			httpJSONError(w, http.StatusInternalServerError, "cannot render")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	})
}

func storeKind(redisURL string) string {
	if redisURL == "" {
		return "memory"
	}
	return "redis"
}

func registerProcessMetrics(reg prometheus.Registerer, version string) error {
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "tollgate_build_info",
		Help:        "Always 1; the version label says what runs.",
		ConstLabels: prometheus.Labels{"version": version},
	})
	build.Set(1)
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build,
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register process metrics: %w", err)
		}
	}
	return nil
}

// reloadMetrics count rule reloads.
type reloadMetrics struct {
	reloads     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) (*reloadMetrics, error) {
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_config_reloads_total",
			Help: "Rule reloads after a change on disk, by result (success, failure: the previous rules kept serving).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_config_last_reload_success_timestamp_seconds",
			Help: "Unix time the rules in force were loaded, at start or by a reload.",
		}),
	}
	// Both series exist from the start, so rate() and alerts see a zero.
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	for _, c := range []prometheus.Collector{m.reloads, m.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register reload metrics: %w", err)
		}
	}
	return m, nil
}

// loaded records the load at start: not a reload, but the rules' time.
func (m *reloadMetrics) loaded() {
	m.lastSuccess.SetToCurrentTime()
}

func (m *reloadMetrics) reloaded() {
	m.reloads.WithLabelValues("success").Inc()
	m.lastSuccess.SetToCurrentTime()
}

func (m *reloadMetrics) failed() {
	m.reloads.WithLabelValues("failure").Inc()
}
