package memstore

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Meters is the in-process limit.Meters. The zero value is not usable;
// call NewMeters.
//
// A bucket is counted by Sum until its end plus the longest keep any Add
// gave it, exactly, as redisstore's are. Memory follows the buckets kept:
// an Add drops its scope's buckets past their keep, and sweeps
// sharedSweep other scopes the same way; a scope with no bucket left is
// dropped.
type Meters struct {
	mu     sync.Mutex
	scopes map[string]map[bucketID]*meterBucket
}

var _ limit.Meters = (*Meters)(nil)

// bucketID names a bucket: scopes may be read with several widths.
type bucketID struct{ width, start int64 }

type meterBucket struct {
	until  int64 // Unix ms from which the bucket is dropped
	counts map[string]int64
}

// NewMeters returns empty Meters.
func NewMeters() *Meters { return &Meters{scopes: make(map[string]map[bucketID]*meterBucket)} }

// Add implements limit.Meters. A name whose count would pass the int64
// range fails the whole call, which then changes nothing.
func (m *Meters) Add(ctx context.Context, now time.Time, scope string, bucket, keep time.Duration, counts map[string]int64) error {
	width, start, until, err := limit.CheckMeterAdd(now, scope, bucket, keep, counts)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !anyCount(counts) {
		return nil
	}
	ms := now.UnixMilli()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.scopes[scope]
	if s == nil {
		s = make(map[bucketID]*meterBucket)
		m.scopes[scope] = s
	}
	id := bucketID{width, start}
	b := s[id]
	if b == nil {
		b = &meterBucket{counts: make(map[string]int64, len(counts))}
		s[id] = b
	}
	for name, n := range counts {
		if b.counts[name] > math.MaxInt64-n {
			return fmt.Errorf("meters scope %q: name %q: count overflows", scope, name)
		}
	}
	for name, n := range counts {
		if n > 0 {
			b.counts[name] += n
		}
	}
	b.until = max(b.until, until)
	trimMeters(m.scopes, scope, s, ms)
	i := 0
	for other, o := range m.scopes {
		if i == sharedSweep {
			break
		}
		i++
		trimMeters(m.scopes, other, o, ms)
	}
	return nil
}

// anyCount reports whether counts adds anything: a zero count writes
// nothing, so that Sum leaves out names with no counts.
func anyCount(counts map[string]int64) bool {
	for _, n := range counts {
		if n > 0 {
			return true
		}
	}
	return false
}

// trimMeters drops scope's buckets past their keep at ms, and the scope
// when none is left.
func trimMeters(scopes map[string]map[bucketID]*meterBucket, scope string, s map[bucketID]*meterBucket, ms int64) {
	for id, b := range s {
		if b.until <= ms {
			delete(s, id)
		}
	}
	if len(s) == 0 {
		delete(scopes, scope)
	}
}

// Sum implements limit.Meters.
func (m *Meters) Sum(ctx context.Context, now time.Time, scope string, bucket time.Duration, n int, partial bool) (map[string]int64, error) {
	width, err := limit.CheckMeterSum(scope, bucket, n)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ms := now.UnixMilli()
	cur := limit.BucketStart(ms, width)
	last := cur - width
	if partial {
		last = cur
	}
	out := make(map[string]int64)
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.scopes[scope]
	if s == nil {
		return out, nil
	}
	for start := cur - int64(n)*width; start <= last; start += width {
		b := s[bucketID{width, start}]
		if b == nil || b.until <= ms {
			continue
		}
		for name, c := range b.counts {
			out[name] += c
		}
	}
	return out, nil
}

// held reports how many scopes and buckets m holds, for tests of its
// memory.
func (m *Meters) held() (scopes, buckets int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.scopes {
		buckets += len(s)
	}
	return len(m.scopes), buckets
}
