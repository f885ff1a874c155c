package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
)

// failureFlags are serve's settings for a store that is slow or down
// (issue 6): how long a decision waits for it, and what answers instead.
type failureFlags struct {
	timeout  time.Duration
	policy   string
	fraction float64
	parsed   limit.StoreFailure
}

func (f *failureFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.timeout, "store-timeout", admission.DefaultStoreTimeout, "bound on each decision's store call; a caller's deadline (Envoy sends its filter timeout) also bounds it, less 3ms for the answer to get back")
	fs.StringVar(&f.policy, "store-failure", "local", "what decides when the store cannot answer (error, timeout, circuit open), for rules and domains without store_failure: local (this replica's share of each limit, kept in this process), deny, or allow (admit, count nothing)")
	fs.Float64Var(&f.fraction, "store-failure-local-fraction", 0, "for store_failure local: the fraction of each limit one replica may spend alone while the store is down, in (0,1]; 0: automatic, a tenth of each window limit and all of a concurrency cap, split between the replicas that share the store")
}

func (f *failureFlags) check() error {
	p, ok := limit.ParseStoreFailure(f.policy)
	switch {
	case !ok:
		return fmt.Errorf("--store-failure %q is not one of %s", f.policy, limit.StoreFailureNames())
	case f.timeout <= 0:
		return errors.New("--store-timeout must be positive")
	case !(f.fraction >= 0 && f.fraction <= 1):
		return errors.New("--store-failure-local-fraction must be in [0,1] (0: automatic)")
	}
	f.parsed = p
	return nil
}

// option is the Limiter's store failure policy, reporting to obs; the
// automatic local share divides by replicas. The local policy's counters
// live in an in-process store of their own, apart from the counters of an
// in-memory deployment.
func (f *failureFlags) option(obs admission.FailureObserver, remote bool, replicas func() int) admission.Option {
	timeout := f.timeout
	if !remote {
		// The in-memory store answers in microseconds and never fails: a
		// deadline would only cost each decision a timer (3 allocations).
		timeout = 0
	}
	return admission.WithStoreFailure(admission.FailurePolicy{
		Timeout:       timeout,
		Default:       f.parsed,
		LocalFraction: f.fraction,
		Replicas:      replicas,
		Local:         memstore.New(),
		Observer:      obs,
	})
}

// failureMetrics count what the store's failures did; it is the
// Limiter's admission.FailureObserver, and tells health (for logs and /readyz).
type failureMetrics struct {
	errors   prometheus.Counter
	degraded *prometheus.CounterVec
	dropped  prometheus.Counter
	health   *storeHealth
}

var _ admission.FailureObserver = (*failureMetrics)(nil)

// newFailureMetrics registers the store failure metrics on reg, and the
// circuit's and the replica count's when guard is set (Redis).
func newFailureMetrics(reg prometheus.Registerer, guard *storeguard.Guard, health *storeHealth) (*failureMetrics, error) {
	m := &failureMetrics{health: health,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_store_errors_total",
			Help: "Store calls of decisions and reconciliations that failed, timed out or met an open circuit; a caller that gave up is not counted.",
		}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_store_degraded_decisions_total",
			Help: "Decisions the store could not answer, answered by store_failure, by domain and the policy that chose the code (deny over local over allow).",
		}, []string{"domain", "policy"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_store_degraded_dropped_charges_total",
			Help: "Charges of degraded decisions recorded nowhere: refunds, and cost reports of allow and deny rules.",
		}),
	}
	cs := []prometheus.Collector{m.errors, m.degraded, m.dropped}
	if guard != nil {
		cs = append(cs,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tollgate_store_circuit_state",
				Help: "The circuit in front of the store: 0 closed, 1 half-open (one probe call), 2 open (calls fail at once).",
			}, func() float64 { return float64(guard.State()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "tollgate_store_circuit_refused_total",
				Help: "Store calls refused at once because the circuit was open.",
			}, func() float64 { return float64(guard.Refused()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tollgate_store_replicas",
				Help: "Replicas sharing the store, this one included, as the heartbeats in it count them: the automatic local share of a limit is split between them.",
			}, func() float64 { return float64(health.replicas.get()) }),
		)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register store failure metrics: %w", err)
		}
	}
	return m, nil
}

// StoreFailed counts a failed store call.
func (m *failureMetrics) StoreFailed(string) { m.errors.Inc() }

// Degraded counts a decision answered by policy p. The domain is one the
// rules name (only those reach the store), so the label stays bounded.
func (m *failureMetrics) Degraded(domain string, p limit.StoreFailure, dropped int) {
	m.degraded.WithLabelValues(domain, p.String()).Inc()
	if dropped > 0 {
		m.dropped.Add(float64(dropped))
	}
	m.health.degradedDecision(p)
}

// storeReadiness is the store's part of /readyz.
//
// Until the store has answered once, a replica is unready: a store that
// never answered is most likely misconfigured (a wrong password or CA),
// and the ping's error says how.
//
// After that, a replica is unready only when its store is known to be
// down and the default policy is deny: then every decision of rules
// without their own store_failure is refused, and Kubernetes should send
// traffic to a replica that can still reach the store, if there is one.
// Under allow or local a replica whose store went down still answers
// every decision within its deadline, as the operator chose; taking it
// out of the Service would take out every replica at once (they share
// the store) and hand the traffic to Envoy's failure_mode instead. Known
// to be down: the circuit is open, or (with no decision yet to open it) a
// ping fails.
type storeReadiness struct {
	policy  limit.StoreFailure
	guard   *storeguard.Guard // nil for the in-memory store
	ping    func(context.Context) error
	health  *storeHealth
	reached atomic.Bool
}

// warmer is a store that can ready itself for its first decisions.
type warmer interface {
	Warm(ctx context.Context) error
}

// warmUp is server.Config.Warm for store: the store's own warm-up (Redis:
// open connections, load the function library), then a first heartbeat,
// so the replica count is known before the first decision; then it waits
// beatSettle, so that the replicas already running have read the new
// count too before this one takes traffic. Without the wait, a replica
// started just before would keep a share too large for a beat interval,
// and the replicas' local shares could add up to more than the
// overshoot the share promises.
func (r *storeReadiness) warmUp(store any) func(context.Context) error {
	w, ok := store.(warmer)
	if !ok {
		return nil
	}
	return func(ctx context.Context) error {
		if err := w.Warm(ctx); err != nil {
			return err
		}
		if err := r.health.beat(ctx); err != nil {
			return err
		}
		t := time.NewTimer(beatSettle)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		r.reached.Store(true)
		return nil
	}
}

func (r *storeReadiness) ready(ctx context.Context) error {
	if !r.reached.Load() {
		if err := r.ping(ctx); err != nil {
			return fmt.Errorf("store ping: %w", err)
		}
		r.reached.Store(true)
	}
	if r.policy != limit.FailureDeny {
		return nil
	}
	if r.guard != nil && r.guard.State() == storeguard.Open {
		return errors.New("store circuit open and --store-failure is deny")
	}
	if err := r.ping(ctx); err != nil {
		return fmt.Errorf("store ping (--store-failure is deny): %w", err)
	}
	return nil
}
