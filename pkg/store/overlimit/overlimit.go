// Package overlimit is a limit.Store decorator that answers decisions
// known to be denied without asking the store behind it.
//
// When the inner store denies a charge on a window or token bucket and
// says when it could fit (RetryAfter), nothing but a refund can make that
// charge, or a larger one, fit before then: charges only add usage, and
// RetryAfter is the earliest instant at which the oldest usage has left
// enough room. So until then a decision carrying that key with at least
// that cost is denied here, with no call to the inner store.
//
// A local denial reports exactly what the inner store would have, had
// nothing else been kept on its keys meanwhile (one writer): each charge's
// Result is the one last seen, with ResetAfter and RetryAfter shortened
// by the time passed, and an entry is used only while that is exact (see
// exactUntil). So a decision is answered locally only when every charge
// in it has such a Result remembered, the blocked one with the same cost:
// a larger cost would not fit either, but how long it must wait only the
// store knows. Request limits charge a constant cost, so this costs them
// nothing; a token estimate that differs asks the store, and learns.
//
// Only plain decisions are answered locally or learnt from: every charge
// a SlidingWindow, FixedWindow or TokenBucket charge with Cost >= 0 and no
// Force, and no key charged twice. A denied decision with a refund, a
// Force charge, a Once mark or a Concurrency lease still changes the
// store, so it always goes to the inner store. A locally denied decision
// keeps nothing, as the inner store would keep nothing for it; the one
// difference is that it does not move the windows' high-water marks,
// which only a caller whose clock is behind could notice, and the next
// call that reaches the store moves them.
//
// A decision with a fair-shared charge (Charge.Fair.Policy set) is never
// answered locally nor learnt from; see fairShared for why.
//
// The cache can only deny more than the store would, never admit more:
// it admits nothing itself. A refund made through this Store (or any
// decision it passes on that touches the key) drops the key's entry, but
// another replica's refunds are invisible here, so a key refunded
// elsewhere can stay denied for at most the RetryAfter the store last
// gave it.
package overlimit

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// DefaultMaxEntries is the number of keys remembered when Options leaves
// MaxEntries at 0.
const DefaultMaxEntries = 100_000

const shardCount = 64

// Options configures a Store.
type Options struct {
	// MaxEntries bounds the keys remembered (Optional; default
	// DefaultMaxEntries). When a shard is full, an expired entry, else an
	// arbitrary one, makes room.
	MaxEntries int
}

// Store is a limit.Store that remembers denials; see the package doc.
// It is safe for concurrent use and starts no goroutines.
type Store struct {
	inner    limit.Store
	perShard int
	shards   [shardCount]shard
	// gen counts the decisions that may have given room back (refunds,
	// errors). A denial learnt from a call that overlapped one is not
	// recorded: it may predate the refund.
	gen    atomic.Uint64
	denied atomic.Uint64
}

var _ limit.Store = (*Store)(nil)

type shard struct {
	mu sync.Mutex
	m  map[string]entry
}

// entry is what the inner store last said about a key, at ms (Unix ms).
//
// A blocking entry records a denial: a charge of cost or more does not
// fit before retryAt. Any other entry records a charge that fit in a
// denied decision, so a local denial of the same decision can report it.
// Either is used only before valid, while what it reports is still
// exactly what the store would say (see exactUntil).
type entry struct {
	valid   int64
	retryAt int64
	at      int64
	// cost is the cost that did not fit (blocking), or the cost that fit:
	// any cost up to it fits too. A check (0) that fit says nothing of a
	// charge: on a window it fits at the limit.
	cost     int64
	blocking bool
	// The limit the answer was for: a key charged under another amount
	// (a plan or pressure change) is not the same question.
	alg     limit.Algorithm
	amount  uint64
	window  time.Duration
	burst   uint64
	buckets uint16
	res     limit.Result
}

func (e *entry) sameLimit(c *limit.Charge) bool {
	return e.alg == c.Algorithm && e.amount == c.Amount && e.window == c.Window &&
		e.burst == c.Burst && e.buckets == c.Buckets
}

// New returns a Store that answers known denials for inner.
func New(inner limit.Store, opts Options) *Store {
	n := opts.MaxEntries
	if n <= 0 {
		n = DefaultMaxEntries
	}
	s := &Store{inner: inner, perShard: max(1, n/shardCount)}
	for i := range s.shards {
		s.shards[i].m = make(map[string]entry)
	}
	return s
}

// LocalDenials returns how many decisions were denied without a call to
// the inner store (for tollgate_store_local_denials_total).
func (s *Store) LocalDenials() uint64 { return s.denied.Load() }

// Len returns the number of keys remembered, expired ones included.
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

func (s *Store) shardOf(key string) *shard {
	// FNV-1a: allocation-free and good enough to spread keys.
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &s.shards[h%shardCount]
}

// Apply answers a plain decision carrying a key known to be over its
// limit locally, and passes everything else to the inner store.
func (s *Store) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	plain := isPlain(charges)
	learnable := plain && !fairShared(charges)
	nowMs := now.UnixMilli()
	if learnable && s.answer(nowMs, charges, res) {
		s.denied.Add(1)
		return false, nil
	}
	gen := s.gen.Load()
	admitted, err := s.inner.Apply(ctx, now, charges, res)
	switch {
	case err != nil || !plain:
		// A refund, a release or a failed call may have given room back.
		s.gen.Add(1)
		s.forget(charges)
	case admitted || !learnable:
		s.forget(charges)
	default:
		s.learn(gen, nowMs, charges, res)
	}
	return admitted, err
}

// isPlain reports whether a decision may be answered locally and learnt
// from: window and token bucket charges only, no refund, no Force, no key
// twice (a charge that saw an earlier one on its key does not say what
// it alone would do).
func isPlain(charges []limit.Charge) bool {
	for i := range charges {
		c := &charges[i]
		if c.Cost < 0 || c.Force || c.Algorithm > limit.TokenBucket {
			return false
		}
		for j := range i {
			if charges[j].Key == c.Key {
				return false
			}
		}
	}
	return len(charges) > 0
}

// fairShared reports whether a charge of the decision is fair-shared.
// Such a decision always asks the inner store and teaches the cache
// nothing, a simpler rule than caching its denials for at most
// min(RetryAfter, one bucket width) per member, and a correct one:
//   - the fair gate's answer is the member's, but the cache keys an
//     answer by the counter's key, which every member of the limit
//     shares: a member gated for running ahead would deny the member it
//     is holding room for. A key per member would fix that, not the rest;
//   - the gate must see every decision: a denial it records keeps the
//     member waiting (its asks and its latest denial), and so keeps the
//     room it is owed; a denial answered here would hide that demand;
//   - the counter's own denial says nothing of which member gets the
//     room freed next, and a fair limit's denials last at most about a
//     bucket, so there is little to save.
//
// The price is a store call for every denied decision on a fair-shared
// limit, as for an uncached one.
func fairShared(charges []limit.Charge) bool {
	for i := range charges {
		if charges[i].Fair.Policy != nil {
			return true
		}
	}
	return false
}

// answer fills res and returns true when some charge of the decision is
// blocked by a remembered denial and every other charge has a remembered
// answer to report; it changes nothing otherwise.
func (s *Store) answer(now int64, charges []limit.Charge, res []limit.Result) bool {
	blocked := false
	for i := range charges {
		c := &charges[i]
		sh := s.shardOf(c.Key)
		sh.mu.Lock()
		e, ok := sh.m[c.Key]
		if ok && now >= e.valid {
			delete(sh.m, c.Key) // expired: the store decides again
			ok = false
		}
		sh.mu.Unlock()
		if !ok || !e.sameLimit(c) {
			return false
		}
		if e.blocking {
			// Only the same cost: a larger one is denied too, but its
			// RetryAfter is later by an amount only the store knows.
			if c.Cost == e.cost && !c.Shadow {
				blocked = true
				retry := ms(e.retryAt - now)
				res[i] = limit.Result{Fits: false, Remaining: e.res.Remaining, ResetAfter: aged(e.res.ResetAfter, e.at, now), RetryAfter: retry}
				continue
			}
			// Another cost, a check or a shadow charge on a blocked
			// key: the store must say whether it fits, and when.
			return false
		}
		if c.Cost > e.cost {
			return false
		}
		res[i] = limit.Result{Fits: true, Remaining: e.res.Remaining, ResetAfter: aged(e.res.ResetAfter, e.at, now)}
	}
	return blocked
}

// aged returns d as it stands now, d having been reported at at.
func aged(d time.Duration, at, now int64) time.Duration {
	return max(0, d-ms(now-at))
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// learn records what a plain denied decision says about its keys: each
// charge that did not fit and names its RetryAfter blocks its key until
// then; each charge that fit is remembered until the latest of those, so
// the same decision can be answered whole. Other keys are forgotten.
func (s *Store) learn(gen uint64, now int64, charges []limit.Charge, res []limit.Result) {
	var until int64
	for i := range charges {
		if blocks(&charges[i], res[i]) {
			until = max(until, now+res[i].RetryAfter.Milliseconds())
		}
	}
	for i := range charges {
		c, r := &charges[i], res[i]
		e := entry{at: now, alg: c.Algorithm, amount: c.Amount, window: c.Window, burst: c.Burst, buckets: c.Buckets, res: r}
		switch {
		case until == 0:
			s.drop(c.Key)
			continue
		case blocks(c, r):
			e.blocking, e.cost, e.retryAt = true, c.Cost, now+r.RetryAfter.Milliseconds()
			e.valid = min(e.retryAt, exactUntil(c, r, now, true))
		case r.Fits && !c.Shadow:
			e.cost = c.Cost
			e.valid = min(until, exactUntil(c, r, now, false))
		default:
			s.drop(c.Key)
			continue
		}
		if e.valid <= now {
			s.drop(c.Key)
			continue
		}
		s.put(gen, c.Key, e)
	}
}

// exactUntil returns the instant (Unix ms) before which r, seen at at,
// still tells exactly what the store would report for c's key if nothing
// were kept on it meanwhile. RetryAfter and ResetAfter fall by the time
// passed; Remaining is what moves:
//   - a charge of 1 that does not fit sees Remaining 0 until it fits;
//   - a fixed window's count stands until the window ends (ResetAfter);
//   - a sliding window's count changes only when a bucket leaves it, at
//     a bucket boundary;
//   - a token bucket refills continuously, so a Remaining is exact in the
//     millisecond it was seen only, unless the bucket is full.
func exactUntil(c *limit.Charge, r limit.Result, at int64, blocking bool) int64 {
	const forever = math.MaxInt64
	if blocking && c.Cost == 1 {
		return forever
	}
	switch c.Algorithm {
	case limit.FixedWindow:
		return at + r.ResetAfter.Milliseconds()
	case limit.SlidingWindow:
		return limit.BucketEnd(c, at)
	default:
		if r.ResetAfter == 0 {
			return forever
		}
		return at + 1
	}
}

// blocks reports whether a charge's denial says it cannot fit for a while.
func blocks(c *limit.Charge, r limit.Result) bool {
	return !r.Fits && c.Cost > 0 && !c.Shadow && !c.Force && c.Algorithm <= limit.TokenBucket &&
		r.RetryAfter >= time.Millisecond
}

func (s *Store) put(gen uint64, key string, e entry) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.gen.Load() != gen {
		return // a refund overlapped the call: the denial may predate it
	}
	if _, ok := sh.m[key]; !ok && len(sh.m) >= s.perShard {
		sh.evict(e.at)
	}
	sh.m[key] = e
}

// evict makes room for one entry: the first expired one among a few,
// else the first seen (map order is random).
func (sh *shard) evict(now int64) {
	const look = 8
	var victim string
	n := 0
	for k, e := range sh.m {
		if now >= e.valid {
			victim = k
			break
		}
		if n == 0 {
			victim = k
		}
		if n++; n == look {
			break
		}
	}
	delete(sh.m, victim)
}

func (s *Store) forget(charges []limit.Charge) {
	for i := range charges {
		s.drop(charges[i].Key)
	}
}

func (s *Store) drop(key string) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}
