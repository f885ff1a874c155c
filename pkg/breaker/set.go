package breaker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Set is the admission.Breakers of a process: each domain's Breakers by key,
// swapped whole on a rules reload.
//
// A breaker's store key is its descriptor key and value (StoreKey), not
// its domain: two domains that declare a breaker on the same key share
// the state of each upstream, which is what a breaker is about, so they
// should declare the same thresholds.
type Set struct {
	m atomic.Pointer[map[setKey]*Breaker]
}

type setKey struct{ domain, key string }

// NewSet returns an empty Set: every upstream allowed until Set.Replace.
func NewSet() *Set {
	s := &Set{}
	m := map[setKey]*Breaker{}
	s.m.Store(&m)
	return s
}

// SetEntry places a Breaker: Domain's breaker on Breaker.Config().Key.
type SetEntry struct {
	Domain  string
	Breaker *Breaker
}

// Replace swaps every entry at once; decisions in flight finish on the
// old ones.
func (s *Set) Replace(entries ...SetEntry) {
	m := make(map[setKey]*Breaker, len(entries))
	for _, e := range entries {
		if e.Breaker != nil {
			m[setKey{e.Domain, e.Breaker.Config().Key}] = e.Breaker
		}
	}
	s.m.Store(&m)
}

// Breakers lists the Breakers held, for /debug and metrics.
func (s *Set) Breakers() []*Breaker {
	m := *s.m.Load()
	out := make([]*Breaker, 0, len(m))
	for _, b := range m {
		out = append(out, b)
	}
	return out
}

// Allow implements admission.Breakers. A domain or key the Set has no
// Breaker for is allowed.
func (s *Set) Allow(ctx context.Context, now time.Time, domain, key, name string) (limit.BreakerVerdict, error) {
	b := (*s.m.Load())[setKey{domain, key}]
	if b == nil {
		return limit.BreakerVerdict{Allowed: true}, nil
	}
	v, err := b.Allow(ctx, now, name)
	if err != nil {
		return limit.BreakerVerdict{}, err
	}
	return limit.BreakerVerdict{Allowed: v.Allowed, ProbeID: v.ProbeID, RetryAfter: v.RetryAfter}, nil
}

// Release implements admission.Breakers.
func (s *Set) Release(ctx context.Context, now time.Time, domain, key, name, probeID string) error {
	b := (*s.m.Load())[setKey{domain, key}]
	if b == nil {
		return fmt.Errorf("breaker %s in domain %q: not configured", key, domain)
	}
	return b.Release(ctx, now, name, probeID)
}
