package redisstore

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// runShared runs the three suites of the control loop's shared state on c.
func runShared(t *testing.T, c redis.UniversalClient) {
	t.Run("Flights", func(t *testing.T) {
		storetest.RunFlights(t, func(testing.TB) limit.Flights { return NewFlights(c) })
	})
	t.Run("Meters", func(t *testing.T) {
		storetest.RunMeters(t, func(testing.TB) limit.Meters { return NewMeters(c) })
	})
	t.Run("Cells", func(t *testing.T) {
		storetest.RunCells(t, func(testing.TB) limit.Cells { return NewCells(c) })
	})
}

func TestSharedConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("the shared-limit suite against one Redis: about 28 s")
	}
	t.Parallel()
	s, _ := newSingle(t)
	runShared(t, s.c)
}

func TestSharedConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the shared-limit suite against a cluster: about 26 s")
	}
	t.Parallel()
	runShared(t, newCluster(t).c)
}

// TestSharedKeys pins the key layout and the TTLs Redis keeps: each key
// outlives the latest thing it holds by sharedMargin, and goes when it
// holds nothing.
func TestSharedKeys(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_500)
	f, m, c := NewFlights(s.c), NewMeters(s.c), NewCells(s.c)

	fk := limit.FlightsKey("gpt-4o")
	if want := "tg:{" + limit.HashTag(fk) + "}:f:6:gpt-4o"; fk != want {
		t.Errorf("flightsKey = %q, want %q", fk, want)
	}
	if _, err := f.Begin(ctx, now, "gpt-4o", []string{"a"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// A later, shorter lease does not shorten the set's life.
	if _, err := f.Begin(ctx, now.Add(time.Second), "gpt-4o", []string{"b"}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	z, err := rc.ZRangeWithScores(ctx, fk, 0, -1).Result()
	if err != nil || len(z) != 2 || z[0].Member != "b" || z[0].Score != 1_700_000_003_500 || z[1].Member != "a" || z[1].Score != 1_700_000_010_500 {
		t.Errorf("flights set = %v, %v", z, err)
	}
	pttl := func(key string, lo, hi time.Duration) {
		t.Helper()
		if ttl := rc.PTTL(ctx, key).Val(); ttl <= lo || ttl > hi {
			t.Errorf("PTTL(%q) = %v, want in (%v, %v]", key, ttl, lo, hi)
		}
	}
	// Latest expiry 10.5s after now, read 1s later: 9.5s plus the margin.
	pttl(fk, 9*time.Second, 10500*time.Millisecond)
	if n, err := f.End(ctx, now, "gpt-4o", []string{"a", "b"}); err != nil || n != 0 {
		t.Fatalf("End = %d, %v", n, err)
	}
	if n := rc.Exists(ctx, fk).Val(); n != 0 {
		t.Errorf("the flights key outlived its last flight")
	}

	// 1_700_000_000_500 is in the 10s bucket starting at ..._000_000.
	if err := m.Add(ctx, now, "gpt-4o", 10*time.Second, 30*time.Second, map[string]int64{"ok": 3, "shed": 1}); err != nil {
		t.Fatal(err)
	}
	mk := limit.MeterKey("gpt-4o", 10_000, 1_700_000_000_000)
	if want := "tg:{" + limit.HashTag(mk) + "}:m:6:gpt-4o:10000:1700000000000"; mk != want {
		t.Errorf("meterKey = %q, want %q", mk, want)
	}
	h, err := rc.HGetAll(ctx, mk).Result()
	if err != nil || len(h) != 3 || h["ok"] != "3" || h["shed"] != "1" || h[""] != "1700000040000" {
		t.Errorf("meter bucket = %v, %v", h, err)
	}
	// Kept until the bucket's end (9.5s away) plus 30s, plus the margin.
	pttl(mk, 39*time.Second, 40500*time.Millisecond)
	// Every bucket of a scope is in its slot, and only the scope's.
	if a, b := limit.HashTag(mk), limit.HashTag(limit.MeterKey("gpt-4o", 1000, 0)); a != b {
		t.Errorf("buckets of one scope have tags %q and %q", a, b)
	}
	if a, b := limit.HashTag(mk), limit.HashTag(limit.MeterKey("gpt-4o-mini", 10_000, 1_700_000_000_000)); a == b {
		t.Errorf("two scopes share the tag %q", a)
	}

	if ok, v, err := c.Swap(ctx, now, "shed", 0, []byte("0.25"), 5*time.Second); err != nil || !ok || v != 1 {
		t.Fatalf("Swap = %v, %d, %v", ok, v, err)
	}
	ck := limit.CellKey("shed")
	h, err = rc.HGetAll(ctx, ck).Result()
	if err != nil || len(h) != 3 || h["v"] != "0.25" || h["n"] != "1" || h["e"] != "1700000005500" {
		t.Errorf("cell = %v, %v", h, err)
	}
	pttl(ck, 5*time.Second, 6*time.Second)
	// Kinds never share a key, whatever the scope.
	if limit.FlightsKey("x") == limit.CellKey("x") || limit.HashTag(limit.FlightsKey("x")) == limit.HashTag(limit.CellKey("x")) {
		t.Error("flights and cells keys of one name collide")
	}
	// A brace in a scope does not move the tag.
	if tag := limit.HashTag(limit.FlightsKey("a}b{c")); len(tag) != 16 {
		t.Errorf("tag of a scope with braces = %q", tag)
	}
}

// TestSharedCorrupt: a key changed behind the store's back is an error,
// not a wrong answer or a panic.
func TestSharedCorrupt(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	c := NewCells(s.c)
	tests := []struct {
		name string
		give map[string]any
	}{
		{name: "NoExpiry", give: map[string]any{"v": "x", "n": "1"}},
		{name: "BadVersion", give: map[string]any{"v": "x", "n": "one", "e": "1700000009000"}},
		{name: "ZeroVersion", give: map[string]any{"v": "x", "n": "0", "e": "1700000009000"}},
	}
	for _, tt := range tests {
		if err := rc.HSet(ctx, limit.CellKey(tt.name), tt.give).Err(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Load(ctx, now, tt.name); err == nil {
			t.Errorf("%s: Load = nil error", tt.name)
		}
	}
	if err := rc.Set(ctx, limit.FlightsKey("str"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFlights(s.c).Begin(ctx, now, "str", []string{"a"}, time.Second); err == nil {
		t.Error("Begin on a string key = nil error")
	}
	m := NewMeters(s.c)
	if err := rc.HSet(ctx, limit.MeterKey("bad", 1000, 1_700_000_000_000), "", "1700000009000", "n", "lots").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Sum(ctx, now, "bad", time.Second, 0, true); err == nil {
		t.Error("Sum over a bad count = nil error")
	}
}

// TestSharedHungRedis: a Redis that accepts and never answers holds no
// call past its caller's deadline (the client bounds every call by its
// context, not only by its read timeout, which is set far out here).
func TestSharedHungRedis(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); conns.Wait() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				_, _ = io.Copy(io.Discard, c) // until the client closes it
				_ = c.Close()
			})
		}
	}()
	c, err := NewClient("redis://" + l.Addr().String() + "?read_timeout=1m&write_timeout=1m&dial_timeout=1m&min_idle_conns=0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	f, m, cells := NewFlights(c), NewMeters(c), NewCells(c)
	now := time.UnixMilli(1_700_000_000_000)
	tests := []struct {
		name string
		give func(ctx context.Context) error
	}{
		{name: "Begin", give: func(ctx context.Context) error {
			_, err := f.Begin(ctx, now, "m", []string{"a"}, time.Second)
			return err
		}},
		{name: "End", give: func(ctx context.Context) error { _, err := f.End(ctx, now, "m", []string{"a"}); return err }},
		{name: "Count", give: func(ctx context.Context) error { _, err := f.Count(ctx, now, []string{"m", "n"}); return err }},
		{name: "Add", give: func(ctx context.Context) error {
			return m.Add(ctx, now, "m", time.Second, time.Second, map[string]int64{"a": 1})
		}},
		{name: "Sum", give: func(ctx context.Context) error { _, err := m.Sum(ctx, now, "m", time.Second, 5, true); return err }},
		{name: "Load", give: func(ctx context.Context) error { _, _, err := cells.Load(ctx, now, "k"); return err }},
		{name: "Swap", give: func(ctx context.Context) error {
			_, _, err := cells.Swap(ctx, now, "k", 0, []byte("v"), time.Second)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := tt.give(ctx)
			// Generous: the point is 50ms against a minute, on a busy machine.
			if took := time.Since(start); err == nil || took > 10*time.Second {
				t.Errorf("%s on a hung Redis = %v after %v; want an error near 50ms", tt.name, err, took)
			}
		})
	}
}
