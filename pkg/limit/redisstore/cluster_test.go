package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestSlot pins the slot function to Redis's own CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	t.Parallel()
	// CLUSTER KEYSLOT answers in cluster mode only.
	c := redistest.StartCluster(t, 1).Client(t)
	ctx := context.Background()
	keys := []string{"", "a", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{", "}{", "x{ab}"}
	for i := range 50 {
		keys = append(keys, key(limit.SlidingWindow, time.Minute, fmt.Sprint(i)))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := slot(k); int64(got) != want {
			t.Errorf("slot(%q) = %d, want %d", k, got, want)
		}
	}
}

// TestClusterMatchesMemstore runs random decisions that span slots against
// memstore. With no other decision in between, the compensation is exact,
// so the results agree to the millisecond.
func TestClusterMatchesMemstore(t *testing.T) {
	t.Parallel()
	s := newCluster(t)
	if n := compare(t, s, 4, 800, true); n < 50 {
		t.Fatalf("only %d decisions needed a compensation; the schedule does not test it", n)
	}
}

func TestClusterDenialLeavesOtherSlotsUncharged(t *testing.T) {
	t.Parallel()
	s := newCluster(t)
	ctx := context.Background()
	raw := s.cluster
	// Three descriptor families, so three hash tags in three slots.
	a := limit.Charge{Key: key(limit.SlidingWindow, time.Hour, "a"), Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Hour}
	b := limit.Charge{Key: key(limit.TokenBucket, time.Hour, "b"), Algorithm: limit.TokenBucket, Amount: 6, Burst: 1, Window: time.Hour}
	c := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "c"), Algorithm: limit.FixedWindow, Amount: 2, Window: time.Hour}
	for _, x := range [][2]limit.Charge{{a, b}, {a, c}, {b, c}} {
		if slot(x[0].Key) == slot(x[1].Key) {
			t.Fatalf("%s and %s share a slot", x[0].Key, x[1].Key)
		}
	}
	with := func(c limit.Charge, cost int64) limit.Charge { c.Cost = cost; return c }

	// Some state first, so that the compensation must restore it rather
	// than delete it.
	if ok, _ := apply(t, s, t0, with(a, 3), with(b, 0), with(c, 2)); !ok {
		t.Fatal("first decision denied")
	}
	snapshot := func() map[string]string {
		out := map[string]string{}
		for _, k := range []string{a.Key, c.Key} {
			h, err := raw.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			out[k] = fmt.Sprint(h)
		}
		v, err := raw.Get(ctx, b.Key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		out[b.Key] = v
		return out
	}
	before := snapshot()

	now := t0.Add(time.Minute)
	// a and b fit on their slots; c is full, so nothing may be kept.
	for _, order := range [][]limit.Charge{
		{with(a, 4), with(b, 1), with(c, 1)},
		{with(c, 1), with(b, 1), with(a, 4)},
		{with(a, 4), with(b, 1), with(a, 2), with(c, 1)},
	} {
		ok, res := apply(t, s, now, order...)
		if ok {
			t.Fatalf("admitted past c's limit: %+v", res)
		}
		for i, ch := range order {
			if ch.Key == c.Key {
				if res[i].Fits {
					t.Errorf("res[%d] for c fits", i)
				}
				continue
			}
			if !res[i].Fits {
				t.Errorf("res[%d] for %s does not fit: %+v", i, ch.Key, res[i])
			}
		}
		if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("a denied decision changed the other slots:\nbefore %v\nafter  %v", before, after)
		}
		// And the results say so: a has 7 left, b its whole burst of 1.
		for i, ch := range order {
			switch ch.Key {
			case a.Key:
				if res[i].Remaining != 7 {
					t.Errorf("a: Remaining = %d, want 7", res[i].Remaining)
				}
			case b.Key:
				if res[i].Remaining != 1 || res[i].ResetAfter != 0 {
					t.Errorf("b: %+v, want Remaining 1, ResetAfter 0", res[i])
				}
			}
		}
	}

	// A slot that fails (its key holds a string) fails the decision, and
	// the other slots keep nothing either.
	bad := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "bad"), Algorithm: limit.FixedWindow, Amount: 9, Window: time.Hour, Cost: 1}
	if slot(bad.Key) == slot(a.Key) || slot(bad.Key) == slot(b.Key) {
		t.Fatal("the bad key shares a slot")
	}
	if err := raw.Set(ctx, bad.Key, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Apply(ctx, now, []limit.Charge{with(a, 1), with(b, 1), bad}, make([]limit.Result, 3)); err == nil || ok {
		t.Fatalf("Apply with a broken slot = %v, %v; want an error", ok, err)
	}
	if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a failed decision changed the other slots:\nbefore %v\nafter  %v", before, after)
	}

	// After SCRIPT FLUSH the per-slot calls load the script again.
	err := raw.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() })
	if err != nil {
		t.Fatal(err)
	}

	// A decision that fits everywhere keeps every charge.
	later := t0.Add(2 * time.Hour)
	ok, res := apply(t, s, later, with(a, 4), with(b, 1), with(c, 1))
	if !ok {
		t.Fatalf("decision denied with room on every slot: %+v", res)
	}
	if res[0].Remaining != 6 || res[1].Remaining != 0 || res[2].Remaining != 1 {
		t.Errorf("after an admitted decision across slots: %+v", res)
	}
}
