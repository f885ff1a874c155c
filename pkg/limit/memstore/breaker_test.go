package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/breaker/breakertest"
)

func TestBreakersConformance(t *testing.T) {
	t.Parallel()
	breakertest.Run(t, func(_ testing.TB, n int) []breaker.Store {
		b := NewBreakers()
		rs := make([]breaker.Store, n)
		for i := range rs {
			rs[i] = b
		}
		return rs
	})
}

// TestBreakersForget: closed breakers without failures hold no memory,
// and others go once they are equivalent to fresh ones.
func TestBreakersForget(t *testing.T) {
	t.Parallel()
	b := NewBreakers()
	ctx := context.Background()
	p := breaker.Params{FailureThreshold: 2, Window: time.Second, OpenFor: time.Second, HalfOpenProbes: 1, CloseAfter: 1, ProbeLease: time.Second}
	now := time.UnixMilli(1_700_000_000_000)
	for i := range 100 {
		key := breaker.StoreKey("model", string(rune('a'+i)))
		if _, _, err := b.Allow(ctx, now, key, p, breaker.NewProbeID()); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Record(ctx, now, key, p, true, ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.Len(); n != 0 {
		t.Fatalf("%d closed breakers held, want 0", n)
	}
	key := breaker.StoreKey("model", "x")
	if _, err := b.Record(ctx, now, key, p, false, ""); err != nil {
		t.Fatal(err)
	}
	if n := b.Len(); n != 1 {
		t.Fatalf("%d breakers held after a failure, want 1", n)
	}
	if _, err := b.State(ctx, now.Add(time.Second), key, p); err != nil {
		t.Fatal(err)
	}
	if n := b.Len(); n != 0 {
		t.Fatalf("%d breakers held after the failure aged out, want 0", n)
	}
}

func BenchmarkBreakersAllowClosed(b *testing.B) {
	s := NewBreakers()
	ctx := context.Background()
	p := breaker.Params{FailureThreshold: 2, Window: time.Second, OpenFor: time.Second, HalfOpenProbes: 1, CloseAfter: 1, ProbeLease: time.Second}
	key := breaker.StoreKey("model", "gpt-4o")
	now := time.UnixMilli(1_700_000_000_000)
	id := breaker.NewProbeID()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.Allow(ctx, now, key, p, id); err != nil {
			b.Fatal(err)
		}
	}
}
