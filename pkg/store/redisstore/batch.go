package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// BatchWorkers is how many pipelines a batching store has in flight at
// once (see WithBatch). Redis runs one command at a time: a second
// pipeline fills while the first one's replies travel back and are read.
// More only split the queue into smaller batches: at c=50 on one box, one
// worker sent 13 decisions a call, two 8, four 5, and Redis's and the
// server's CPU per decision and the p99 rose in that order
// (docs/benchmarks.md). One would serialise the round trips: at most
// WithBatch's n decisions per round trip, a ceiling with a distant Redis.
const BatchWorkers = 2

// StoreOption configures New.
type StoreOption func(*Store)

// WithBatch has concurrent decisions share round trips: up to n calls of
// apply.lua go to Redis as one pipeline, one write of n FCALLs and one
// read of their n replies. Much of a small command's cost to Redis is
// reading and writing the socket, which a pipeline pays once for all its
// calls. Every call is still one FCALL, atomic on its own: the pipeline
// shares the round trip, not the script run (Redis may run other clients'
// commands between two calls of a pipeline).
//
// The batching is natural: BatchWorkers goroutines each take the first
// queued call and whatever else is queued, up to n, and send them at once.
// A busy store sends larger pipelines. An idle one hands nothing over: a
// call that finds nothing queued and nothing in flight runs at once on its
// caller's goroutine, as without batching (batcher.direct). The hand-off
// to a worker and back is two goroutine wake-ups, which on a loaded 2-core
// box added up to 5 ms to a decision arriving after an idle spell, enough
// to miss the 15 ms store timeout (TestServeQueue failed 14 times in 60
// runs so, 1 without).
// n <= 1 turns batching off (the default), as does a cluster client,
// whose decisions keep the path they had.
func WithBatch(n int) StoreOption {
	return func(s *Store) { s.batchSize = n }
}

// WithBatchWait has a batching store's worker, once it took a queued
// call, wait up to d for more (up to WithBatch's n) before it sends them:
// fewer, larger calls at moderate load, where concurrent decisions rarely
// find each other queued, for up to d more latency a decision. One worker
// gathers at a time. A call that finds the store idle is still sent at
// once (batcher.direct), so a quiet store waits for nothing. 0, the
// default, sends what is queued at once; without WithBatch it does
// nothing.
func WithBatchWait(d time.Duration) StoreOption {
	return func(s *Store) { s.batchWait = max(d, 0) }
}

// Batch is the most calls the store sends in one pipeline: WithBatch's,
// 0 when it does not batch.
func (s *Store) Batch() int {
	if s.batch == nil {
		return 0
	}
	return s.batch.max
}

// BatchWait is WithBatchWait's wait, 0 when the store does not batch.
func (s *Store) BatchWait() time.Duration {
	if s.batch == nil {
		return 0
	}
	return s.batch.wait
}

// batcher sends the calls queued by Store.run in pipelines.
//
// A caller waits for its own reply or its context, whichever comes first;
// the pipeline runs on without it, under a context without cancel,
// bounded by the client's read and write timeouts. So a caller that gives
// up never closes a connection other calls share (see runFor), and what
// Redis does is the same as without batching: a call sent is run.
type batcher struct {
	c     redis.UniversalClient
	apply *applier
	max   int
	// wait is WithBatchWait's; gather is held by the worker that waits.
	wait   time.Duration
	gather sync.Mutex
	queue  chan *pending
	// senders counts the pipelines and the lone calls in flight (direct).
	senders atomic.Int32
	// stop is closed by close; done once the workers have ended and the
	// queue has been emptied.
	stop, done chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// pending is one queued call and where its outcome goes.
type pending struct {
	// ctx is the caller's; what the batcher does with it goes through
	// context.WithoutCancel, once a batch (send).
	ctx  context.Context
	call *call
	out  chan detached // buffered: the worker never waits for the caller
}

// outs recycles pending.out: a channel whose one outcome its caller
// received is empty and has no sender left. One that a caller gave up on
// may still be sent to, and is left to the collector.
var outs = sync.Pool{New: func() any { return make(chan detached, 1) }}

func newBatcher(c redis.UniversalClient, apply *applier, n int, wait time.Duration) *batcher {
	b := &batcher{
		c:     c,
		apply: apply,
		max:   n,
		wait:  wait,
		queue: make(chan *pending, BatchWorkers*n),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	b.wg.Add(BatchWorkers)
	for range BatchWorkers {
		go b.work()
	}
	return b
}

// errClosed is the error of a call made on, or still queued at, a closed
// store.
var errClosed = fmt.Errorf("run apply script: %w", redis.ErrClosed)

// do queues call and waits for its reply or for ctx.
func (b *batcher) do(ctx context.Context, call *call) ([]any, error) {
	p := &call.pend
	p.ctx, p.call = ctx, call
	p.out = outs.Get().(chan detached) //nolint:forcetypeassert // outs holds nothing else
	select {
	case b.queue <- p:
	case <-b.stop:
		outs.Put(p.out) // never queued: nothing sends to it
		return nil, errClosed
	case <-ctx.Done():
		outs.Put(p.out)
		return nil, fmt.Errorf("run apply script: %w", ctx.Err())
	}
	// Queued before close began, a worker or close's drain answers it, so
	// done need not be waited on: a nil channel is a case select skips
	// (one channel fewer to lock).
	var done chan struct{}
	select {
	case <-b.stop:
		done = b.done
	default:
	}
	select {
	case d := <-p.out:
		outs.Put(p.out)
		return d.rep, d.err
	case <-ctx.Done():
		return nil, fmt.Errorf("run apply script: %w", ctx.Err())
	case <-done:
		// Queued as the store closed: the workers may have sent it
		// before they stopped, or left it.
		select {
		case d := <-p.out:
			return d.rep, d.err
		default:
			return nil, errClosed
		}
	}
}

// direct reports whether a call may run on its caller's goroutine, not
// queued: the store is idle (nothing queued, no pipeline or lone call in
// flight) and open. It then counts the call as in flight until release.
// Queued, the call would go out alone anyway; run directly, it saves a
// worker's two wake-ups. Only a wholly idle store does this: allowing a
// lone call beside a pipeline in flight (up to BatchWorkers) merged fewer
// calls at c=50 (2.17 Redis commands a decision against 2.13) and cost
// Redis 0.2-0.7 µs and the server 1-3 µs more a decision.
func (b *batcher) direct() bool {
	if len(b.queue) > 0 {
		return false
	}
	if b.senders.Add(1) > 1 {
		b.senders.Add(-1)
		return false
	}
	select {
	case <-b.stop:
		b.senders.Add(-1)
		return false // do answers errClosed
	default:
		return true
	}
}

// release ends a call direct let run.
func (b *batcher) release() { b.senders.Add(-1) }

// work sends batches until the store closes.
func (b *batcher) work() {
	defer b.wg.Done()
	batch := make([]*pending, 0, b.max)
	cmds := make([]*redis.Cmd, 0, b.max)
	var m, p merged
	var timer *time.Timer
	if b.wait > 0 {
		timer = time.NewTimer(b.wait)
		timer.Stop()
	}
	for {
		var ok bool
		if batch, ok = b.take(batch[:0], timer); !ok {
			return
		}
		cmds = b.send(batch, cmds[:0], &m, &p)
		b.senders.Add(-1)
		clear(batch)
		clear(cmds)
		m.reset()
		p.reset()
	}
}

// take waits for the first queued call and returns it with what else is
// queued, up to max, having waited up to b.wait for more (timer, nil
// when b.wait is 0); false once the store closes. The batch counts as a
// sender from its first call on, so that calls queue behind a gathering
// worker rather than run directly.
func (b *batcher) take(batch []*pending, timer *time.Timer) ([]*pending, bool) {
	if timer != nil {
		b.gather.Lock()
		defer b.gather.Unlock()
	}
	select {
	case <-b.stop:
		return batch, false
	case p := <-b.queue:
		batch = append(batch, p)
	}
	b.senders.Add(1)
	if timer != nil {
		timer.Reset(b.wait)
		defer timer.Stop()
		for len(batch) < b.max {
			select {
			case p := <-b.queue:
				batch = append(batch, p)
			case <-timer.C:
				return batch, true
			case <-b.stop:
				return batch, true // sent: close waits for the workers
			}
		}
		return batch, true
	}
	for len(batch) < b.max {
		select {
		case p := <-b.queue:
			batch = append(batch, p)
		default:
			return batch, true
		}
	}
	return batch, true
}

// merged is the one call a batch's counts calls, or its plains calls,
// make (call.fn): their keys and arguments end to end, and the calls in
// order. The function runs the decisions one after another, each all or
// nothing, and its reply is theirs end to end. A worker reuses its
// merged from batch to batch.
type merged struct {
	keys  []string
	args  []any
	calls []*pending
}

func (m *merged) reset() {
	clear(m.keys)
	clear(m.args)
	clear(m.calls)
	m.keys, m.args, m.calls = m.keys[:0], m.args[:0], m.calls[:0]
}

// send runs batch as one pipeline, even a batch of one (one code path;
// the same round trip as a lone FCALL), and hands each call its outcome:
// the counts calls as one FCALL of counts, the plains calls as one of
// plains, an optimistic call (WithOptimisticFixed) as its plain commands,
// each other call as its own FCALL. The optimistic calls that must be
// taken back share one more pipeline (finishIncr). A call the server did
// not run for want of the code (retryable) runs again alone, through
// applier.run, which loads it.
func (b *batcher) send(batch []*pending, cmds []*redis.Cmd, m, pl *merged) []*redis.Cmd {
	// No call's deadline bounds the pipeline: the client's read and
	// write timeouts do. The first caller's values (a trace) go with it.
	ctx := context.WithoutCancel(batch[0].ctx)
	pipe := b.c.Pipeline()
	var incr []*pending
	for _, p := range batch {
		switch {
		case p.call.incr:
			p.call.queueIncr(ctx, pipe)
			incr = append(incr, p)
		case p.call.fn == fnCounts:
			m.add(p)
		case p.call.fn == fnPlains:
			pl.add(p)
		default:
			cmds = append(cmds, b.apply.cmd(ctx, pipe, p.call))
		}
	}
	counts := m.cmd(ctx, pipe, b.apply, fnCounts)
	plains := pl.cmd(ctx, pipe, b.apply, fnPlains)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if len(incr) > 0 {
		calls := make([]*call, len(incr))
		for i, p := range incr {
			calls[i] = p.call
		}
		for i, d := range b.apply.finishIncr(ctx, b.c, calls) {
			incr[i].out <- b.outcome(d.rep, d.err)
		}
	}
	i := 0
	for _, p := range batch {
		if p.call.fn != fnApply {
			continue
		}
		cmd := cmds[i]
		i++
		if retryable(cmd.Err()) {
			p.out <- b.outcome(b.apply.run(ctx, b.c, p.call))
			continue
		}
		p.out <- b.outcome(cmd.Slice())
	}
	if counts != nil {
		b.split(ctx, counts, m.calls)
	}
	if plains != nil {
		b.split(ctx, plains, pl.calls)
	}
	return cmds
}

func (m *merged) add(p *pending) {
	m.calls = append(m.calls, p)
	m.keys = append(m.keys, p.call.keys...)
	m.args = append(m.args, p.call.args...)
}

// cmd queues m's one call of fn on pipe; nil when m is empty.
func (m *merged) cmd(ctx context.Context, pipe redis.Pipeliner, a *applier, fn fnKind) *redis.Cmd {
	if len(m.calls) == 0 {
		return nil
	}
	return a.cmdKA(ctx, pipe, fn, m.keys, m.args)
}

// split hands each call of a merged call its part of the reply: for
// counts one value per charge; for plains apply's 1 + 4 per charge, or
// -1 and an error for a decision that failed.
func (b *batcher) split(ctx context.Context, cmd *redis.Cmd, calls []*pending) {
	rep, err := cmd.Slice()
	if retryable(err) {
		for _, p := range calls {
			p.out <- b.outcome(b.apply.run(ctx, b.c, p.call))
		}
		return
	}
	for _, p := range calls {
		if err != nil {
			p.out <- b.outcome(nil, err)
			continue
		}
		n := p.call.charges
		if p.call.fn == fnPlains {
			if n = 1 + repPerCharge*n; len(rep) >= 2 {
				if v, _ := integer(rep[0]); v == -1 {
					n = 2
				}
			}
		}
		if len(rep) < n {
			err = malformed("%d values for a batch of %d calls", len(rep), len(calls))
			p.out <- b.outcome(nil, err)
			continue
		}
		p.out <- b.outcome(rep[:n:n], nil)
		rep = rep[n:]
	}
}

func (b *batcher) outcome(rep []any, err error) detached {
	if err != nil {
		return detached{nil, fmt.Errorf("run apply script: %w", err)}
	}
	return detached{rep, nil}
}

// close stops the workers once their pipelines in flight are answered,
// and fails the calls still queued.
func (b *batcher) close() {
	b.closeOnce.Do(func() {
		close(b.stop)
		b.wg.Wait()
		for {
			select {
			case p := <-b.queue:
				p.out <- detached{nil, errClosed}
			default:
				close(b.done)
				return
			}
		}
	})
}
