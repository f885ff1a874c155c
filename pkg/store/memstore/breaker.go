package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const breakerShards = 64

// Breakers is the in-process breaker.Store: a breaker.Cell per key, under
// the lock of the key's shard. A cell is dropped once it is equivalent to
// a fresh one (Cell.Expiry), on access or by a small sweep on insert, as
// Store drops counters; expiry follows the times callers pass in.
type Breakers struct {
	seed   maphash.Seed
	shards [breakerShards]breakerShard
}

var _ breaker.Store = (*Breakers)(nil)

type breakerShard struct {
	mu sync.Mutex
	m  map[string]*breakerEntry
	// onces are the failure markers (breaker.OnceKey) of the shard's
	// breakers, with when they expire (Unix ms).
	onces map[string]int64
	_     [40]byte
}

type breakerEntry struct {
	c       breaker.Cell
	expires int64
}

// NewBreakers returns an empty Breakers.
func NewBreakers() *Breakers {
	b := &Breakers{seed: maphash.MakeSeed()}
	for i := range b.shards {
		b.shards[i].m = make(map[string]*breakerEntry)
		b.shards[i].onces = make(map[string]int64)
	}
	return b
}

// with runs f on key's cell at now under its shard's lock, then keeps or
// drops the cell as it left it. A closed cell f did not change is not
// written, so a closed breaker's Allow allocates nothing.
func (b *Breakers) with(ctx context.Context, now time.Time, key string, p breaker.Params, f func(c *breaker.Cell, now int64)) error {
	return b.withShard(ctx, now, key, p, func(_ *breakerShard, c *breaker.Cell, now int64) { f(c, now) })
}

// withShard is with, f also getting the shard (locked).
func (b *Breakers) withShard(ctx context.Context, now time.Time, key string, p breaker.Params, f func(sh *breakerShard, c *breaker.Cell, now int64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ms := now.UnixMilli()
	sh := &b.shards[maphash.String(b.seed, key)%breakerShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e != nil && e.expires <= ms {
		delete(sh.m, key)
		e = nil
	}
	if e == nil {
		var c breaker.Cell
		f(sh, &c, ms)
		if exp := c.Expiry(p); exp > ms {
			sweepBreakers(sh, ms)
			sh.m[key] = &breakerEntry{c: c, expires: exp}
		}
		return nil
	}
	f(sh, &e.c, ms)
	if e.expires = e.c.Expiry(p); e.expires <= ms {
		delete(sh.m, key)
	}
	return nil
}

func sweepBreakers(sh *breakerShard, now int64) {
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

// Allow implements breaker.Store.
func (b *Breakers) Allow(ctx context.Context, now time.Time, key string, p breaker.Params, probeID string) (v breaker.Verdict, tr breaker.Transition, err error) {
	if !breaker.ValidProbeID(probeID) {
		return v, tr, fmt.Errorf("%w: a probe ID must be 1 to %d hex digits", limit.ErrInvalid, breaker.MaxProbeIDBytes)
	}
	err = b.with(ctx, now, key, p, func(c *breaker.Cell, now int64) { v, tr = c.Allow(now, p, probeID) })
	return v, tr, err
}

// Record implements breaker.Store.
func (b *Breakers) Record(ctx context.Context, now time.Time, key string, p breaker.Params, r breaker.Report) (tr breaker.Transition, err error) {
	if err := breaker.CheckReport(r); err != nil {
		return tr, err
	}
	err = b.withShard(ctx, now, key, p, func(sh *breakerShard, c *breaker.Cell, now int64) {
		if !r.Success && r.Once != "" && !sh.mark(breaker.OnceKey(key, r.Once), now, now+breaker.OnceTTL(p).Milliseconds()) {
			tr = breaker.Transition{From: c.State, To: c.State}
			return
		}
		if r.Successes > 0 {
			tr = c.Count(now, p, r.Successes)
			return
		}
		tr = c.Record(now, p, r.Success, r.ProbeID)
	})
	return tr, err
}

// mark sets the marker once until expires and reports whether it was
// new; sh.mu is held. Setting one sweeps a few expired ones.
func (sh *breakerShard) mark(once string, now, expires int64) bool {
	if exp, ok := sh.onces[once]; ok && exp > now {
		return false
	}
	n := 0
	for k, exp := range sh.onces {
		if exp <= now {
			delete(sh.onces, k)
		}
		if n++; n == sweepSample {
			break
		}
	}
	sh.onces[once] = expires
	return true
}

// Release implements breaker.Store.
func (b *Breakers) Release(ctx context.Context, now time.Time, key string, p breaker.Params, probeID string) error {
	return b.with(ctx, now, key, p, func(c *breaker.Cell, _ int64) { c.Release(probeID) })
}

// State implements breaker.Store.
func (b *Breakers) State(ctx context.Context, now time.Time, key string, p breaker.Params) (st breaker.Status, err error) {
	err = b.with(ctx, now, key, p, func(c *breaker.Cell, now int64) { st = c.Status(now, p) })
	return st, err
}

// Onces returns the number of failure markers held, expired ones not yet
// swept included.
func (b *Breakers) Onces() int {
	n := 0
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		n += len(sh.onces)
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of breakers held, expired ones not yet swept
// included.
func (b *Breakers) Len() int {
	n := 0
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
