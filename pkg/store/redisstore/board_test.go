package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestBoardConformance(t *testing.T) {
	t.Parallel()
	s, _ := newSingle(t)
	storetest.RunBoard(t, func(testing.TB) limit.Board { return NewBoard(s.c) })
}

func TestBoardConformanceCluster(t *testing.T) {
	t.Parallel()
	s := newCluster(t)
	storetest.RunBoard(t, func(testing.TB) limit.Board { return NewBoard(s.c) })
}

// TestBoardKeys pins the key layout, the TTLs Redis keeps, and a pushed
// score written by an outside controller with a plain SET.
func TestBoardKeys(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	b := NewBoard(s.c)
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	if err := b.Publish(ctx, now, "global", "r1", 0.5, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, now, "global", "r2", 0.25, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	m, err := rc.HGetAll(ctx, "tg:{pressure}:global").Result()
	if err != nil {
		t.Fatal(err)
	}
	if m["r1"] != "0.5:1700000010000" || m["r2"] != "0.25:1700000002000" {
		t.Errorf("hash = %v", m)
	}
	// The hash lives until its latest entry expires, plus the margin.
	if ttl := rc.PTTL(ctx, "tg:{pressure}:global").Val(); ttl <= 10*time.Second || ttl > 11*time.Second {
		t.Errorf("hash PTTL = %v, want in (10s, 11s]", ttl)
	}
	// A later publish drops the entries expired by its now.
	if err := b.Publish(ctx, now.Add(5*time.Second), "global", "r1", 0.5, time.Second); err != nil {
		t.Fatal(err)
	}
	if n := rc.HLen(ctx, "tg:{pressure}:global").Val(); n != 1 {
		t.Errorf("HLEN after expiry = %d, want 1", n)
	}
	if err := b.Push(ctx, now, "global", 0.85, time.Minute); err != nil {
		t.Fatal(err)
	}
	if v := rc.Get(ctx, "tg:{pressure}pushed:global").Val(); v != "0.85:1700000060000" {
		t.Errorf("pushed value = %q", v)
	}
	if ttl := rc.PTTL(ctx, "tg:{pressure}pushed:global").Val(); ttl <= time.Minute || ttl > time.Minute+time.Second {
		t.Errorf("pushed PTTL = %v", ttl)
	}
	// An outside controller writes a bare score; the key's TTL is its life.
	if err := rc.Set(ctx, "tg:{pressure}pushed:gpt-4o", "0.9", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := b.Scores(ctx, now, "gpt-4o")
	if err != nil || !got.HasPushed || got.Pushed != 0.9 {
		t.Errorf("Scores(gpt-4o) = %+v, %v; want pushed 0.9", got, err)
	}
	for _, bad := range []string{"high", "1.5", "NaN", "0.5:soon"} {
		if err := rc.Set(ctx, "tg:{pressure}pushed:bad", bad, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Scores(ctx, now, "bad"); err == nil {
			t.Errorf("Scores with pushed %q = nil error", bad)
		}
	}
}
