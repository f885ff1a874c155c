package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/breaker/breakertest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// replicas opens n Breakers on clients made by dial, each closed when the
// test ends: n replicas of the service on one Redis.
func replicas(tb testing.TB, n int, dial func() (redis.UniversalClient, error)) []breaker.Store {
	tb.Helper()
	rs := make([]breaker.Store, n)
	for i := range rs {
		c, err := dial()
		if err != nil {
			tb.Fatalf("NewClient: %v", err)
		}
		tb.Cleanup(func() { _ = c.Close() })
		rs[i] = NewBreakers(c)
	}
	return rs
}

func TestBreakersConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	breakertest.Run(t, func(tb testing.TB, n int) []breaker.Store {
		return replicas(tb, n, func() (redis.UniversalClient, error) { return NewClient(srv.URL()) })
	})
}

func TestBreakersConformanceCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + strings.Join(c.Addrs(), ",")
	breakertest.Run(t, func(tb testing.TB, n int) []breaker.Store {
		return replicas(tb, n, func() (redis.UniversalClient, error) { return NewClient(url) })
	})
}

// TestBreakersStoreShares: the Store's Breakers use its client, and a
// closed breaker's decision writes nothing.
func TestBreakersStoreShares(t *testing.T) {
	t.Parallel()
	s, raw := newSingle(t)
	ctx := context.Background()
	p := breaker.Params{FailureThreshold: 1, Window: time.Second, OpenFor: time.Second, HalfOpenProbes: 1, CloseAfter: 1, ProbeLease: time.Second}
	key := breaker.StoreKey("model", "gpt-4o")
	b := s.Breakers()
	if _, _, err := b.Allow(ctx, t0, key, p, breaker.NewProbeID()); err != nil {
		t.Fatal(err)
	}
	if n, err := raw.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("closed breaker's key exists: %d, %v", n, err)
	}
	if _, err := b.Record(ctx, t0, key, p, breaker.Report{}); err != nil {
		t.Fatal(err)
	}
	ttl, err := raw.PTTL(ctx, key).Result()
	if err != nil || ttl <= 0 {
		t.Fatalf("open breaker's key has TTL %v, %v", ttl, err)
	}
}
