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
	_  [48]byte
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
	}
	return b
}

// with runs f on key's cell at now under its shard's lock, then keeps or
// drops the cell as it left it. A closed cell f did not change is not
// written, so a closed breaker's Allow allocates nothing.
func (b *Breakers) with(ctx context.Context, now time.Time, key string, p breaker.Params, f func(c *breaker.Cell, now int64)) error {
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
		f(&c, ms)
		if exp := c.Expiry(p); exp > ms {
			sweepBreakers(sh, ms)
			sh.m[key] = &breakerEntry{c: c, expires: exp}
		}
		return nil
	}
	f(&e.c, ms)
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
func (b *Breakers) Record(ctx context.Context, now time.Time, key string, p breaker.Params, success bool, probeID string) (tr breaker.Transition, err error) {
	err = b.with(ctx, now, key, p, func(c *breaker.Cell, now int64) { tr = c.Record(now, p, success, probeID) })
	return tr, err
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
