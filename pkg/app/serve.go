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
	"golang.org/x/sync/errgroup"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
	"github.com/tollgate-dev/tollgate/pkg/rls"
	"github.com/tollgate-dev/tollgate/pkg/server"
	"github.com/tollgate-dev/tollgate/pkg/store/lease"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/overlimit"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
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
	queue     queueFlags
	// strict refuses warnings as errors, at start and on reloads.
	strict bool
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
	fs.BoolVar(&f.strict, "strict", false, "refuse warnings (what tollgate validate warns of) as errors: at start, and on a reload of the rules or the authz config, which keeps the files in force")
	f.pressure.register(fs)
	f.debug.register(fs)
	f.lease.register(fs)
	f.failure.register(fs)
	f.protect.register(fs)
	f.tickets.register(fs)
	f.metrics.register(fs)
	f.queue.register(fs)
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
	defer routeRedisLog(log)()
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
// /debug/pprof/cmdline shows redacted. Each step builds on the one
// before; what they start is stopped in reverse by the defers, after the
// server has drained and the watchers have ended.
func (a *App) runServe(ctx context.Context, f *serveFlags, args []string, log *zap.Logger) error {
	log.Info("starting", zap.String("version", a.versionString()))
	rules, err := config.Load(f.config)
	if err != nil {
		logProblems(log, "rules", err)
		return fmt.Errorf("load rules %q: the rules above must be fixed", f.config)
	}
	log.Info("rules loaded", zap.String("path", f.config), zap.Int("domains", len(rules.Domains())))
	logRuleWarnings(log, rules)
	if err := strictly(f.strict, allWarnings(rules)); err != nil {
		logProblems(log, "rules", err)
		return fmt.Errorf("load rules %q: the warnings above are refused under --strict", f.config)
	}
	f.authz.strict = f.strict
	st, err := a.openStores(ctx, f, log)
	if err != nil {
		return err
	}
	defer st.close()
	reg, m, err := a.newServeMetrics(st)
	if err != nil {
		return err
	}
	sh, err := pressureruntime.New(ctx, f.pressure.config(), st.shared.pressure(), log.Named("pressure"))
	if err != nil {
		return err
	}
	defer sh.Stop()
	if err := reg.Register(sh.Collector()); err != nil {
		return fmt.Errorf("register pressure metrics: %w", err)
	}
	apis, err := newServeAPIs(f, st, sh, m, reg, rules, log)
	if err != nil {
		return err
	}
	if err := sh.Apply(rules); err != nil {
		return fmt.Errorf("pressure and breakers: %w", err)
	}
	srv, err := a.newServer(f, args, st, sh, apis, reg, log)
	if err != nil {
		return err
	}
	grpcLis, adminLis, err := a.listen(ctx, f)
	if err != nil {
		return err
	}
	return serveAll(ctx, srv, grpcLis, adminLis,
		func(ctx context.Context) {
			watchRules(ctx, f.config, apis.lim, sh, m.reloads, func(rs *limit.RuleSet) error {
				if err := apis.az.rulesProblems(rs); err != nil {
					return err
				}
				return strictly(f.strict, allWarnings(rs))
			}, log)
		},
		apis.az.watch,
		func(ctx context.Context) { st.keepKeys(ctx, apis.loop.Sealer()) },
	)
}

// serveStores are the store, its decorators and what watches its
// health; close undoes openStores in reverse.
type serveStores struct {
	store  pingStore // what decisions use: raw under its decorators
	raw    pingStore // the store itself, which warm-up pings
	shared sharedState
	health *storeHealth
	guard  *storeguard.Guard // nil for the in-memory store
	local  *overlimit.Store  // nil for the in-memory store
	leases *lease.Store      // nil for the in-memory store or without leases

	ticketKeys *ticket.Keys
	keepKeys   func(context.Context, *ticket.Sealer)

	closers []func()
}

func (s *serveStores) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// openStores opens the store named by --redis-url, the ticket keys on
// it, its health watch, and on Redis its decorators.
func (a *App) openStores(ctx context.Context, f *serveFlags, log *zap.Logger) (_ *serveStores, err error) {
	// The client learns first that Redis is back (its probe, every
	// redisstore.RedialInterval); the store circuit, made below, then
	// probes at once instead of at the end of its backoff (issue 13).
	var recovered recoveries
	// contextcheck follows New to the batch workers, whose pipelines take
	// their first caller's context without its cancel (once a batch, in
	// send): a pipeline never ends with one decision (redisstore.batcher).
	//nolint:contextcheck // see above
	store, shared, closeStore, err := openStore(f.redisURL, f.redis.storeOptions(), append(f.redis.options(), redisstore.WithRecovered(recovered.retry))...)
	if err != nil {
		return nil, err
	}
	st := &serveStores{shared: shared, closers: []func(){closeStore}}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	st.ticketKeys, st.keepKeys, err = f.tickets.ticketKeys(ctx, store, log.Named("tickets"))
	if err != nil {
		return nil, fmt.Errorf("--ticket-key-file: %w", err)
	}
	raw, health := store, newStoreHealth(log.Named("store"), f.failure, shared.replicas, f.pressure.replica())
	st.closers = append(st.closers, health.start(ctx))
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
		st.closers = append(st.closers, stopLeases)
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
	st.store, st.raw, st.health, st.guard, st.local, st.leases = store, raw, health, guard, local, leases
	return st, nil
}

// serveMetrics are the metrics serve itself keeps.
type serveMetrics struct {
	failures *failureMetrics
	reloads  *reloadMetrics
}

// newServeMetrics makes the registry every component registers on, with
// the process's and the stores' metrics.
func (a *App) newServeMetrics(st *serveStores) (*prometheus.Registry, *serveMetrics, error) {
	reg := prometheus.NewRegistry()
	if err := registerProcessMetrics(reg, a.versionString()); err != nil {
		return nil, nil, err
	}
	if local := st.local; local != nil {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tollgate_store_local_denials_total",
			Help: "Decisions denied without a store call because every key they charge was known to be over its limit.",
		}, func() float64 { return float64(local.LocalDenials()) })); err != nil {
			return nil, nil, err
		}
	}
	if st.leases != nil {
		if err := registerLeaseMetrics(reg, st.leases); err != nil {
			return nil, nil, err
		}
	}
	failures, err := newFailureMetrics(reg, st.guard, st.health)
	if err != nil {
		return nil, nil, err
	}
	reloads, err := newReloadMetrics(reg)
	if err != nil {
		return nil, nil, err
	}
	reloads.loaded()
	return reg, &serveMetrics{failures: failures, reloads: reloads}, nil
}

// serveAPIs are the Limiter and the APIs over it.
type serveAPIs struct {
	lim  *admission.Limiter
	loop *outcome.Loop
	rls  *rls.Service
	az   *authz
}

// newServeAPIs builds the Limiter over the store and the pressure
// runtime, the outcome loop, and the APIs Envoy calls.
func newServeAPIs(f *serveFlags, st *serveStores, sh *pressureruntime.Runtime, m *serveMetrics, reg prometheus.Registerer, rules *limit.RuleSet, log *zap.Logger) (*serveAPIs, error) {
	qm, err := newQueueMetrics(reg)
	if err != nil {
		return nil, err
	}
	queue := admission.NewQueue(qm)
	lim := admission.NewLimiter(st.store, limit.SystemClock{}, rules, append(sh.LimiterOptions(), f.failure.option(m.failures, f.redisURL != "", st.health.replicas.get), admission.WithQueue(queue))...)
	loop, err := outcome.New(st.ticketKeys, lim, log.Named("outcome"), reg, outcome.Options{Completed: func(t *ticket.Ticket) { sh.Completed(t.Request()) }})
	if err != nil {
		return nil, err
	}
	rm, err := newRetryMetrics(reg)
	if err != nil {
		return nil, err
	}
	rlsSvc, err := rls.New(rm.observe(f.queue.apply(lim, retryAdapterRLS), retryAdapterRLS), log.Named("rls"), reg, f.metrics.rlsOptions()...)
	if err != nil {
		return nil, err
	}
	rlsSvc.SetSealer(loop.Sealer())
	az, err := newAuthz(f.authz, rm.observe(f.queue.apply(lim, retryAdapterExtAuthz), retryAdapterExtAuthz), loop, log, reg)
	if err != nil {
		return nil, err
	}
	observeOutcomes(sh, az.als, log.Named("pressure"))
	return &serveAPIs{lim: lim, loop: loop, rls: rlsSvc, az: az}, nil
}

// newServer builds the gRPC and admin server over the APIs.
func (a *App) newServer(f *serveFlags, args []string, st *serveStores, sh *pressureruntime.Runtime, apis *serveAPIs, reg *prometheus.Registry, log *zap.Logger) (*server.Server, error) {
	lim, az := apis.lim, apis.az
	admin := map[string]http.Handler{}
	var debugConfig func() any
	if f.debug.debug {
		admin["GET /debug/pressure"] = debugJSON(func() any { return sh.View() })
		debugConfig = func() any {
			return newConfigView(a.versionString(), f.config, f.redisURL, lim.Rules())
		}
	}
	if f.pressure.tokenFile != "" {
		admin["/v1/pressure"] = sh.Handler()
	}
	storeReady := &storeReadiness{policy: f.failure.parsed, guard: st.guard, ping: st.store.Ping, health: st.health}
	return server.New(server.Config{
		Services: append([]server.Service{apis.rls}, az.services()...),
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
		Warm:                 storeReady.warmUp(st.raw),
		ReadyDetail:          func() string { return joinLines(st.health.detail(), az.detail()) },
		DebugConfig:          debugConfig,
		Admin:                admin,
		UnaryInterceptors:    inFlightInterceptors(sh.InFlight()),
		Pprof:                f.debug.pprof,
		Cmdline:              append([]string{"tollgate", "serve"}, redactArgs(args)...),
		DebugToken:           f.debug.token,
		Registerer:           reg,
		Overloaded:           overloadAnswer(f.failure.parsed),
		MaxInFlight:          f.protect.inFlight(),
		MaxConnections:       f.protect.connections(),
		MaxConcurrentStreams: f.protect.streams(),
	})
}

// listen binds --grpc-addr and --admin-addr and tells a.Listening.
func (a *App) listen(ctx context.Context, f *serveFlags) (grpcLis, adminLis net.Listener, err error) {
	var lc net.ListenConfig
	grpcLis, err = lc.Listen(ctx, "tcp", f.grpcAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen --grpc-addr: %w", err)
	}
	adminLis, err = lc.Listen(ctx, "tcp", f.adminAddr)
	if err != nil {
		_ = grpcLis.Close()
		return nil, nil, fmt.Errorf("listen --admin-addr: %w", err)
	}
	if a.Listening != nil {
		a.Listening(Addrs{GRPC: grpcLis.Addr(), Admin: adminLis.Addr()})
	}
	return grpcLis, adminLis, nil
}

// serveAll runs the server and the watchers (rules, API keys and
// ext_authz settings, ticket keys) as one errgroup: the first error
// cancels the rest. When ctx ends the watchers stop and the server
// drains; when the server returns, for any reason, the watchers stop
// too, and serveAll returns once all have.
func serveAll(ctx context.Context, srv *server.Server, grpcLis, adminLis net.Listener, watchers ...func(context.Context)) error {
	g, gctx := errgroup.WithContext(ctx)
	// The watchers also end when the server returns: a nil return
	// cancels no errgroup context, and they must not outlive it.
	watchCtx, stopWatch := context.WithCancel(gctx)
	defer stopWatch()
	g.Go(func() error {
		defer stopWatch()
		return srv.Serve(gctx, grpcLis, adminLis)
	})
	for _, w := range watchers {
		g.Go(func() error {
			w(watchCtx)
			return nil
		})
	}
	return g.Wait()
}

// watchRules applies each change of the rules at path until ctx ends.
// A reload that the authz settings in force disagree with (gate) is
// rejected like rules that do not load.
func watchRules(ctx context.Context, path string, lim *admission.Limiter, sh *pressureruntime.Runtime, reloads *reloadMetrics, gate func(*limit.RuleSet) error, log *zap.Logger) {
	// config.Watch loads the rules once as it starts, so that a change
	// since runServe's load is not missed. That load belongs to the start:
	// it is applied but neither logged nor counted as a reload (a change
	// in the moment between the two loads goes unannounced).
	started := false
	onChange := func(rs *limit.RuleSet, err error) {
		atStart := !started
		started = true
		if err == nil {
			err = gate(rs)
		}
		if err != nil {
			reloads.failed()
			logProblems(log, "rules reload rejected; the previous rules keep serving", err)
			return
		}
		lim.SetRules(rs)
		if err := sh.Apply(rs); err != nil {
			log.Error("pressure and breakers reload incomplete", zap.Error(err))
		}
		if atStart {
			log.Info("watching rules", zap.String("path", path))
			return
		}
		reloads.reloaded()
		log.Info("rules reloaded", zap.String("path", path), zap.Int("domains", len(rs.Domains())))
		logRuleWarnings(log, rs)
	}
	if err := config.Watch(ctx, path, onChange); err != nil {
		// Serving the rules loaded at start beats not serving.
		log.Error("rules will not reload", zap.Error(err))
	}
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

// pressure is the part of s the pressure runtime uses.
func (s sharedState) pressure() pressureruntime.Shared {
	return pressureruntime.Shared{Board: s.board, Cells: s.cells, Breakers: s.breakers, Flights: s.flights, Meters: s.meters}
}

// openStore returns the in-memory store for an empty URL, else a Redis
// store, with the board and breaker store beside it; close releases them.
// storeOpts are the Redis store's, opts its client's.
func openStore(redisURL string, storeOpts []redisstore.StoreOption, opts ...redisstore.Option) (store pingStore, shared sharedState, close func(), err error) {
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
	s := redisstore.New(c, storeOpts...)
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

func httpJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
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
