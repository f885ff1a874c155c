package memstore

import (
	"context"
	"strconv"
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
		if _, err := b.Record(ctx, now, key, p, breaker.Report{Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.Len(); n != 0 {
		t.Fatalf("%d closed breakers held, want 0", n)
	}
	key := breaker.StoreKey("model", "x")
	if _, err := b.Record(ctx, now, key, p, breaker.Report{}); err != nil {
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

// TestBreakersOncesSwept: failure markers past their TTL are dropped as
// new ones are set, so that their number follows the failures of the
// last OnceTTL, not of all time.
func TestBreakersOncesSwept(t *testing.T) {
	t.Parallel()
	b := NewBreakers()
	ctx := context.Background()
	p := breaker.Params{FailureThreshold: 1 << 20, Window: time.Second, OpenFor: time.Second, HalfOpenProbes: 1, CloseAfter: 1, ProbeLease: time.Second}
	key := breaker.StoreKey("model", "m")
	now := time.UnixMilli(1_700_000_000_000)
	fail := func(at time.Time, n int, prefix string) {
		for i := range n {
			if _, err := b.Record(ctx, at, key, p, breaker.Report{Once: prefix + strconv.Itoa(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	fail(now, 1000, "a")
	if n := b.Onces(); n != 1000 {
		t.Fatalf("%d markers, want 1000", n)
	}
	fail(now.Add(breaker.OnceTTL(p)), 1000, "b")
	if n := b.Onces(); n >= 1500 {
		t.Fatalf("%d markers after 1000 more past the first ones' TTL, want the expired ones mostly swept", n)
	}
}
