// Package runtime runs the pressure half of the decision: the Gate and
// the breaker Set the Limiter consults, the overload controller, this
// replica's signals, one Combiner per domain with shedding, the push
// endpoint, the debug view and the metrics, and what keeps them current
// across rule reloads.
//
// It lives beside pkg/pressure, not in it, because it needs zap and
// Prometheus and the breakers, which the pressure algorithms (standard
// library and pkg/limit only) must not. It imports no adapter and no
// gRPC: the caller turns its in-flight counter into an interceptor and
// feeds it the access log's outcomes.
package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/pressure"
)

// Config is what the runtime is built from; serve fills it from its
// --pressure-* flags, which check the values.
type Config struct {
	// Replica is this replica's name on the pressure board (Required).
	Replica string
	// Interval is how often each Combiner publishes and reads (Required).
	Interval time.Duration
	// TTL is how long a published score counts (Required).
	TTL time.Duration
	// Combine is how replicas' scores combine.
	Combine pressure.Combine
	// Capacity is the in-flight decisions this replica handles
	// comfortably (Optional; 0: no in-flight signal).
	Capacity int
	// TokenFile holds the bearer token of /v1/pressure (Optional; empty:
	// Handler answers 404 for every domain).
	TokenFile string
	// LatencySLA is the upstream p95 latency promised (Optional; 0: no
	// latency signal).
	LatencySLA time.Duration
	// Errors turns on the error-rate and overload signals without a
	// LatencySLA (a LatencySLA turns them on too).
	Errors bool
	// MaxErrorRate, MaxOverloadRate and Window shape the outcome
	// signals (Required with LatencySLA or Errors).
	MaxErrorRate    float64
	MaxOverloadRate float64
	Window          time.Duration
	// PromURL and PromQuery poll Prometheus for a global signal every
	// PromInterval (Optional; empty: off).
	PromURL      string
	PromQuery    string
	PromInterval time.Duration
}

// outcomeSignals says whether the access log feeds pressure.
func (c Config) outcomeSignals() bool { return c.LatencySLA > 0 || c.Errors }

// Shared is where replicas meet besides the counters, on one store.
type Shared struct {
	Board    limit.Board
	Cells    limit.Cells // the steps' shared step and hold
	Breakers breaker.Store
	// The overload controller's shared state.
	Flights limit.Flights
	Meters  limit.Meters
}

// Runtime is the pressure and breaker half of the decision: the Gate and
// the breaker Set the Limiter consults, and what keeps them current.
//
// Pressure is per scope ("global", or a model), shared by every domain:
// each domain with shedding: gets a Combiner whose scopes publish this
// replica's local score and read the combined one under the scope's name
// on the Board, so domains that share a scope see the same pressure
// through their own policies. A domain with scope: model gets a scope
// per model its rules name with an exact value of the descriptor key
// "model", besides "global" (other models read the global pressure).
type Runtime struct {
	f       Config
	name    string // replica
	combine pressure.Combine
	board   limit.Board
	cells   limit.Cells
	brStore breaker.Store
	clock   limit.Clock
	log     *zap.Logger

	gate     *pressure.Gate
	ctl      *pressure.Controller // the overload controller of domains with shedding.control
	breakers *breaker.Set
	inflight *pressure.InFlight // nil without Capacity
	outcomes *pressure.Outcomes // nil without outcome signals
	prom     *pressure.PromQuery

	base    context.Context // the Combiners run under it
	cancel  context.CancelFunc
	promWG  sync.WaitGroup
	mu      sync.Mutex // serializes Apply and Stop
	stopped bool
	cur     atomic.Pointer[shedState]

	// busy says whether an upstream is at its capacity, for the outcome
	// classes (breaker.BusyFunc); nil: never. The overload controller
	// sets it before the first apply.
	busy breaker.BusyFunc
	// onBreakers are told each Apply's breakers.
	onBreakers []func([]breaker.SetEntry)

	retiredMu      sync.Mutex
	retired        map[[2]breaker.State]uint64 // transitions of Breakers a reload dropped
	retiredClasses map[breakerClass]uint64     // outcome classes of Breakers a reload dropped
	untracked      uint64
}

// breakerClass keys tollgate_breaker_outcomes_total.
type breakerClass struct {
	key   string
	class breaker.Class
}

// shedState is what one rule set made.
type shedState struct {
	domains  []*shedDomain
	breakers []breaker.SetEntry
}

type shedDomain struct {
	name     string
	policy   limit.Shedding
	tiers    []string
	scopes   map[string]*pressure.Evaluator
	combiner *pressure.Combiner
	handler  http.Handler // nil without TokenFile
	stop     context.CancelFunc
	done     chan struct{}
}

// New starts the overload controller and the Prometheus poller under
// ctx; Apply then makes a rule set current, and Stop ends them all.
func New(ctx context.Context, f Config, shared Shared, log *zap.Logger) (*Runtime, error) {
	s := &Runtime{
		f: f, name: f.Replica, combine: f.Combine, board: shared.Board, cells: shared.Cells, brStore: shared.Breakers, clock: limit.SystemClock{},
		log: log, gate: pressure.NewGate(), breakers: breaker.NewSet(),
		retired: map[[2]breaker.State]uint64{}, retiredClasses: map[breakerClass]uint64{},
	}
	ctlLog := log.Named("control")
	var err error
	s.ctl, err = pressure.NewController(pressure.ControllerConfig{
		Flights: shared.Flights, Meters: shared.Meters, Cells: shared.Cells, Replica: s.name, Clock: s.clock,
		OnError: func(op string, err error) {
			// Counted in tollgate_control_store_errors_total; a line per
			// tick would drown the log while the store is down.
			ctlLog.Debug("control store", zap.String("op", op), zap.Error(err))
		},
	})
	if err != nil {
		return nil, err
	}
	s.gate.SetController(s.ctl)
	// A 503/504 while the upstream is at its capacity is overload, not a
	// failure: it must shed, not open the breaker.
	s.busy = s.ctl.Busy
	if f.Capacity > 0 {
		s.inflight = pressure.NewInFlight(f.Capacity)
	}
	if f.outcomeSignals() {
		sla := f.LatencySLA
		if sla == 0 {
			sla = time.Second // unused: only the error rate is read
		}
		if s.outcomes, err = pressure.NewOutcomes(pressure.OutcomeConfig{
			Interval: f.Window, SLA: sla, MaxErrorRate: f.MaxErrorRate, MaxOverloadRate: f.MaxOverloadRate,
		}); err != nil {
			return nil, fmt.Errorf("pressure outcomes: %w", err)
		}
	}
	if f.PromURL != "" {
		s.prom, err = pressure.NewPromQuery(pressure.PromConfig{
			URL: f.PromURL, Query: f.PromQuery, Interval: f.PromInterval, Scope: limit.ScopeGlobal,
			Client: &http.Client{},
			OnError: func(_ string, err error) {
				s.log.Debug("pressure prometheus query", zap.Error(err))
			},
		})
		if err != nil {
			return nil, fmt.Errorf("--pressure-prom-url: %w", err)
		}
	}
	base, cancel := context.WithCancel(ctx)
	s.base, s.cancel = base, cancel
	s.ctl.Start(base)
	if s.prom != nil {
		s.promWG.Go(func() { s.prom.Run(base) })
	}
	return s, nil
}

// LimiterOptions make a Limiter shed by pressure and consult breakers,
// tell the overload controller of the decisions of its domains, and read
// the retry budget's signals here.
func (s *Runtime) LimiterOptions() []admission.Option {
	return []admission.Option{admission.WithShedder(s.gate), admission.WithBreakers(s.breakers), admission.WithAdmissions(s.ctl), admission.WithRetrySource(s)}
}

// Completed ends the flight of a verified ticket's request: the outcome
// loop calls it for each ticket a completion brings (the access log's
// final entry, ext_proc's end of stream; whichever comes first ends it).
func (s *Runtime) Completed(req *limit.Request) { s.ctl.Completed(req) }

// OnBreakers has Apply tell f the breakers of each rule set it makes
// current; call it before the first Apply.
func (s *Runtime) OnBreakers(f func([]breaker.SetEntry)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onBreakers = append(s.onBreakers, f)
}

// InFlight is the in-flight signal the decisions count themselves in;
// nil without Config.Capacity.
func (s *Runtime) InFlight() *pressure.InFlight { return s.inflight }

// Outcomes are the latency, failure and overload signals the access log
// feeds; nil without Config.LatencySLA or Config.Errors.
func (s *Runtime) Outcomes() *pressure.Outcomes { return s.outcomes }

// BusyFunc is Busy as the breakers' classes take it.
func (s *Runtime) BusyFunc() breaker.BusyFunc { return s.busy }

// Busy reports whether domain's upstream had at least its capacity in
// flight at the controller's last count: an overload answer from it then
// is not a failure (the breaker's rule). False for an upstream without a
// controller.
func (s *Runtime) Busy(domain, upstream string) bool { return s.ctl.Busy(domain, upstream) }

// controlDomains are the controller's domains of rs: each domain with
// shedding.control, its plans, and its controlled upstreams: those
// capacity lists, and with default_capacity those its rules name with an
// exact value of the control's key.
func controlDomains(rs *limit.RuleSet) []pressure.ControlDomain {
	var out []pressure.ControlDomain
	for _, d := range rs.Domains() {
		if d.Shedding == nil || d.Shedding.Control == nil {
			continue
		}
		c := d.Shedding.Control
		cd := pressure.ControlDomain{Name: d.Name, Control: *c, Upstreams: map[string]int64{}}
		if d.Tiers != nil {
			for t := range d.Tiers.Plans {
				cd.Tiers = append(cd.Tiers, t)
			}
			slices.Sort(cd.Tiers)
		}
		for name, v := range c.Capacity {
			cd.Upstreams[name] = v
		}
		if c.DefaultCapacity > 0 {
			for _, name := range valuesOf(d.Descriptors, c.KeyName()) {
				if _, ok := cd.Upstreams[name]; !ok {
					cd.Upstreams[name] = c.DefaultCapacity
				}
			}
		}
		out = append(out, cd)
	}
	return out
}

// Apply makes rs's shedding policies and breakers current: Evaluators
// and Breakers whose configuration did not change are kept with their
// state, the Combiners are restarted on the new scopes. The onBreakers
// hooks are told the new breakers (the access log's observer) before
// the Combiners restart, as the rules change in one step.
func (s *Runtime) Apply(rs *limit.RuleSet) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("pressure: stopped")
	}
	old := s.cur.Load()
	next := &shedState{}
	var gate []pressure.GateEntry
	var errs []error
	for _, d := range rs.Domains() {
		for _, c := range d.Breakers {
			b, err := s.breakerFor(old, d.Name, c)
			if err != nil {
				errs = append(errs, fmt.Errorf("domain %q: breaker on %q: %w", d.Name, c.Key, err))
				continue
			}
			next.breakers = append(next.breakers, breaker.SetEntry{Domain: d.Name, Breaker: b})
		}
		if d.Shedding == nil {
			continue
		}
		sd, err := s.domain(old, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("domain %q: shedding: %w", d.Name, err))
			continue
		}
		next.domains = append(next.domains, sd)
		for scope, ev := range sd.scopes {
			gate = append(gate, pressure.GateEntry{Domain: d.Name, Scope: scope, Evaluator: ev})
		}
	}
	if old != nil {
		for _, d := range old.domains {
			d.stop()
			<-d.done
		}
		s.retire(old.breakers, next.breakers)
	}
	if err := s.ctl.Set(controlDomains(rs)...); err != nil {
		errs = append(errs, fmt.Errorf("control: %w", err))
	}
	s.gate.Set(gate...)
	s.breakers.Replace(next.breakers...)
	for _, f := range s.onBreakers {
		f(next.breakers)
	}
	for _, d := range next.domains {
		ctx, stop := context.WithCancel(s.base)
		d.stop, d.done = stop, make(chan struct{})
		go func() {
			defer close(d.done)
			d.combiner.Run(ctx, s.f.Interval)
		}()
	}
	s.cur.Store(next)
	return errors.Join(errs...)
}

// breakerFor returns the Breaker of domain's c: the one in force if its
// configuration is the same (it keeps its snapshot and counts), else a
// new one.
func (s *Runtime) breakerFor(old *shedState, domain string, c limit.BreakerConfig) (*breaker.Breaker, error) {
	full, err := c.WithDefaults()
	if err != nil {
		return nil, err
	}
	if old != nil {
		for _, e := range old.breakers {
			if e.Domain == domain && e.Breaker.Config() == full {
				return e.Breaker, nil
			}
		}
	}
	return breaker.New(c, s.brStore)
}

// retire keeps the counts of the Breakers a reload dropped, so that the
// transition counter never goes down.
func (s *Runtime) retire(old, next []breaker.SetEntry) {
	s.retiredMu.Lock()
	defer s.retiredMu.Unlock()
	for _, e := range old {
		if slices.ContainsFunc(next, func(n breaker.SetEntry) bool { return n.Breaker == e.Breaker }) {
			continue
		}
		for _, t := range e.Breaker.Transitions() {
			s.retired[[2]breaker.State{t.From, t.To}] += t.N
		}
		for _, c := range e.Breaker.Outcomes() {
			s.retiredClasses[breakerClass{e.Breaker.Config().Key, c.Class}] += c.N
		}
		s.untracked += e.Breaker.Untracked()
	}
}

// domain builds d's Combiner, keeping the Evaluators of scopes whose
// policy did not change, so a reload does not reset their steps.
func (s *Runtime) domain(old *shedState, d *limit.Domain) (*shedDomain, error) {
	sd := &shedDomain{name: d.Name, policy: *d.Shedding, scopes: map[string]*pressure.Evaluator{}}
	if d.Tiers != nil {
		for t := range d.Tiers.Plans {
			sd.tiers = append(sd.tiers, t)
		}
		slices.Sort(sd.tiers)
	}
	var prev *shedDomain
	if old != nil {
		for _, o := range old.domains {
			if o.name == d.Name && reflect.DeepEqual(o.policy, sd.policy) {
				prev = o
			}
		}
	}
	names := []string{limit.ScopeGlobal}
	if d.Shedding.Scope == limit.ScopeModel {
		names = append(names, ModelsOf(d.Descriptors)...)
	}
	var scopes []pressure.Scope
	for _, name := range names {
		ev := (*pressure.Evaluator)(nil)
		if prev != nil {
			ev = prev.scopes[name]
		}
		if ev == nil {
			var err error
			if ev, err = pressure.NewEvaluator(d.Shedding, s.clock); err != nil {
				return nil, err
			}
		}
		sd.scopes[name] = ev
		// The controller's load (in-flight over capacity) is not one of
		// the steps' signals: the controller acts on it already, and at
		// its target it reads 1, which would hold every step.
		scopes = append(scopes, pressure.Scope{Name: name, Local: s.local(name), Evaluator: ev})
	}
	c, err := pressure.NewCombiner(pressure.CombinerConfig{
		Board: s.board, Replica: s.name, Combine: s.combine, TTL: s.f.TTL, Clock: s.clock, Scopes: scopes,
		// The replicas share each scope's step and hold, so they shed
		// alike (docs/overload-control.md, "Steps across replicas").
		Cells: s.cells, Domain: d.Name, Interval: s.f.Interval,
		OnError: func(scope string, err error) {
			// Stale readings show in tollgate_pressure_board_stale; one
			// line a tick per scope would drown the log while the store
			// is down.
			s.log.Debug("pressure board", zap.String("domain", d.Name), zap.String("scope", scope), zap.Error(err))
		},
	})
	if err != nil {
		return nil, err
	}
	sd.combiner = c
	if s.f.TokenFile != "" {
		if sd.handler, err = pressure.NewHandler(pressure.HandlerConfig{Combiner: c, TokenFile: s.f.TokenFile, DefaultTTL: time.Minute}); err != nil {
			return nil, err
		}
	}
	return sd, nil
}

// local is this replica's signal for scope. It is never nil, so that
// every replica shows on the board, at 0 when it has no signal.
func (s *Runtime) local(scope string) pressure.Signals {
	sig := pressure.Signals{}
	if scope == limit.ScopeGlobal {
		if s.inflight != nil {
			sig = append(sig, s.inflight)
		}
		if s.prom != nil {
			sig = append(sig, s.prom)
		}
	}
	if s.outcomes != nil {
		w := s.outcomes.Global()
		if scope != limit.ScopeGlobal {
			var err error
			if w, err = s.outcomes.Model(scope); err != nil {
				s.log.Warn("no outcome signals for a model scope", zap.String("scope", scope), zap.Error(err))
				return sig
			}
		}
		if s.f.LatencySLA > 0 {
			sig = append(sig, w.Latency())
		}
		sig = append(sig, w.ErrorRate(), w.OverloadRate())
	}
	return sig
}

// ModelsOf lists the exact values of the rules on limit.ModelKey, at any
// depth: the models a domain names are the ones it gets scopes for.
func ModelsOf(rules []*limit.Rule) []string { return valuesOf(rules, limit.ModelKey) }

// valuesOf lists the exact values of the rules on key, at any depth.
func valuesOf(rules []*limit.Rule, key string) []string {
	var out []string
	var walk func([]*limit.Rule)
	walk = func(rs []*limit.Rule) {
		for _, r := range rs {
			if r.Key == key && r.Value != "" && !r.Wildcard() && r.Value != limit.ScopeGlobal && !slices.Contains(out, r.Value) {
				out = append(out, r.Value)
			}
			walk(r.Children)
		}
	}
	walk(rules)
	slices.Sort(out)
	return out
}

// Stop ends the Combiners, the overload controller and the Prometheus
// poller and waits for them; Apply fails after it.
func (s *Runtime) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.cancel()
	s.ctl.Stop()
	if st := s.cur.Load(); st != nil {
		for _, d := range st.domains {
			<-d.done
		}
	}
	s.promWG.Wait()
}

// Handler serves /v1/pressure over the domains' pressure handlers. A
// push is for a scope, which every domain that has it reads, so a PUT
// goes to the first domain that knows the scope; GET lists every domain.
// Serve it only with a Config.TokenFile: the domains' handlers check it.
func (s *Runtime) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := s.cur.Load()
		if st == nil || len(st.domains) == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"no domain has a shedding policy"}`+"\n")
			return
		}
		target := st.domains[0]
		if r.Method != http.MethodPut {
			// The domain handler answers 401 and 405; a 200 means the
			// caller may read every domain.
			rec := &statusOnly{header: http.Header{}}
			target.handler.ServeHTTP(rec, r)
			if rec.code != http.StatusOK {
				target.handler.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			_ = json.NewEncoder(w).Encode(s.View())
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			httpJSONError(w, http.StatusBadRequest, "body unreadable")
			return
		}
		var peek struct {
			Scope string `json:"scope"`
		}
		_ = json.Unmarshal(body, &peek) // the domain handler reports bad JSON
		for _, d := range st.domains {
			if d.combiner.Evaluator(peek.Scope) != nil {
				target = d
				break
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		target.handler.ServeHTTP(w, r)
	})
}

func httpJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// statusOnly is a ResponseWriter that keeps the status and drops the body.
type statusOnly struct {
	header http.Header
	code   int
}

func (s *statusOnly) Header() http.Header { return s.header }
func (s *statusOnly) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return len(b), nil
}
func (s *statusOnly) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}

// View is /debug/pressure and GET /v1/pressure: the live readings and
// the breakers as this replica last saw them.
type View struct {
	Replica  string              `json:"replica"`
	Combine  string              `json:"combine"`
	Interval string              `json:"interval"`
	TTL      string              `json:"ttl"`
	Domains  []domainPressure    `json:"domains"`
	Breakers []breakerStatesView `json:"breakers"`
	// Control is the overload controller's state per controlled
	// upstream, as this replica holds it.
	Control []pressure.ControlView `json:"control"`
}

type domainPressure struct {
	Domain string               `json:"domain"`
	Scopes []pressure.ScopeView `json:"scopes"`
}

type breakerStatesView struct {
	Domain    string             `json:"domain"`
	Key       string             `json:"key"`
	Tracked   []breakerStateView `json:"tracked"`
	Untracked uint64             `json:"untracked,omitempty"`
}

type breakerStateView struct {
	Name      string     `json:"name"`
	State     string     `json:"state"`
	OpenUntil *time.Time `json:"open_until,omitempty"`
}

// View is the live readings and breakers now.
func (s *Runtime) View() View {
	v := View{
		Replica: s.name, Combine: s.combine.String(), Interval: s.f.Interval.String(), TTL: s.f.TTL.String(),
		Domains: []domainPressure{}, Breakers: []breakerStatesView{}, Control: s.ctl.Snapshot(),
	}
	if v.Control == nil {
		v.Control = []pressure.ControlView{}
	}
	st := s.cur.Load()
	if st == nil {
		return v
	}
	for _, d := range st.domains {
		dp := domainPressure{Domain: d.name, Scopes: []pressure.ScopeView{}}
		for _, sc := range d.combiner.Snapshot() {
			dp.Scopes = append(dp.Scopes, sc.View(d.tiers))
		}
		v.Domains = append(v.Domains, dp)
	}
	now := s.clock.Now()
	for _, e := range st.breakers {
		bv := breakerStatesView{Domain: e.Domain, Key: e.Breaker.Config().Key, Tracked: []breakerStateView{}, Untracked: e.Breaker.Untracked()}
		for _, n := range e.Breaker.Snapshot(now) {
			j := breakerStateView{Name: n.Name, State: n.State.String()}
			if !n.OpenUntil.IsZero() {
				j.OpenUntil = &n.OpenUntil
			}
			bv.Tracked = append(bv.Tracked, j)
		}
		v.Breakers = append(v.Breakers, bv)
	}
	return v
}

// Collector exports the readings and breaker states at scrape time
// (tollgate_pressure_*, tollgate_breaker_*, tollgate_control_*).
func (s *Runtime) Collector() prometheus.Collector { return newPressureCollector(s) }

// pressureCollector exports the readings and breaker states at scrape
// time. Its label values come from the rules (domains, scopes, breaker
// keys) and from the breaker package's bounded tracked set.
type pressureCollector struct {
	s                                         *Runtime
	score, local, level, factor, stale, state *prometheus.Desc
	stepsAlone                                *prometheus.Desc
	transitions, untracked, promErrors        *prometheus.Desc
	classes                                   *prometheus.Desc
	// The overload controller's.
	ctlFraction, ctlInflight, ctlCapacity, ctlChanges, ctlErrors, ctlDropped *prometheus.Desc
}

var _ prometheus.Collector = (*pressureCollector)(nil)

func newPressureCollector(s *Runtime) *pressureCollector {
	ds := []string{"domain", "scope"}
	return &pressureCollector{
		s:           s,
		score:       prometheus.NewDesc("tollgate_pressure_score", "Combined pressure of the scope, in [0,1]: the replicas' published scores combined, or the pushed score if higher.", ds, nil),
		local:       prometheus.NewDesc("tollgate_pressure_local_score", "This replica's own pressure for the scope, in [0,1].", ds, nil),
		level:       prometheus.NewDesc("tollgate_pressure_level", "Index of the domain's active shedding step for the scope, -1 when none is.", ds, nil),
		factor:      prometheus.NewDesc("tollgate_pressure_factor", "What the active shedding steps scale limits by, in (0,1].", ds, nil),
		stale:       prometheus.NewDesc("tollgate_pressure_board_stale", "1 when the last reading could not read the store's board and used the local score alone.", ds, nil),
		stepsAlone:  prometheus.NewDesc("tollgate_pressure_steps_fallbacks_total", "Readings whose shedding step this replica evaluated alone, because the shared step and hold could not be read or written or the board could not be read.", ds, nil),
		state:       prometheus.NewDesc("tollgate_breaker_state", "Circuit breaker state as this replica last saw it: 0 closed, 1 half-open, 2 open.", []string{"domain", "key", "breaker"}, nil),
		transitions: prometheus.NewDesc("tollgate_breaker_transitions_total", "Breaker state changes made by this replica's store calls.", []string{"from", "to"}, nil),
		untracked:   prometheus.NewDesc("tollgate_breaker_untracked_total", "Breaker names left out of tollgate_breaker_state because the tracked set was full.", nil, nil),
		promErrors:  prometheus.NewDesc("tollgate_pressure_prom_errors_total", "Failed queries of --pressure-prom-query.", nil, nil),
		classes:     prometheus.NewDesc("tollgate_breaker_outcomes_total", "Outcomes this replica's breakers classified (docs/outcome-classes.md), by breaker key and class: success, failure, overload (never opens a breaker) or neutral.", []string{"key", "class"}, nil),
		ctlFraction: prometheus.NewDesc("tollgate_control_shed_fraction", "Share of the tier's requests to the upstream the overload controller sheds, in [0,1].", []string{"domain", "scope", "tier"}, nil),
		ctlInflight: prometheus.NewDesc("tollgate_control_inflight", "Requests in flight to the upstream cluster-wide at the controller's last count.", ds, nil),
		ctlCapacity: prometheus.NewDesc("tollgate_control_capacity", "The upstream's configured capacity (shedding.control.capacity).", ds, nil),
		ctlChanges:  prometheus.NewDesc("tollgate_control_changes_total", "Changes of the upstream's shed fractions this replica has seen (every replica sees the cluster's).", ds, nil),
		ctlErrors:   prometheus.NewDesc("tollgate_control_store_errors_total", "Failed calls of the overload controller to the shared store, by operation.", []string{"op"}, nil),
		ctlDropped:  prometheus.NewDesc("tollgate_control_flights_dropped_total", "Flight begins and ends dropped because the queue to the store was full.", nil, nil),
	}
}

func (c *pressureCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.score, c.local, c.level, c.factor, c.stale, c.stepsAlone, c.state, c.transitions, c.untracked, c.promErrors, c.classes,
		c.ctlFraction, c.ctlInflight, c.ctlCapacity, c.ctlChanges, c.ctlErrors, c.ctlDropped} {
		ch <- d
	}
}

func (c *pressureCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	st := c.s.cur.Load()
	c.s.retiredMu.Lock()
	trans := make(map[[2]breaker.State]uint64, len(c.s.retired))
	for k, n := range c.s.retired {
		trans[k] = n
	}
	classes := make(map[breakerClass]uint64, len(c.s.retiredClasses))
	for k, n := range c.s.retiredClasses {
		classes[k] = n
	}
	untracked := c.s.untracked
	c.s.retiredMu.Unlock()
	if st != nil {
		for _, d := range st.domains {
			for _, sc := range d.combiner.Snapshot() {
				stale := 0.0
				if sc.Stale {
					stale = 1
				}
				gauge(c.score, sc.Combined, d.name, sc.Scope)
				gauge(c.local, sc.Local, d.name, sc.Scope)
				gauge(c.level, float64(sc.Outcome.Level), d.name, sc.Scope)
				gauge(c.factor, sc.Outcome.Factor, d.name, sc.Scope)
				gauge(c.stale, stale, d.name, sc.Scope)
				if ev := d.combiner.Evaluator(sc.Scope); ev != nil {
					ch <- prometheus.MustNewConstMetric(c.stepsAlone, prometheus.CounterValue, float64(ev.Fallbacks()), d.name, sc.Scope)
				}
			}
		}
		now := c.s.clock.Now()
		for _, e := range st.breakers {
			key := e.Breaker.Config().Key
			for _, n := range e.Breaker.Snapshot(now) {
				gauge(c.state, float64(n.State), e.Domain, key, n.Name)
			}
			for _, t := range e.Breaker.Transitions() {
				trans[[2]breaker.State{t.From, t.To}] += t.N
			}
			for _, cl := range e.Breaker.Outcomes() {
				classes[breakerClass{key, cl.Class}] += cl.N
			}
			untracked += e.Breaker.Untracked()
		}
	}
	for k, n := range trans {
		ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(n), k[0].String(), k[1].String())
	}
	for k, n := range classes {
		ch <- prometheus.MustNewConstMetric(c.classes, prometheus.CounterValue, float64(n), k.key, k.class.String())
	}
	ch <- prometheus.MustNewConstMetric(c.untracked, prometheus.CounterValue, float64(untracked))
	var promErrs uint64
	if c.s.prom != nil {
		promErrs = c.s.prom.State().Failures
	}
	ch <- prometheus.MustNewConstMetric(c.promErrors, prometheus.CounterValue, float64(promErrs))
	for _, v := range c.s.ctl.Snapshot() {
		for tier, f := range v.Shed {
			gauge(c.ctlFraction, f, v.Domain, v.Scope, tier)
		}
		gauge(c.ctlInflight, float64(v.InFlight), v.Domain, v.Scope)
		gauge(c.ctlCapacity, float64(v.Capacity), v.Domain, v.Scope)
		ch <- prometheus.MustNewConstMetric(c.ctlChanges, prometheus.CounterValue, float64(v.Changes), v.Domain, v.Scope)
	}
	for op, n := range c.s.ctl.StoreErrors() {
		ch <- prometheus.MustNewConstMetric(c.ctlErrors, prometheus.CounterValue, float64(n), op)
	}
	ch <- prometheus.MustNewConstMetric(c.ctlDropped, prometheus.CounterValue, float64(c.s.ctl.Dropped()))
}
