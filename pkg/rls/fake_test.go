package rls

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// countStore is a small fixed-window Store for adapter tests: it keeps the
// Store contract's all-or-nothing rule and reports ResetAfter as the time
// to the end of the epoch-aligned window; RetryAfter, on a denial, is a
// distinct value (a quarter of the window) so tests can tell them apart.
type countStore struct {
	mu     sync.Mutex
	counts map[string]int64
	err    error
}

var _ limit.Store = (*countStore)(nil)

func newCountStore() *countStore { return &countStore{counts: map[string]int64{}} }

func (s *countStore) Apply(_ context.Context, now time.Time, cs []limit.Charge, res []limit.Result) (bool, error) {
	if s.err != nil {
		return false, s.err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string]int64{}
	used := func(k string) int64 {
		if v, ok := next[k]; ok {
			return v
		}
		return s.counts[k]
	}
	admitted := true
	fits := make([]bool, len(cs))
	for i, c := range cs {
		u := used(c.Key)
		switch {
		case c.Cost < 0:
			fits[i] = true
		case c.Cost == 0:
			fits[i] = u < int64(c.Amount)
		default:
			fits[i] = u+c.Cost <= int64(c.Amount)
			if fits[i] {
				next[c.Key] = u + c.Cost
			}
		}
		if !fits[i] && !c.Shadow {
			admitted = false
		}
	}
	for i, c := range cs {
		if c.Cost < 0 || (admitted && fits[i]) {
			s.counts[c.Key] = max(0, s.counts[c.Key]+c.Cost)
		}
	}
	for i, c := range cs {
		w := c.Window
		reset := w - time.Duration(now.UnixNano()%int64(w))
		rem := int64(c.Amount) - s.counts[c.Key]
		res[i] = limit.Result{Fits: fits[i], Remaining: uint64(max(0, rem)), ResetAfter: reset}
		if !fits[i] {
			res[i].RetryAfter = w / 4
		}
	}
	return admitted, nil
}

// fixedClock is a clock that does not move.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }
