package pressure

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Controller runs the control law (control.go) of every domain with a
// limit.Control, per controlled upstream, over the shared state of
// limit.Flights, limit.Meters and limit.Cells:
//
//   - the decision path (Decided, through admission.WithAdmissions) counts
//     offered and admitted requests in atomics and queues the flight of an
//     admitted one; the completion path (Completed) queues its end. Both
//     are non-blocking: a full queue drops the operation and counts it
//     (a dropped begin is a flight never counted, a dropped end one its
//     lease ends);
//   - a flusher sends the queued operations in batches every FlushEvery;
//   - every Interval, per upstream, a replica adds its counts to the
//     Meters and loads the upstream's Cell: a state computed within the
//     last interval, by any replica, is adopted; otherwise the replica
//     reads the in-flight count and the rates, computes the next state and
//     swaps it in (the loser of a race adopts the winner's), so one
//     replica computes per tick and every replica sheds by the same
//     fractions;
//   - the Gate reads the fractions in force with one atomic load.
//
// A store that fails or is slow never holds a decision: the tick runs
// apart, each call bounded by the interval. The last state stands for
// Control.Grace; past it the Controller sheds nothing for the upstream
// (the steps still run, on local signals) until the store answers again.
type Controller struct {
	cfg   ControllerConfig
	doms  atomic.Pointer[map[string]*ctlDomain]
	queue chan flightOp

	dropped atomic.Uint64
	errs    [nStoreOps]atomic.Uint64

	// retry holds the ends a failed store call did not deliver, sent
	// again with the next flush (only the flusher touches it): a flight
	// whose end is lost while the store is down would otherwise count as
	// in flight until its lease, and a store that kept its data (Redis
	// with an append-only file) comes back with every such flight still
	// counted, which the law reads as load and sheds for.
	retry       []retryEnds
	retryCount  int
	resendAfter time.Time // no resend before: the last one failed

	mu      sync.Mutex // Set, Start, Stop
	base    context.Context
	cancel  context.CancelFunc
	flushWG sync.WaitGroup
	stopped bool
}

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// Flights, Meters and Cells hold the shared state (Required).
	Flights limit.Flights
	Meters  limit.Meters
	Cells   limit.Cells
	// Replica names this replica in the states it writes (Optional).
	Replica string
	// Clock (Optional; default limit.SystemClock).
	Clock limit.Clock
	// QueueSize bounds the flight operations waiting for a flush
	// (Optional; default 65536).
	QueueSize int
	// FlushEvery is how often queued flight operations are sent
	// (Optional; default 5ms).
	FlushEvery time.Duration
	// OnError is told of each failed store call (Optional); they are
	// counted in StoreErrors either way.
	OnError func(op string, err error)
}

// Store operations, the label of StoreErrors.
const (
	OpBegin = "begin"
	OpEnd   = "end"
	OpCount = "count"
	OpAdd   = "add"
	OpSum   = "sum"
	OpLoad  = "load"
	OpSwap  = "swap"
)

var storeOps = [...]string{OpBegin, OpEnd, OpCount, OpAdd, OpSum, OpLoad, OpSwap}

const nStoreOps = len(storeOps)

// ControlDomain is one domain's controller: its Control, the tiers its
// plans name, and the upstreams it controls with their capacities.
type ControlDomain struct {
	Name    string
	Control limit.Control
	// Tiers are the domain's plans; offered and admitted are counted per
	// tier, and a tier not listed counts as "".
	Tiers []string
	// Upstreams maps each controlled upstream to its capacity (at least
	// 1); a request naming another upstream is not controlled.
	Upstreams map[string]int64
}

type ctlDomain struct {
	name   string
	cfg    limit.Control // with defaults
	scopes map[string]*ctlScope
	stop   context.CancelFunc
	done   chan struct{}
}

type ctlScope struct {
	domain, name string
	law          law
	tiers        []string // count slots; the last is "" (other)
	offered      []atomic.Int64
	admitted     []atomic.Int64

	state atomic.Pointer[ControlState] // in force; fractions zero when stale
	stale atomic.Bool                  // past Grace without the store
	seen  atomic.Uint64                // Changes of the last state adopted
	count atomic.Uint64                // changes this replica has seen

	// The tick goroutine's own.
	pending  []pendingCounts // counts Adds failed to send, oldest first
	lastGood time.Time
	local    ControlState // the last state computed or adopted

	flightKey, meterKey, cellKey string
}

// pendingCounts are one tick's counts an Add failed to send.
type pendingCounts struct {
	at     time.Time
	counts map[string]int64
}

type flightOp struct {
	scope *ctlScope
	id    string
	end   bool
}

// NewController checks cfg and returns a Controller with no domains.
func NewController(cfg ControllerConfig) (*Controller, error) {
	if cfg.Flights == nil || cfg.Meters == nil || cfg.Cells == nil {
		return nil, errors.New("controller: Flights, Meters and Cells are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = limit.SystemClock{}
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1 << 16
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = 5 * time.Millisecond
	}
	c := &Controller{cfg: cfg, queue: make(chan flightOp, cfg.QueueSize)}
	m := map[string]*ctlDomain{}
	c.doms.Store(&m)
	return c, nil
}

// Start runs the flusher until ctx ends or Stop; the domains Set before
// or after start ticking with it.
func (c *Controller) Start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.base != nil || c.stopped {
		return
	}
	c.base, c.cancel = context.WithCancel(ctx)
	c.flushWG.Go(func() { c.flushLoop(c.base) })
	for _, d := range *c.doms.Load() {
		c.startDomain(d)
	}
}

// Stop ends the ticks and the flusher (which sends what is queued first,
// bounded by a second) and waits for them.
func (c *Controller) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.cancel == nil {
		return
	}
	c.cancel()
	for _, d := range *c.doms.Load() {
		<-d.done
	}
	c.flushWG.Wait()
}

// Set replaces the domains (a rules reload). An upstream whose domain's
// Control, tiers and capacity are unchanged keeps its counts and state.
func (c *Controller) Set(domains ...ControlDomain) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.doms.Load()
	next := map[string]*ctlDomain{}
	var errs []error
	for _, cd := range domains {
		d, err := c.domain(old[cd.Name], cd)
		if err != nil {
			errs = append(errs, fmt.Errorf("domain %q: %w", cd.Name, err))
			continue
		}
		next[d.name] = d
	}
	for _, d := range old {
		if d.stop != nil {
			d.stop()
			<-d.done
		}
	}
	c.doms.Store(&next)
	if c.base != nil && !c.stopped {
		for _, d := range next {
			c.startDomain(d)
		}
	}
	return errors.Join(errs...)
}

func (c *Controller) domain(prev *ctlDomain, cd ControlDomain) (*ctlDomain, error) {
	ctl := cd.Control.WithDefaults()
	d := &ctlDomain{name: cd.Name, cfg: ctl, scopes: map[string]*ctlScope{}}
	tiers := append(slices.Clone(cd.Tiers), ctl.Sheddable...)
	slices.Sort(tiers)
	tiers = append(slices.Compact(tiers), "")
	for name, capacity := range cd.Upstreams {
		w, err := newLaw(ctl, capacity)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: %w", name, err)
		}
		if prev != nil {
			if p := prev.scopes[name]; p != nil && p.law.capacity == w.capacity && reflect.DeepEqual(p.law.cfg, w.cfg) && slices.Equal(p.tiers, tiers) {
				d.scopes[name] = p
				continue
			}
		}
		sc := &ctlScope{
			domain: cd.Name, name: name, law: w, tiers: tiers,
			offered: make([]atomic.Int64, len(tiers)), admitted: make([]atomic.Int64, len(tiers)),
			flightKey: cd.Name + "|" + name, meterKey: "ctl|" + cd.Name + "|" + name, cellKey: "ctl|" + cd.Name + "|" + name,
		}
		sc.local = ControlState{Fractions: make([]float64, len(ctl.Sheddable))}
		st := sc.local
		sc.state.Store(&st)
		d.scopes[name] = sc
	}
	return d, nil
}

// startDomain ticks d until Stop or the next Set; c.mu is held.
func (c *Controller) startDomain(d *ctlDomain) {
	ctx, stop := context.WithCancel(c.base)
	d.stop, d.done = stop, make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.NewTicker(d.cfg.Interval)
		defer t.Stop()
		for {
			c.tickDomain(ctx, d)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Decided implements admission.Admissions.
func (c *Controller) Decided(domain, upstream, tier string, admitted bool, id string) string {
	sc := c.scope(domain, upstream)
	if sc == nil {
		return ""
	}
	i := sc.slot(tier)
	sc.offered[i].Add(1)
	if !admitted {
		return ""
	}
	sc.admitted[i].Add(1)
	if id == "" {
		id = newFlightID()
	} else if len(id) > limit.MaxValueBytes {
		return "" // not a flight a store should hold; Check bounds IDs before
	}
	c.enqueue(flightOp{scope: sc, id: id})
	return id
}

// Completed ends the flight of req (a verified ticket's request): its
// domain's controlled upstream, under its ID. Anything else is ignored.
func (c *Controller) Completed(req *limit.Request) {
	if req == nil || req.ID == "" || len(req.ID) > limit.MaxValueBytes {
		return
	}
	d := (*c.doms.Load())[req.Domain]
	if d == nil {
		return
	}
	sc := d.scopes[req.Value(d.cfg.KeyName())]
	if sc == nil {
		return
	}
	c.enqueue(flightOp{scope: sc, id: req.ID, end: true})
}

func (c *Controller) enqueue(op flightOp) {
	select {
	case c.queue <- op:
	default:
		c.dropped.Add(1)
	}
}

// slot is tier's count slot; the last one holds tiers not listed.
func (sc *ctlScope) slot(tier string) int {
	if i, ok := slices.BinarySearch(sc.tiers[:len(sc.tiers)-1], tier); ok {
		return i
	}
	return len(sc.tiers) - 1
}

func newFlightID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Meter names: offered and admitted per tier.
const (
	meterOffered  = "o:"
	meterAdmitted = "a:"
)

func (c *Controller) flushLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			c.Flush(fctx)
			cancel()
			return
		case <-t.C:
			c.Flush(ctx)
		}
	}
}

// Flush sends the queued flight operations now, in one Begin and one End
// per upstream. The flusher calls it; tests call it to be deterministic.
func (c *Controller) Flush(ctx context.Context) {
	type batch struct{ begin, end []string }
	var batches map[*ctlScope]*batch
	for {
		var op flightOp
		select {
		case op = <-c.queue:
		default:
			op.scope = nil
		}
		if op.scope == nil {
			break
		}
		if batches == nil {
			batches = map[*ctlScope]*batch{}
		}
		b := batches[op.scope]
		if b == nil {
			b = &batch{}
			batches[op.scope] = b
		}
		if op.end {
			// A flight that begins and ends within one batch is never
			// sent: ending it before its begin reached the store would
			// leave it to its lease.
			if i := slices.Index(b.begin, op.id); i >= 0 {
				b.begin = slices.Delete(b.begin, i, i+1)
				continue
			}
			b.end = append(b.end, op.id)
		} else {
			b.begin = append(b.begin, op.id)
		}
	}
	now := c.cfg.Clock.Now()
	failed := false
	for sc, b := range batches {
		if len(b.begin) > 0 {
			if _, err := c.cfg.Flights.Begin(ctx, now, sc.flightKey, b.begin, sc.law.cfg.Lease); err != nil {
				c.fail(OpBegin, err)
				failed = true
			}
		}
		if len(b.end) > 0 {
			if _, err := c.cfg.Flights.End(ctx, now, sc.flightKey, b.end); err != nil {
				c.fail(OpEnd, err)
				c.keepEnds(sc, b.end, now)
				failed = true
			}
		}
	}
	if !failed {
		c.resendEnds(ctx, now)
	}
}

// retryEnds are ends of one upstream that a failed call did not deliver.
type retryEnds struct {
	scope *ctlScope
	ids   []string
	at    time.Time
}

// maxRetryEnds bounds the ends kept for a store that is down (about 2 MB
// of IDs); past it the oldest go, left to their leases.
const maxRetryEnds = 1 << 15

// resendBackoff spaces the resends of kept ends while the store fails.
const resendBackoff = 100 * time.Millisecond

// keepEnds keeps ids to send again.
func (c *Controller) keepEnds(sc *ctlScope, ids []string, now time.Time) {
	c.retry = append(c.retry, retryEnds{scope: sc, ids: ids, at: now})
	c.retryCount += len(ids)
	for c.retryCount > maxRetryEnds && len(c.retry) > 0 {
		c.retryCount -= len(c.retry[0].ids)
		c.dropped.Add(uint64(len(c.retry[0].ids)))
		c.retry = c.retry[1:]
	}
}

// resendEnds sends the kept ends again, oldest first, each group until
// the store takes it, and drops groups older than their upstream's lease
// (those flights have ended by it). It stops at the first failure: the
// store is still down, and one call a flush is enough to find out (Flush
// calls it only when its own calls went through).
func (c *Controller) resendEnds(ctx context.Context, now time.Time) {
	if now.Before(c.resendAfter) {
		return
	}
	for len(c.retry) > 0 {
		r := c.retry[0]
		if now.Sub(r.at) >= r.scope.law.cfg.Lease {
			c.retryCount -= len(r.ids)
			c.retry = c.retry[1:]
			continue
		}
		if _, err := c.cfg.Flights.End(ctx, now, r.scope.flightKey, r.ids); err != nil {
			c.fail(OpEnd, err)
			c.resendAfter = now.Add(resendBackoff)
			return
		}
		c.retryCount -= len(r.ids)
		c.retry = c.retry[1:]
	}
}

func (c *Controller) fail(op string, err error) {
	if i := slices.Index(storeOps[:], op); i >= 0 {
		c.errs[i].Add(1)
	}
	if c.cfg.OnError != nil {
		c.cfg.OnError(op, err)
	}
}

// Tick runs one tick of every domain now; the domains' own tickers call
// it per domain. Tests call it with a fake clock.
func (c *Controller) Tick(ctx context.Context) {
	for _, d := range *c.doms.Load() {
		c.tickDomain(ctx, d)
	}
}

func (c *Controller) tickDomain(ctx context.Context, d *ctlDomain) {
	names := make([]string, 0, len(d.scopes))
	for n := range d.scopes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c.tick(ctx, d.scopes[n])
	}
}

func (c *Controller) tick(ctx context.Context, sc *ctlScope) {
	cfg := &sc.law.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.Interval)
	defer cancel()
	now := c.cfg.Clock.Now()
	c.addCounts(ctx, now, sc)

	val, ver, err := c.cfg.Cells.Load(ctx, now, sc.cellKey)
	if err != nil {
		c.fail(OpLoad, err)
		c.storeDown(sc, now)
		return
	}
	n := len(cfg.Sheddable)
	st, derr := decodeState(val, n)
	if derr == nil && now.Sub(st.At) < cfg.Interval && st.At.Sub(now) < cfg.Interval {
		c.adopt(sc, st, now)
		return
	}
	prev := sc.local
	if derr == nil {
		prev = st
	}
	r, ok := c.read(ctx, now, sc)
	if !ok {
		c.storeDown(sc, now)
		return
	}
	next := sc.law.next(prev, r, now)
	next.By = c.cfg.Replica
	ttl := max(4*cfg.Dwell, 4*cfg.Window, time.Minute)
	swapped, _, err := c.cfg.Cells.Swap(ctx, now, sc.cellKey, ver, encodeState(next), ttl)
	if err != nil {
		// Computed from what the store said this tick, but not shared:
		// in force here, and not counted as the store answering.
		c.fail(OpSwap, err)
		c.publish(sc, next)
		c.storeDown(sc, now)
		return
	}
	if !swapped {
		// Another replica wrote first: its state is the one all follow.
		if val, _, err := c.cfg.Cells.Load(ctx, now, sc.cellKey); err == nil {
			if won, err := decodeState(val, n); err == nil {
				c.adopt(sc, won, now)
				return
			}
		} else {
			c.fail(OpLoad, err)
		}
	}
	c.adopt(sc, next, now)
}

// addCounts adds this replica's counts since the last tick to the Meters.
// Counts an Add failed to send are sent again later, each to the bucket
// of the tick that counted them, and only while that bucket is still in
// the window the rates are read over. Adding them to the bucket of the
// tick the store answers again would read a whole outage's requests as
// one tick's: after Redis came back from 20 s down, every tier's offered
// rate read 80x, premium's took all of R, and free and standard were
// shed whole for the dwell (TestControllerRedisRestart).
func (c *Controller) addCounts(ctx context.Context, now time.Time, sc *ctlScope) {
	var counts map[string]int64
	for i, t := range sc.tiers {
		for _, m := range [2]struct {
			n    *atomic.Int64
			name string
		}{{&sc.offered[i], meterOffered + t}, {&sc.admitted[i], meterAdmitted + t}} {
			if v := m.n.Swap(0); v > 0 {
				if counts == nil {
					counts = map[string]int64{}
				}
				counts[m.name] += v
			}
		}
	}
	cfg := &sc.law.cfg
	keep := cfg.Window + 2*cfg.Interval
	// Past the window a bucket is no longer read: its counts are dropped.
	sc.pending = slices.DeleteFunc(sc.pending, func(p pendingCounts) bool { return now.Sub(p.at) >= cfg.Window })
	if len(counts) > 0 {
		if err := c.cfg.Meters.Add(ctx, now, sc.meterKey, cfg.Interval, keep, counts); err != nil {
			// The earlier ones wait too: a store that failed now would
			// most likely fail them as well, each call bounded only by
			// the tick's interval.
			c.fail(OpAdd, err)
			sc.pending = append(sc.pending, pendingCounts{at: now, counts: counts})
			return
		}
	}
	for len(sc.pending) > 0 {
		p := sc.pending[0]
		if err := c.cfg.Meters.Add(ctx, p.at, sc.meterKey, cfg.Interval, keep, p.counts); err != nil {
			c.fail(OpAdd, err)
			return
		}
		sc.pending = sc.pending[1:]
	}
}

// read takes the reading a tick computes from: the cluster's flights
// and its offered and admitted rates.
func (c *Controller) read(ctx context.Context, now time.Time, sc *ctlScope) (ControlReading, bool) {
	cfg := &sc.law.cfg
	counts, err := c.cfg.Flights.Count(ctx, now, []string{sc.flightKey})
	if err != nil || len(counts) != 1 {
		if err == nil {
			err = fmt.Errorf("count returned %d values for 1 scope", len(counts))
		}
		c.fail(OpCount, err)
		return ControlReading{}, false
	}
	n := int(cfg.Window / cfg.Interval)
	var sums [3]map[string]int64
	for i, k := range [3]int{n, n / 2, 1} {
		if sums[i], err = c.cfg.Meters.Sum(ctx, now, sc.meterKey, cfg.Interval, k, false); err != nil {
			c.fail(OpSum, err)
			return ControlReading{}, false
		}
	}
	iv := cfg.Interval.Seconds()
	r := ControlReading{InFlight: counts[0], Offered: map[string]float64{}}
	for _, t := range sc.tiers {
		rt := Rates{
			Win: float64(sums[0][meterOffered+t]), WinSecs: float64(n) * iv,
			Half: float64(sums[1][meterOffered+t]), HalfSecs: float64(n/2) * iv,
			Last: float64(sums[2][meterOffered+t]), LastSecs: iv,
		}
		if o := rt.Offered(); o > 0 {
			r.Offered[t] = o
		}
		r.Admitted += float64(sums[0][meterAdmitted+t]) / (float64(n) * iv)
	}
	return r, true
}

// adopt puts st in force: the store answered.
func (c *Controller) adopt(sc *ctlScope, st ControlState, now time.Time) {
	sc.lastGood = now
	sc.stale.Store(false)
	c.publish(sc, st)
}

func (c *Controller) publish(sc *ctlScope, st ControlState) {
	sc.local = st
	// Changes counts per record; a record made afresh (expired, or a
	// corrupt one replaced) starts again from 0.
	if prev := sc.seen.Swap(st.Changes); st.Changes > prev {
		sc.count.Add(st.Changes - prev)
	} else if st.Changes < prev {
		sc.count.Add(st.Changes)
	}
	sc.state.Store(&st)
}

// storeDown keeps the state in force for Grace after the store last
// answered, then sheds nothing for the upstream.
func (c *Controller) storeDown(sc *ctlScope, now time.Time) {
	if sc.lastGood.IsZero() {
		sc.lastGood = now // a start with the store down gets its grace too
	}
	if now.Sub(sc.lastGood) <= sc.law.cfg.Grace || sc.stale.Load() {
		return
	}
	sc.stale.Store(true)
	st := *sc.state.Load()
	st.Fractions = make([]float64, len(st.Fractions))
	sc.state.Store(&st)
}

func (c *Controller) scope(domain, upstream string) *ctlScope {
	d := (*c.doms.Load())[domain]
	if d == nil {
		return nil
	}
	return d.scopes[upstream]
}

// Fraction is the share of tier's requests to domain's upstream shed now:
// 0 for anything the Controller does not control.
func (c *Controller) Fraction(domain, upstream, tier string) float64 {
	sc := c.scope(domain, upstream)
	if sc == nil {
		return 0
	}
	return sc.law.fraction(sc.state.Load(), tier)
}

// Busy reports whether domain's upstream had at least its capacity in
// flight at the last count: a 503 or 504 from it then is overload, not
// failure. False for an upstream not controlled, or while the store has
// been down past Grace.
func (c *Controller) Busy(domain, upstream string) bool {
	sc := c.scope(domain, upstream)
	if sc == nil || sc.stale.Load() {
		return false
	}
	return sc.state.Load().InFlight >= sc.law.capacity
}

// ControlView is one controlled upstream's state, for GET /v1/pressure,
// /debug/pressure and the metrics.
type ControlView struct {
	Domain   string             `json:"domain"`
	Scope    string             `json:"scope"`
	Capacity int64              `json:"capacity"`
	Target   float64            `json:"target"`
	InFlight int64              `json:"inflight"`
	Shed     map[string]float64 `json:"shed"`
	// Latency (seconds) and Rate (requests/s, null before an estimate)
	// are the law's L and R.
	Latency float64   `json:"latency_seconds"`
	Rate    *float64  `json:"rate"`
	At      time.Time `json:"at"`
	Changed time.Time `json:"changed"`
	By      string    `json:"by,omitempty"`
	Stale   bool      `json:"stale"`
	// Changes counts the changes of fractions this replica has seen.
	Changes uint64 `json:"changes"`
}

// Snapshot returns every controlled upstream's state, by domain and
// upstream.
func (c *Controller) Snapshot() []ControlView {
	var out []ControlView
	for _, d := range *c.doms.Load() {
		for _, sc := range d.scopes {
			st := sc.state.Load()
			v := ControlView{
				Domain: sc.domain, Scope: sc.name, Capacity: sc.law.capacity, Target: sc.law.target(),
				InFlight: st.InFlight, Shed: map[string]float64{}, Latency: st.Latency,
				At: st.At, Changed: st.Changed, By: st.By, Stale: sc.stale.Load(), Changes: sc.count.Load(),
			}
			if !math.IsInf(st.Rate, 0) && !math.IsNaN(st.Rate) && !st.At.IsZero() {
				r := st.Rate
				v.Rate = &r
			}
			for i, t := range sc.law.cfg.Sheddable {
				if i < len(st.Fractions) {
					v.Shed[t] = st.Fractions[i]
				}
			}
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b ControlView) int {
		if a.Domain != b.Domain {
			return cmpStr(a.Domain, b.Domain)
		}
		return cmpStr(a.Scope, b.Scope)
	})
	return out
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// StoreErrors returns the failed store calls per operation.
func (c *Controller) StoreErrors() map[string]uint64 {
	out := make(map[string]uint64, nStoreOps)
	for i, op := range storeOps {
		out[op] = c.errs[i].Load()
	}
	return out
}

// Dropped counts the flight operations a full queue dropped.
func (c *Controller) Dropped() uint64 { return c.dropped.Load() }
