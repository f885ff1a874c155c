// Package memstore is the in-process limit.Store: the default when no
// Redis is configured, a sidecar's local limits, and the reference the
// Redis store is tested against (both pass storetest).
//
// The key space is split into shards, each with its own lock; a decision
// locks the shards its keys fall in, in ascending order, so decisions on
// different keys run in parallel and never deadlock. Idle counters are
// dropped once they are equivalent to fresh ones, by a small sweep on each
// insert (no goroutine), so memory follows the live keys.
//
// Expiry follows the times callers pass to Apply, as the algorithms do: a
// sweep at one time drops counters that have expired by then. Callers
// whose clocks differ by more than a counter's lifetime (tests with a
// fake clock each) should not share a Store.
//
// Concurrency leases and Once marks live in limit.Counter beside the
// windows and token buckets, so a key's entry holds its live leases (its
// expired ones until the next decision on it drops them) and lives until
// its latest deadline; a void decision (a Once mark that does not fit)
// writes nothing.
//
// A fair-shared charge (Charge.Fair.Policy set) keeps a limit.FairState
// in its own entry at limit.FairStateKey of the counter's key, locked
// with the counter and expired like it (fair.go).
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const (
	numShards = 256
	// sweepSample is how many entries of a shard an insert looks at for
	// expired ones. Looking at more than one per insert makes the share of
	// expired entries shrink whenever it grows, so a store holds a small
	// multiple of its live keys (TestEvictionBoundsMemory: under 2x).
	sweepSample = 4
)

// Store is an in-memory limit.Store. The zero value is not usable; call New.
type Store struct {
	seed    maphash.Seed
	shards  [numShards]shard
	scratch sync.Pool
}

var _ limit.Store = (*Store)(nil)

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [48]byte // keep each shard's lock on its own cache line
}

type entry struct {
	c limit.Counter
	// fair is the fair-share state when the entry is a FairStateKey.
	fair *limit.FairState
	// expires is the Unix ms from which c is equivalent to a fresh counter.
	expires int64
}

// New returns an empty Store.
func New() *Store {
	s := &Store{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	s.scratch.New = func() any { return new(scratch) }
	return s
}

// scratch is one Apply's working state, pooled so a decision allocates
// nothing once its keys exist.
type scratch struct {
	slots []slot
	slot  []int // charge index -> slot index
	// fair is charge index -> the slot of its fair state, -1 for a charge
	// that is not fair-shared; empty when the decision has none.
	fair []int
	// fits is charge index -> whether it fitted, for Record.
	fits []bool
}

// slot is one distinct key of a decision.
type slot struct {
	key   string
	shard int
	e     *entry // the stored entry, nil when absent
	live  bool   // e holds state that has not expired
	c     limit.Counter
	last  int // the last charge on this key, for Expiry
	// isFair marks the slot of a fair state, fs its working copy.
	isFair bool
	fs     limit.FairState
}

func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.seed, key) % numShards)
}

// Apply implements limit.Store as limit.Counter describes: it evaluates
// the charges in order against working copies of their counters, then
// keeps them all; or, when one that is neither Shadow nor Force does not
// fit, only the refunds, Force charges and Once marks (and the windows'
// high-water marks); or, when a Once charge does not fit, nothing.
func (s *Store) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	if len(res) != len(charges) {
		return false, fmt.Errorf("memstore: %d results for %d charges", len(res), len(charges))
	}
	if len(charges) == 0 {
		return true, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := checkCharges(charges); err != nil {
		return false, err
	}
	ms := now.UnixMilli()
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)

	locked := s.gather(sc, charges)
	s.lock(locked)
	for j := range sc.slots {
		sl := &sc.slots[j]
		sl.e = s.shards[sl.shard].m[sl.key]
		sl.live = sl.e != nil && sl.e.expires > ms
		sl.load()
	}
	admitted, void := sc.step(charges, res, ms)
	switch {
	case void:
		// Keep nothing: the Results describe the stored counters.
		admitted = false
		sc.load()
	case !admitted:
		sc.keepDenied(charges, ms)
	}
	if !void {
		sc.record(charges, admitted, ms)
		s.commitAll(sc, charges, ms)
	}
	s.unlock(locked)

	for i := range charges {
		rem, reset := sc.slots[sc.slot[i]].c.Report(&charges[i], ms)
		res[i].Remaining = rem
		res[i].ResetAfter = limit.Millis(reset)
	}
	return admitted, nil
}

// checkCharges refuses a charge the store cannot apply.
func checkCharges(charges []limit.Charge) error {
	for i := range charges {
		ch := &charges[i]
		if ch.Algorithm > limit.Once {
			return fmt.Errorf("memstore: charges[%d]: unknown algorithm %v", i, ch.Algorithm)
		}
		if ch.Algorithm == limit.Concurrency && ch.Cost != 0 && ch.Member == "" {
			return fmt.Errorf("memstore: charges[%d]: concurrency charge of cost %d has no member", i, ch.Cost)
		}
	}
	return nil
}

// shardSet is a set of shards, a bit each.
type shardSet [numShards / 64]uint64

func (set *shardSet) add(sh int) { set[sh/64] |= 1 << (sh % 64) }

// gather fills sc with a slot for each distinct key of charges, and
// returns the shards they fall in.
func (s *Store) gather(sc *scratch, charges []limit.Charge) shardSet {
	var locked shardSet
	sc.slot = sc.slot[:0]
	for i := range charges {
		j := sc.slotOf(s, charges[i].Key, false, &locked)
		sc.slots[j].last = i
		sc.slot = append(sc.slot, j)
	}
	sc.gatherFair(s, charges, &locked)
	return locked
}

// slotOf returns the index in sc.slots of key's slot, a fair state's when
// fair (a counter's key may end as a fair state's does), adding the slot
// and its shard to locked when the decision has none yet.
func (sc *scratch) slotOf(s *Store, key string, fair bool, locked *shardSet) int {
	sh := s.shardOf(key)
	for j := range sc.slots {
		if sl := &sc.slots[j]; sl.isFair == fair && sl.shard == sh && sl.key == key {
			return j
		}
	}
	j := len(sc.slots)
	// Reuse the pooled slot and its bucket buffer when there is one.
	if j < cap(sc.slots) {
		sc.slots = sc.slots[:j+1]
	} else {
		sc.slots = append(sc.slots, slot{})
	}
	sl := &sc.slots[j]
	sl.key, sl.shard, sl.isFair = key, sh, fair
	locked.add(sh)
	return j
}

// lock locks the shards of set in ascending order, so that decisions
// never deadlock.
func (s *Store) lock(set shardSet) {
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			s.shards[w*64+b].mu.Lock()
		}
	}
}

// unlock unlocks the shards of set.
func (s *Store) unlock(set shardSet) {
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			s.shards[w*64+b].mu.Unlock()
		}
	}
}

// step evaluates the charges in order on the working counters, writing
// res. admitted is false when a charge that is neither Shadow nor Force
// does not fit; void when a Once charge does not.
func (sc *scratch) step(charges []limit.Charge, res []limit.Result, ms int64) (admitted, void bool) {
	admitted = true
	for i := range charges {
		ch := &charges[i]
		fits, retry := sc.gate(i, ch, ms)
		if fits {
			fits, retry = sc.slots[sc.slot[i]].c.Step(ch, ms)
		}
		if len(sc.fair) > 0 {
			sc.fits[i] = fits
		}
		res[i] = limit.Result{Fits: fits, RetryAfter: limit.Millis(retry)}
		switch {
		case fits || ch.Cost < 0:
		case ch.Algorithm == limit.Once:
			void = true
		case !ch.Shadow && !ch.Force:
			admitted = false
		}
	}
	return admitted, void
}

// load sets every working counter back to the stored state.
func (sc *scratch) load() {
	for j := range sc.slots {
		sc.slots[j].load()
	}
}

// keepDenied starts over from the stored state for a denied decision:
// it keeps the refunds, the Force charges and the Once marks, and the
// time the other charges saw.
func (sc *scratch) keepDenied(charges []limit.Charge, ms int64) {
	sc.load()
	for i := range charges {
		ch, c := &charges[i], &sc.slots[sc.slot[i]].c
		if ch.Cost < 0 || (ch.Cost > 0 && (ch.Force || ch.Algorithm == limit.Once)) {
			c.Step(ch, ms)
		} else {
			c.Touch(ch, ms)
		}
	}
}

// commitAll stores every slot's working counter, its shard locked, then
// sweeps the shards that gained a key.
func (s *Store) commitAll(sc *scratch, charges []limit.Charge, ms int64) {
	var grown shardSet
	for j := range sc.slots {
		sl := &sc.slots[j]
		if sl.isFair {
			if s.commitFair(sl, &charges[sl.last], ms) {
				grown.add(sl.shard)
			}
			continue
		}
		if s.commit(sl, &charges[sl.last], ms) {
			grown.add(sl.shard)
		}
	}
	// Sweep after every commit: a sweep may drop an expired entry that
	// a later slot of this decision would otherwise write into.
	for w, word := range grown {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			sweep(&s.shards[w*64+b], ms)
		}
	}
}

// load sets the working counter to the stored state (fresh when absent or
// expired), in the slot's own buffers.
func (sl *slot) load() {
	if sl.isFair {
		sl.loadFair()
		return
	}
	b, l := sl.c.Buckets[:0], sl.c.Leases[:0]
	if sl.live {
		sl.c = sl.e.c
		sl.c.Buckets = append(b, sl.e.c.Buckets...)
		sl.c.Leases = append(l, sl.e.c.Leases...)
	} else {
		sl.c = limit.Counter{Buckets: b, Leases: l}
	}
}

// commit stores a slot's working counter, with its shard locked, and
// reports whether it added a key. Every decision writes (a window's
// high-water mark moves even on a check), so there is nothing to gain
// from tracking what changed.
func (s *Store) commit(sl *slot, ch *limit.Charge, now int64) (added bool) {
	sh := &s.shards[sl.shard]
	exp, ok := sl.c.Expiry(ch)
	if !ok || exp <= now {
		if sl.e != nil {
			delete(sh.m, sl.key)
		}
		return false
	}
	e := sl.e
	if e == nil {
		e = &entry{}
		sh.m[sl.key] = e
	}
	b, l := e.c.Buckets[:0], e.c.Leases[:0]
	e.c = sl.c
	e.c.Buckets = append(b, sl.c.Buckets...)
	e.c.Leases = append(l, sl.c.Leases...)
	e.expires = exp
	return sl.e == nil
}

// sweep drops expired entries among a few of the shard's, starting where
// the map's randomised iteration does.
func sweep(sh *shard, now int64) {
	n := 0
	for k, e := range sh.m {
		if e.expires <= now {
			delete(sh.m, k)
		}
		if n++; n == sweepSample {
			return
		}
	}
}

func (s *Store) release(sc *scratch) {
	for j := range sc.slots {
		sl := &sc.slots[j]
		sl.key, sl.e, sl.live, sl.isFair = "", nil, false, false
	}
	sc.slots = sc.slots[:0]
	sc.fair, sc.fits = sc.fair[:0], sc.fits[:0]
	s.scratch.Put(sc)
}

// Len returns the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Ping reports whether the store can serve; memory always can.
func (s *Store) Ping(ctx context.Context) error { return nil }
