package memstore

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// sharedSweep is how many other scopes (or cells) a write looks at for
// expired entries, so that state nobody writes any more is dropped too.
// Two per write drops it faster than one write can leave it behind.
const sharedSweep = 2

// Flights is the in-process limit.Flights: one replica's flights, for a
// deployment without Redis and for tests. The zero value is not usable;
// call NewFlights.
//
// Memory follows the live flights: a flight is dropped when it ends, or
// once it has expired, by the next Begin or End on its scope (at the
// caller's now) or by the sweep of sharedSweep other scopes that each
// Begin and End does; a scope with no flight left is dropped. So a store
// holds its live flights, plus the expired ones of scopes that no call
// has reached since, which every call shrinks.
type Flights struct {
	mu     sync.Mutex
	scopes map[string]*flightScope
}

var _ limit.Flights = (*Flights)(nil)

type flightScope struct {
	ids map[string]int64 // id -> expiry, Unix ms
	// min is at most the earliest expiry in ids: before it nothing has
	// expired, so a call skips the scan. Ends and renewals leave it low,
	// which costs one scan that sets it again.
	min int64
}

// NewFlights returns an empty Flights.
func NewFlights() *Flights { return &Flights{scopes: make(map[string]*flightScope)} }

// trim drops s's flights expired at ms.
func (s *flightScope) trim(ms int64) {
	if ms < s.min {
		return
	}
	s.min = math.MaxInt64
	for id, exp := range s.ids {
		if exp <= ms {
			delete(s.ids, id)
		} else {
			s.min = min(s.min, exp)
		}
	}
}

// live counts s's flights live at ms, changing nothing.
func (s *flightScope) live(ms int64) int64 {
	if ms < s.min {
		return int64(len(s.ids))
	}
	var n int64
	for _, exp := range s.ids {
		if exp > ms {
			n++
		}
	}
	return n
}

// settle trims scope name at ms, sweeps a few others, and returns how
// many flights name holds. Callers hold mu.
func (f *Flights) settle(name string, s *flightScope, ms int64) int64 {
	s.trim(ms)
	n := int64(len(s.ids))
	if n == 0 {
		delete(f.scopes, name)
	}
	i := 0
	for other, o := range f.scopes {
		if i == sharedSweep {
			break
		}
		i++
		o.trim(ms)
		if len(o.ids) == 0 {
			delete(f.scopes, other)
		}
	}
	return n
}

// Begin implements limit.Flights.
func (f *Flights) Begin(ctx context.Context, now time.Time, scope string, ids []string, lease time.Duration) (int64, error) {
	exp, err := limit.CheckFlights(now, scope, ids, lease, true)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return f.count(now, scope), nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.scopes[scope]
	if s == nil {
		s = &flightScope{ids: make(map[string]int64, len(ids)), min: math.MaxInt64}
		f.scopes[scope] = s
	}
	for _, id := range ids {
		s.ids[id] = exp
	}
	s.min = min(s.min, exp)
	return f.settle(scope, s, now.UnixMilli()), nil
}

// End implements limit.Flights.
func (f *Flights) End(ctx context.Context, now time.Time, scope string, ids []string) (int64, error) {
	if _, err := limit.CheckFlights(now, scope, ids, 0, false); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return f.count(now, scope), nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.scopes[scope]
	if s == nil {
		return 0, nil
	}
	for _, id := range ids {
		delete(s.ids, id)
	}
	return f.settle(scope, s, now.UnixMilli()), nil
}

// Count implements limit.Flights. It changes nothing, as a Redis read
// does not: an expired flight is not counted, and is dropped by the next
// write.
func (f *Flights) Count(ctx context.Context, now time.Time, scopes []string) ([]int64, error) {
	if err := limit.CheckScopes(scopes); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ms := now.UnixMilli()
	out := make([]int64, len(scopes))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, name := range scopes {
		if s := f.scopes[name]; s != nil {
			out[i] = s.live(ms)
		}
	}
	return out, nil
}

// count counts scope's live flights at now, changing nothing, as a
// Begin or End with no IDs does (redisstore sends those no script).
func (f *Flights) count(now time.Time, scope string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.scopes[scope]; s != nil {
		return s.live(now.UnixMilli())
	}
	return 0
}

// scopesHeld reports how many scopes f holds, for tests of its memory.
func (f *Flights) scopesHeld() (scopes, flights int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.scopes {
		flights += len(s.ids)
	}
	return len(f.scopes), flights
}
