package breaker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Breaker is the breakers of one Config, on a Store. It keeps, for
// Snapshot and metrics, the last state it saw of each name (at most
// MaxTracked names) and counts the transitions its store calls made.
// Safe for concurrent use.
type Breaker struct {
	cfg   Config
	p     Params
	store Store

	tracked   sync.Map // name -> *seen
	mu        sync.Mutex
	n         atomic.Int64 // entries in tracked; written under mu
	untracked atomic.Uint64
	trans     [3][3]atomic.Uint64
	classes   [numClasses]atomic.Uint64

	// batches are the successes of a rated breaker not yet sent, by name
	// (at most MaxTracked names; past that a success goes alone).
	bmu     sync.Mutex
	batches map[string]*batch
}

// batch is one name's successes waiting to be sent.
type batch struct {
	n     uint64
	since int64 // Unix ms of the first
}

// seen is the last state a Breaker saw of one name.
type seen struct {
	state atomic.Uint32
	until atomic.Int64 // Unix ms, when state is Open
	// read is when a Closed state was read from the store (Unix ms), 0
	// when it was not: Allow trusts it for Config.Cache.
	read atomic.Int64
}

// New returns the Breaker of cfg on store, with cfg's defaults filled.
func New(cfg Config, store Store) (*Breaker, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("breaker %q: a Store is required", cfg.Key)
	}
	return &Breaker{cfg: cfg, p: params(cfg), store: store, batches: map[string]*batch{}}, nil
}

// Config returns the configuration, defaults filled.
func (b *Breaker) Config() Config { return b.cfg }

// Allow decides whether a request to the upstream name may go. It asks
// the store, except when this replica read name closed less than
// Config.Cache ago, or knows it open until after now: then it answers
// alone. An empty name (the descriptor has no such entry) is allowed
// without a store call.
func (b *Breaker) Allow(ctx context.Context, now time.Time, name string) (Verdict, error) {
	if name == "" {
		return Verdict{Allowed: true}, nil
	}
	if v, ok := b.cached(now.UnixMilli(), name); ok {
		return v, nil
	}
	if err := checkName(name); err != nil {
		return Verdict{}, err
	}
	v, tr, err := b.store.Allow(ctx, now, StoreKey(b.cfg.Key, name), b.p, NewProbeID())
	if err != nil {
		return Verdict{}, fmt.Errorf("breaker %s=%q: allow: %w", b.cfg.Key, name, err)
	}
	b.count(tr)
	var until int64
	if v.State == Open {
		until = now.Add(v.RetryAfter).UnixMilli()
	}
	b.seeRead(name, v.State, until, now.UnixMilli())
	return v, nil
}

// cached answers Allow from what this replica last saw of name, when
// that still holds: a closed state read from the store less than Cache
// ago (another replica may have opened it since; Cache bounds how long
// this one lags), or an open state whose period has not ended (only
// time moves an open breaker). A half-open breaker hands out probe slots,
// which only the store can count.
func (b *Breaker) cached(now int64, name string) (Verdict, bool) {
	v, ok := b.tracked.Load(name)
	if !ok {
		return Verdict{}, false
	}
	e := v.(*seen)
	switch State(e.state.Load()) {
	case Closed:
		if read := e.read.Load(); read != 0 && now >= read && now-read < b.cfg.Cache.Milliseconds() {
			return Verdict{Allowed: true, State: Closed}, true
		}
	case Open:
		if until := e.until.Load(); now < until {
			return Verdict{State: Open, RetryAfter: time.Duration(until-now) * time.Millisecond}, true
		}
	}
	return Verdict{}, false
}

// Record takes the outcome of a request to name (see Report).
func (b *Breaker) Record(ctx context.Context, now time.Time, name string, r Report) error {
	if name == "" {
		return nil
	}
	if err := checkName(name); err != nil {
		return err
	}
	if err := CheckReport(r); err != nil {
		return err
	}
	tr, err := b.store.Record(ctx, now, StoreKey(b.cfg.Key, name), b.p, r)
	if err != nil {
		return fmt.Errorf("breaker %s=%q: record: %w", b.cfg.Key, name, err)
	}
	b.count(tr)
	if tr.Changed() {
		var until int64
		if tr.To == Open {
			until = now.Add(b.cfg.OpenFor).UnixMilli()
		}
		b.see(name, tr.To, until)
	}
	return nil
}

// Release frees the half-open slot a probe of name holds, without
// counting an outcome: the request it was given to was refused later in
// the decision and never went upstream, or its outcome was neutral (see
// Observe). An unknown or stale probeID changes nothing.
func (b *Breaker) Release(ctx context.Context, now time.Time, name, probeID string) error {
	if name == "" || probeID == "" {
		return nil
	}
	if err := checkName(name); err != nil {
		return err
	}
	if err := b.store.Release(ctx, now, StoreKey(b.cfg.Key, name), b.p, probeID); err != nil {
		return fmt.Errorf("breaker %s=%q: release: %w", b.cfg.Key, name, err)
	}
	return nil
}

// State reads name's state from the store.
func (b *Breaker) State(ctx context.Context, now time.Time, name string) (Status, error) {
	if err := checkName(name); err != nil {
		return Status{}, err
	}
	st, err := b.store.State(ctx, now, StoreKey(b.cfg.Key, name), b.p)
	if err != nil {
		return Status{}, fmt.Errorf("breaker %s=%q: state: %w", b.cfg.Key, name, err)
	}
	var until int64
	if st.State == Open {
		until = st.OpenUntil.UnixMilli()
	}
	b.seeRead(name, st.State, until, now.UnixMilli())
	return st, nil
}

// Observe takes o's outcome as Classify names it: a failure or a success
// is recorded; a neutral or overload outcome counts nothing, and frees
// the slot of a probe, which then told nothing about whether the upstream
// is broken (it never closes the breaker: only a success does). Every
// class is counted for Outcomes.
func (b *Breaker) Observe(ctx context.Context, now time.Time, o Outcome) error {
	c := Classify(b.cfg, o)
	if o.Name != "" {
		b.classes[c].Add(1)
	}
	switch c {
	case Failure:
		// A rated breaker weighs the failure against the successes: send
		// the ones waiting first, so the store sees them all.
		if err := b.flush(ctx, now, o.Name); err != nil {
			return err
		}
		return b.Record(ctx, now, o.Name, Report{ProbeID: o.ProbeID, Once: o.Once})
	case Success:
		if b.p.Rated() && o.ProbeID == "" {
			return b.succeed(ctx, now, o.Name)
		}
		return b.Record(ctx, now, o.Name, Report{Success: true, ProbeID: o.ProbeID, Once: o.Once})
	}
	return b.Release(ctx, now, o.Name, o.ProbeID)
}

// succeed counts a success of a rated breaker's name toward its batch,
// and sends the batch once it is Config.Cache old: one store call per
// name per Cache, not one per request, and a breaker opened elsewhere is
// seen within Cache anyway. A batch still waiting when the name's next
// failure comes goes first (flush).
func (b *Breaker) succeed(ctx context.Context, now time.Time, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	ms := now.UnixMilli()
	b.bmu.Lock()
	e := b.batches[name]
	if e == nil {
		if len(b.batches) >= MaxTracked {
			b.bmu.Unlock()
			return b.Record(ctx, now, name, Report{Successes: 1})
		}
		e = &batch{since: ms}
		b.batches[name] = e
	}
	e.n++
	if ms-e.since < b.cfg.Cache.Milliseconds() {
		b.bmu.Unlock()
		return nil
	}
	n := e.n
	delete(b.batches, name)
	b.bmu.Unlock()
	return b.Record(ctx, now, name, Report{Successes: n})
}

// flush sends name's waiting successes, if any.
func (b *Breaker) flush(ctx context.Context, now time.Time, name string) error {
	b.bmu.Lock()
	e := b.batches[name]
	delete(b.batches, name)
	b.bmu.Unlock()
	if e == nil {
		return nil
	}
	return b.Record(ctx, now, name, Report{Successes: e.n})
}

// Flush sends every name's waiting successes (a rated breaker's; see
// Observe), and returns the first error.
func (b *Breaker) Flush(ctx context.Context, now time.Time) error {
	b.bmu.Lock()
	names := make([]string, 0, len(b.batches))
	for name := range b.batches {
		names = append(names, name)
	}
	b.bmu.Unlock()
	var first error
	for _, name := range names {
		if err := b.flush(ctx, now, name); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (b *Breaker) count(tr Transition) {
	if tr.Changed() && tr.From <= Open && tr.To <= Open {
		b.trans[tr.From][tr.To].Add(1)
	}
}

// see notes name's state, learnt other than by reading it (a transition
// this replica's Record made), so Allow does not answer a closed state
// from it.
func (b *Breaker) see(name string, st State, until int64) { b.seeRead(name, st, until, 0) }

// seeRead notes name's state, read from the store at read (Unix ms; 0:
// not a read). Known names cost a lock-free load; a new name takes the
// lock, and once MaxTracked names are kept it gets in only when it is not
// closed and a closed one can make room.
func (b *Breaker) seeRead(name string, st State, until, read int64) {
	if st != Closed {
		read = 0
	}
	if v, ok := b.tracked.Load(name); ok {
		e := v.(*seen)
		e.read.Store(0) // no answer from a half-written entry
		e.until.Store(until)
		e.state.Store(uint32(st))
		e.read.Store(read)
		return
	}
	if st == Closed && b.n.Load() >= MaxTracked {
		b.untracked.Add(1)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n.Load() >= MaxTracked {
		if st == Closed || !b.evictClosed() {
			b.untracked.Add(1)
			return
		}
	}
	e := new(seen)
	e.until.Store(until)
	e.state.Store(uint32(st))
	e.read.Store(read)
	if _, loaded := b.tracked.LoadOrStore(name, e); !loaded {
		b.n.Add(1)
	}
}

// evictClosed drops one closed name; b.mu is held.
func (b *Breaker) evictClosed() bool {
	done := false
	b.tracked.Range(func(k, v any) bool {
		if State(v.(*seen).state.Load()) == Closed {
			b.tracked.Delete(k)
			b.n.Add(-1)
			done = true
			return false
		}
		return true
	})
	return done
}

// Named is one breaker in a Snapshot.
type Named struct {
	Key, Name string
	State     State
	// OpenUntil is set for an open breaker.
	OpenUntil time.Time
}

// Snapshot lists the tracked breakers, sorted by name, as this replica
// last saw them, moved on to now (an open one whose period has ended
// shows half-open). It reads no store: /debug wanting the store's view of
// one breaker calls State.
func (b *Breaker) Snapshot(now time.Time) []Named {
	var out []Named
	b.tracked.Range(func(k, v any) bool {
		e := v.(*seen)
		n := Named{Key: b.cfg.Key, Name: k.(string), State: State(e.state.Load())}
		if n.State == Open {
			if u := e.until.Load(); now.UnixMilli() < u {
				n.OpenUntil = time.UnixMilli(u)
			} else {
				n.State = HalfOpen
			}
		}
		out = append(out, n)
		return true
	})
	slices.SortFunc(out, func(a, b Named) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// TransitionCount is how many times this replica's store calls moved a
// breaker of this Config from From to To.
type TransitionCount struct {
	From, To State
	N        uint64
}

// Transitions lists the possible transitions with their counts, zeros
// included, so a counter exists from the start.
func (b *Breaker) Transitions() []TransitionCount {
	pairs := [...]Transition{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Open}, {HalfOpen, Closed}}
	out := make([]TransitionCount, len(pairs))
	for i, t := range pairs {
		out[i] = TransitionCount{From: t.From, To: t.To, N: b.trans[t.From][t.To].Load()}
	}
	return out
}

// Untracked counts the times a name was left out of the tracked set
// because it was full.
func (b *Breaker) Untracked() uint64 { return b.untracked.Load() }

// ClassCount is how many outcomes this replica's Observe classified as
// Class.
type ClassCount struct {
	Class Class
	N     uint64
}

// Outcomes lists the classes with their counts, zeros included, so a
// counter exists from the start. Outcomes without a name (the request
// did not carry the breaker's key) are not counted.
func (b *Breaker) Outcomes() []ClassCount {
	out := make([]ClassCount, numClasses)
	for c := range Class(numClasses) {
		out[c] = ClassCount{Class: c, N: b.classes[c].Load()}
	}
	return out
}
