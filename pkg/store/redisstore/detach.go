package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// slowFor is how long after a call missed its deadline the store keeps
// calls alive past their decisions' deadlines (see runFor).
const slowFor = 10 * time.Second

// detached is the outcome of a call that may outlive its decision.
type detached struct {
	rep []any
	err error
}

// runFor runs call for a decision made at now.
//
// A call whose context ends before Redis replies closes its connection:
// the reply may still come, and go-redis cannot tell it from the next
// one's. After a stall, or while Redis is slow, every decision in flight
// then loses its connection, and the next ones dial and shake hands in
// their own time, miss their deadline in turn and close theirs: a replica
// whose store is only somewhat slow stays degraded (issue 12). So once a
// call has missed its deadline, and for slowFor after the last one did,
// each call runs in a goroutine of its own, bounded by the client's read
// and write timeouts rather than by the decision: the decision stops
// waiting at its deadline as before, and the call reads its reply and
// gives its connection back to the pool. What Redis does is the same
// either way (a call sent is run, whether or not anyone waits for its
// reply); only the connection is kept. A store that answers in time pays
// nothing for it: one comparison with the decision's time.
//
// A batching store (WithBatch) runs its queued calls so: the batcher's
// pipelines never end with a decision. A call it lets run directly (an
// idle store: batcher.direct) runs as an unbatching store's does, and
// while calls outlive their decisions, every call is queued.
func (s *Store) runFor(ctx context.Context, now time.Time, call *call) ([]any, error) {
	fast := now.UnixNano() >= s.slowUntil.Load()
	if s.batch != nil {
		if !fast || !s.batch.direct() {
			return s.batch.do(ctx, call)
		}
		defer s.batch.release()
	}
	if fast {
		rep, err := s.run(ctx, call)
		if err != nil && missed(ctx, err) {
			s.slowUntil.Store(now.Add(slowFor).UnixNano())
		}
		return rep, err
	}
	done := make(chan detached, 1)
	go func() {
		rep, err := s.run(context.WithoutCancel(ctx), call)
		done <- detached{rep, err}
	}()
	select {
	case d := <-done:
		return d.rep, d.err
	case <-ctx.Done():
		s.slowUntil.Store(now.Add(slowFor).UnixNano())
		return nil, fmt.Errorf("run apply script: %w", ctx.Err())
	}
}

// missed reports whether a call failed for want of time: its context's
// deadline, or the socket's.
func missed(ctx context.Context, err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}
