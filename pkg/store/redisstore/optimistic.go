package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// WithOptimisticFixed has the store run a decision whose every charge
// acquires on a fixed window (the decisions counts runs, each charge of
// cost > 0) without a script: per charge, a GET of the next window's
// count key, a SET of the window's count key to 0 with the window's
// expiry when the key does not exist (NX), and an INCRBY of the cost,
// queued like any call (one pipeline for a batch), as envoyproxy/ratelimit
// queues its INCRBY and EXPIRE. The counts INCRBY returns, less the cost,
// are judged as counts judges what it reads. A decision that does not fit
// is then taken back (INCRBY of -cost on each key it charged, one more
// round trip, before it is answered), so every count ends as counts
// would leave it.
//
// What it gives up is the script's isolation: until the take-back, the
// charges of a denied decision are visible, and a concurrent decision
// can be denied by them (never admitted: a charge fits only when the
// count INCRBY returns, everything before it included, is within the
// limit). So it never over-admits, keeps all or nothing, and under
// contention near a limit may refuse what the script would admit. If
// the take-back cannot be sent (Redis went away between the two round
// trips), the counts stay high until their window ends: the same
// direction.
//
// A decision that finds the next window started (a replica whose clock
// is ahead) is taken back and runs counts after all, which counts it
// there. One on a key that holds no count fails as counts's does, its
// other charges taken back (a key it created stays, at 0).
//
// Three fixed-window descriptors on distinct keys, batched with a 1.5 ms
// wait at 10,000 decisions/s, cost Redis 1.20-1.35x a bare INCRBY +
// PEXPIRE per descriptor with the counts script, and 0.84x so
// (docs/benchmarks.md).
func WithOptimisticFixed(on bool) StoreOption {
	return func(s *Store) { s.optimistic = on }
}

// OptimisticFixed reports WithOptimisticFixed's setting.
func (s *Store) OptimisticFixed() bool { return s.optimistic }

// optimisticOK reports whether a counts call may run optimistically:
// every charge acquires (cost > 0). A check or a refund reads or lowers a
// count, which the script does in one step.
func optimisticOK(charges []limit.Charge) bool {
	for i := range charges {
		if charges[i].Cost <= 0 {
			return false
		}
	}
	return true
}

// incrOp is one charge's queued commands in an optimistic call: GET
// next, SET cur 0 PX ttl NX, INCRBY cur cost.
type incrOp struct {
	next *redis.StringCmd
	init *redis.BoolCmd
	incr *redis.IntCmd
}

// queueIncr queues c's commands on pipe. c is a counts call (countsCall):
// keys cur, next per charge; args n, then amount, cost, expiry (ms) per
// charge.
func (c *call) queueIncr(ctx context.Context, pipe redis.Pipeliner) {
	c.ops = make([]incrOp, c.charges)
	for i := range c.ops {
		cur, next := c.keys[2*i], c.keys[2*i+1]
		op := &c.ops[i]
		op.next = pipe.Get(ctx, next)
		op.init = redis.NewBoolCmd(ctx, "set", cur, "0", "px", c.args[3+3*i], "nx")
		_ = pipe.Process(ctx, op.init)
		op.incr = pipe.IncrBy(ctx, cur, c.args[2+3*i].(int64))
	}
}

// incrVerdict is what an optimistic call's replies say is left to do.
type incrVerdict uint8

const (
	incrDone     incrVerdict = iota // nothing: the decision was admitted
	incrTakeBack                    // take back what was charged: a denial, or replies that did not all come
	incrScript                      // take back what was charged, then run counts
)

// judgeIncr reads c's replies into a counts reply (one count found per
// charge, -1 for each when a key holds no count), or the error of
// replies that did not come, and says what is left to do.
func (c *call) judgeIncr() (rep []any, v incrVerdict, err error) {
	fits, bad, script := true, false, false
	rep = make([]any, c.charges)
	for i := range c.ops {
		op := &c.ops[i]
		// A next window's key: a clock ahead started it, and counts
		// counts in it. One of another type (an error reply) is the
		// script's to report.
		if err := op.next.Err(); err != redis.Nil {
			if err != nil && !isReply(err) {
				return nil, incrTakeBack, err
			}
			script = true
		}
		if err := op.init.Err(); err != nil && err != redis.Nil && !isReply(err) {
			return nil, incrTakeBack, err
		}
		n, err := op.incr.Result()
		if err != nil && !isReply(err) {
			return nil, incrTakeBack, err
		}
		amount, cost := c.args[1+3*i].(uint64), c.args[2+3*i].(int64)
		found := n - cost
		if err != nil || found < 0 || found > limit.MaxCount {
			// WRONGTYPE, not an integer, an overflow, or a count counts
			// would not read.
			bad = true
			rep[i] = int64(-1)
			continue
		}
		rep[i] = found
		if uint64(cost) > amount || uint64(found) > amount-uint64(cost) {
			fits = false
		}
	}
	switch {
	case script:
		return nil, incrScript, nil
	case bad:
		for i := range rep {
			rep[i] = int64(-1)
		}
		return rep, incrTakeBack, nil
	case !fits:
		return rep, incrTakeBack, nil
	}
	return rep, incrDone, nil
}

// queueTakeBack queues on pipe the INCRBY of -cost on each key c's
// INCRBY charged.
func (c *call) queueTakeBack(ctx context.Context, pipe redis.Pipeliner) {
	for i := range c.ops {
		if c.ops[i].incr.Err() == nil {
			pipe.IncrBy(ctx, c.keys[2*i], -c.args[2+3*i].(int64))
		}
	}
}

// runIncr runs an optimistic call on c, alone: one pipeline, then, for a
// denial, one to take it back; a call judgeIncr sends to the script runs
// counts after its take-back.
func (a *applier) runIncr(ctx context.Context, c redis.UniversalClient, one *call) ([]any, error) {
	pipe := c.Pipeline()
	one.queueIncr(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	d := a.finishIncr(ctx, c, []*call{one})[0]
	return d.rep, d.err
}

// finishIncr ends calls whose commands ran: it takes back, in one
// pipeline, what the denied ones charged, and runs counts for those
// judgeIncr sends to it. It returns each call's outcome.
func (a *applier) finishIncr(ctx context.Context, c redis.UniversalClient, calls []*call) []detached {
	outs := make([]detached, len(calls))
	verdicts := make([]incrVerdict, len(calls))
	var pipe redis.Pipeliner
	for i, call := range calls {
		rep, v, err := call.judgeIncr()
		verdicts[i], outs[i] = v, detached{rep, err}
		// What a call whose replies did not all come charged, as far as
		// the replies say, is taken back too, as a denial's is.
		if v != incrDone {
			if pipe == nil {
				pipe = c.Pipeline()
			}
			call.queueTakeBack(ctx, pipe)
		}
	}
	if pipe != nil && pipe.Len() > 0 {
		takeBack(ctx, pipe)
	}
	for i, call := range calls {
		if verdicts[i] == incrScript {
			rep, err := a.run(ctx, c, call)
			outs[i] = detached{rep, err}
		}
		call.ops = nil
	}
	return outs
}

// takeBack sends pipe's take-back under ctx's values but not its end: a
// decision whose deadline comes while it is on its way is answered as
// judged, and the take-back still lands (bounded by the client's read
// and write timeouts), rather than leave its counts high for the rest of
// their windows. The caller waits for it, or for ctx. One that fails
// still leaves the counts high: refusing more, never admitting more.
func takeBack(ctx context.Context, pipe redis.Pipeliner) {
	run := func() { _, _ = pipe.Exec(context.WithoutCancel(ctx)) }
	if ctx.Done() == nil {
		run()
		return
	}
	done := make(chan struct{})
	go func() {
		run()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
