// Package redisstore is the Redis limit.Store: one Lua script (apply.lua)
// applies a decision's charges atomically on a single node, Sentinel or
// Cluster, with the arithmetic of limit.Counter, so that it agrees with
// memstore to the millisecond.
//
// Every decision on a single node or Sentinel, and every decision whose
// keys share a Redis Cluster slot, is run by one call of a function of
// apply.lua's library (FCALL; EVALSHA on a server without functions: see
// applier): all or nothing by Redis's own atomicity. limit.Key gives the
// counters of one descriptor family one hash tag, so most decisions are
// one slot. The library has three functions: apply runs any decision;
// counts runs a decision of fixed windows only (no flags, no fair gate)
// with, per charge, a GET of its window's count and of the next window's
// and an INCRBY or SET, and nothing else; plains
// runs a decision of sliding windows, fixed windows without a count key
// and token buckets (no flags, no fair gate) with apply's steps but
// none of its per-key records, from fewer arguments (call.go's leanFn
// picks the function). counts and plains take many decisions per call, run
// one after another, each all or nothing: a batching store (WithBatch)
// merges its queued decisions into one call of each.
//
// A cluster decision whose keys span slots runs the script once per slot,
// concurrently, and when a slot denies, a second call takes back what the
// other slots kept: all or nothing across slots is by compensation. With
// no other decision on those keys in between, the compensation leaves
// exactly what a denial on one node would. Otherwise a window loses
// exactly the counts this decision added (less what another decision's
// refund already took), and a token bucket loses the debt it added but
// never goes below where the denial would have left it: a compensation
// can under-admit, never over-admit. Between the two calls another
// decision can see, and be denied by, charges about to be taken back.
// A lease acquisition or renewal taken back goes to the deadline it had
// before, if no other decision has changed it since.
//
// A window is a string per key, its high-water mark and dense bucket
// counts in MessagePack, read with one GET and written with one SET (see
// apply.lua). A hash of bucket fields took three or four commands and
// most of the script's time to parse and diff, and more memory: a key
// with all 21 buckets of a default window costs Redis 214 bytes where the
// hash cost 358, one with one bucket 177 where it cost 193, key and
// expiry included (BenchmarkKeyMemory). A window still in the hash of
// earlier versions is read as one and written back as a string; a
// replica of such a version that meets a rewritten window fails its
// decision (WRONGTYPE) until it is upgraded too.
//
// A fixed window is kept in a key of its own per window (limit.CountKey:
// the counter's key, '#' and the window's index), as its decimal count,
// expiring a second after the window ends: a GET reads it, an INCRBY
// charges it, a SET PX starts it. Each decision also reads the next
// window's key: a replica whose clock is behind counts in the window a
// replica ahead has started, as a window's high-water mark does (memstore
// and limit.Counter). WithOptimisticFixed runs the acquisitions among
// such decisions with plain commands instead (optimistic.go): GET of the
// next window's key, SET 0 PX NX and INCRBY per charge, and INCRBY of
// -cost to take a denial back. Versions before this one kept a fixed
// window in the counter's key as a one-bucket MessagePack window: during
// a rolling update from one, old and new replicas count a fixed window
// apart, so its windows during the rollout may admit up to twice their
// limit (sliding windows and token buckets keep their layout).
//
// Concurrency leases are a sorted set per key (member -> deadline), Once
// marks a string holding the mark's deadline. A Once mark that does not
// fit voids the whole decision, which no compensation could give back
// exactly (refunds and high-water marks cannot be taken back). So a
// cluster decision across slots with Once charges sets its marks first,
// on their own slots; if one does not fit, the marks set elsewhere are
// taken back (each only while it is still the mark this decision set)
// and the rest of the decision is evaluated without being written. When
// every mark fits, the rest runs as above, and its marks stay whether it
// admits or denies; a failure takes them back. That costs one more round
// trip, for decisions across slots with a Once charge only.
//
// Every key written expires one second (ttlMargin in apply.lua) after its
// counter becomes equivalent to a fresh one: Redis expires keys by its own
// clock, and the replicas that pass now may be a little behind it.
package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

//go:embed apply.lua
var applyLua string

// Store is a limit.Store on Redis.
type Store struct {
	c       redis.UniversalClient
	cluster *redis.ClusterClient // nil unless c is a cluster client
	apply   *applier
	// loaded is set once a Ping has loaded the function library.
	loaded atomic.Bool
	// slowUntil is when calls stop outliving their decisions (Unix ns;
	// see runFor).
	slowUntil atomic.Int64
	// batchSize is WithBatch's; batch is nil unless it batches.
	batchSize int
	// batchWait is WithBatchWait's.
	batchWait time.Duration
	batch     *batcher
	// optimistic is WithOptimisticFixed's.
	optimistic bool
}

var _ limit.Store = (*Store)(nil)

// New returns a Store on c, which it owns: Close closes c. A
// *redis.ClusterClient has decisions split by slot; any other client gets
// each decision in one script call.
func New(c redis.UniversalClient, opts ...StoreOption) *Store {
	cc, _ := c.(*redis.ClusterClient)
	s := &Store{c: c, cluster: cc, apply: newApplier(applyLua)}
	for _, opt := range opts {
		opt(s)
	}
	if s.batchSize > 1 && cc == nil {
		s.batch = newBatcher(c, s.apply, s.batchSize, s.batchWait)
	}
	return s
}

// Ping checks that Redis answers (every master, for a cluster).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.ping(ctx); err != nil {
		return err
	}
	// The first successful Ping (readiness, at start) also loads the
	// library, so the first decisions do not each find it missing and
	// spend their store timeout loading it.
	if !s.loaded.Load() {
		s.apply.load(ctx, s.c)
		s.loaded.Store(true)
	}
	return nil
}

func (s *Store) ping(ctx context.Context) error {
	if s.cluster != nil {
		err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
		if err != nil {
			return fmt.Errorf("ping redis cluster: %w", err)
		}
		return nil
	}
	if err := s.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// Close closes the client, once the pipelines in flight, if it batches,
// are answered.
func (s *Store) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	return s.c.Close()
}

// Apply implements limit.Store.
func (s *Store) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	if len(res) != len(charges) {
		return false, fmt.Errorf("apply: %d results for %d charges", len(res), len(charges))
	}
	if len(charges) == 0 {
		return true, nil
	}
	ms := now.UnixMilli()
	if s.cluster != nil {
		if err := fairSlots(charges); err != nil {
			return false, err
		}
		if groups := bySlot(charges); len(groups) > 1 {
			return s.applySlots(ctx, ms, charges, groups, res)
		}
	}
	call, err := newCall("apply", ms, charges)
	if err != nil {
		return false, err
	}
	call.incr = s.optimistic && call.fn == fnCounts && optimisticOK(charges)
	rep, err := s.runFor(ctx, now, call)
	if err != nil {
		return false, err
	}
	return call.decode(rep, charges, res)
}

// run runs call on the client, unbatched (runFor sends a batching
// store's calls to its batcher).
func (s *Store) run(ctx context.Context, call *call) ([]any, error) {
	run := s.apply.run
	if call.incr {
		run = s.apply.runIncr
	}
	rep, err := run(ctx, s.c, call)
	if err != nil {
		return nil, fmt.Errorf("run apply script: %w", err)
	}
	return rep, nil
}
