package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	n := compare(t, s, 4, 800, true)
	t.Logf("%+v", n)
	if n.compensated < 50 {
		t.Fatalf("only %d decisions needed a compensation; the schedule does not test it", n.compensated)
	}
	if n.voided < 5 || n.markedAcross-n.voided < 20 {
		t.Fatalf("%d decisions with a Once charge spanned slots, %d of them void; the schedule does not test marks across slots", n.markedAcross, n.voided)
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
			out[k] = windowState(t, raw, k)
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
	if err := raw.Set(ctx, countKeyAt(t, bad, now), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Apply(ctx, now, []limit.Charge{with(a, 1), with(b, 1), bad}, make([]limit.Result, 3)); err == nil || ok {
		t.Fatalf("Apply with a broken slot = %v, %v; want an error", ok, err)
	}
	if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a failed decision changed the other slots:\nbefore %v\nafter  %v", before, after)
	}

	// After FUNCTION FLUSH (as after a restart without persistence) the
	// per-slot calls load the library again, on every master.
	err := raw.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FunctionFlush(ctx).Err() })
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

// TestClusterMarksAndLeases checks on the keys themselves what a decision
// across slots leaves of Once marks and leases: a mark that does not fit
// in one slot voids the others' work, marks included; a denial takes back
// an acquisition or a renewal and keeps a release and a Force
// acquisition; a decision that fails takes its marks back.
func TestClusterMarksAndLeases(t *testing.T) {
	t.Parallel()
	s := newCluster(t)
	ctx := context.Background()
	raw := s.cluster
	a := limit.Charge{Key: key(limit.SlidingWindow, time.Hour, "a"), Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Hour}
	full := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "c"), Algorithm: limit.FixedWindow, Amount: 1, Window: time.Hour, Cost: 1}
	markA := limit.Charge{Key: key(limit.Once, time.Hour, "a"), Algorithm: limit.Once, Window: time.Hour, Cost: 1}
	markB := limit.Charge{Key: key(limit.Once, time.Hour, "b"), Algorithm: limit.Once, Window: time.Hour, Cost: 1}
	lease := limit.Charge{Key: key(limit.Concurrency, time.Hour, "a"), Algorithm: limit.Concurrency, Amount: 1, Window: time.Hour}
	bad := limit.Charge{Key: key(limit.FixedWindow, time.Hour, "bad"), Algorithm: limit.FixedWindow, Amount: 9, Window: time.Hour, Cost: 1}
	slots := map[int]string{}
	for _, k := range []string{a.Key, markB.Key, full.Key, bad.Key} {
		if other, ok := slots[slot(k)]; ok {
			t.Fatalf("%s and %s share a slot", k, other)
		}
		slots[slot(k)] = k
	}
	with := func(c limit.Charge, cost int64) limit.Charge { c.Cost = cost; return c }
	member := func(c limit.Charge, cost int64, m string) limit.Charge { c.Cost, c.Member = cost, m; return c }
	exists := func(k string) bool {
		t.Helper()
		n, err := raw.Exists(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	window := func() string {
		t.Helper()
		return windowState(t, raw, a.Key)
	}
	leases := func() string {
		t.Helper()
		z, err := raw.ZRangeWithScores(ctx, lease.Key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(z)
	}
	ms := func(at time.Time) float64 { return float64(at.UnixMilli()) }

	if ok, _ := apply(t, s, t0, with(a, 3), full, markB); !ok {
		t.Fatal("first decision denied")
	}
	before := window()

	// markB is live: the decision is void, so a's charge and refund are
	// not kept, nor is markA, which fit in its own slot.
	now := t0.Add(time.Minute)
	refund := with(a, -1)
	refund.At = t0.UnixMilli()
	ok, res := apply(t, s, now, with(a, 2), refund, markA, markB)
	if ok || !res[0].Fits || !res[2].Fits || res[3].Fits {
		t.Fatalf("void decision: admitted %v, %+v", ok, res)
	}
	if res[0].Remaining != 7 || res[1].Remaining != 7 {
		t.Errorf("void decision reports a as %+v and %+v, want 7 left", res[0], res[1])
	}
	if after := window(); after != before || exists(markA.Key) {
		t.Fatalf("a void decision left its work behind: a %s (was %s), mark a kept %v", after, before, exists(markA.Key))
	}
	if ok, _ := apply(t, s, now, markA); !ok {
		t.Fatal("mark a was not taken back")
	}

	// A denial takes back an acquisition, then a renewal.
	if ok, _ := apply(t, s, now, member(lease, 1, "r1"), full); ok || exists(lease.Key) {
		t.Fatalf("a denied acquisition was kept: %s", leases())
	}
	if ok, _ := apply(t, s, now, member(lease, 1, "r1")); !ok {
		t.Fatal("acquisition denied")
	}
	held := fmt.Sprint([]redis.Z{{Score: ms(now.Add(time.Hour)), Member: "r1"}})
	later := now.Add(time.Minute)
	if ok, _ := apply(t, s, later, member(lease, 1, "r1"), full); ok || leases() != held {
		t.Fatalf("a denied renewal was kept: %s, want %s", leases(), held)
	}
	// A Force acquisition stays, past the cap; so does a release.
	if ok, res := apply(t, s, later, full, force(member(lease, 1, "r2"))); ok || res[1].Fits {
		t.Fatalf("force past the cap: admitted %v, %+v", ok, res)
	}
	both := fmt.Sprint([]redis.Z{{Score: ms(now.Add(time.Hour)), Member: "r1"}, {Score: ms(later.Add(time.Hour)), Member: "r2"}})
	if got := leases(); got != both {
		t.Fatalf("after a Force acquisition: %s, want %s", got, both)
	}
	if ok, _ := apply(t, s, later, member(lease, -1, "r1"), member(lease, -1, "r2"), full); ok || exists(lease.Key) {
		t.Fatalf("releases in a denied decision were not kept: %s", leases())
	}

	// A decision that fails after its marks were set takes them back. (At
	// now: a take-back leaves what a denial would, and a denial in a later
	// bucket moves the window's high-water mark.)
	markB2 := markB
	markB2.Key = key(limit.Once, 2*time.Hour, "b")
	if err := raw.Set(ctx, countKeyAt(t, bad, now), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Apply(ctx, now, []limit.Charge{markB2, with(a, 1), bad}, make([]limit.Result, 3)); err == nil || ok {
		t.Fatalf("Apply with a broken slot = %v, %v; want an error", ok, err)
	}
	if exists(markB2.Key) || window() != before {
		t.Fatalf("a failed decision left its mark (%v) or a's charge (%s, was %s)", exists(markB2.Key), window(), before)
	}
}

func force(c limit.Charge) limit.Charge { c.Force = true; return c }

// TestClusterRestartedMaster checks that a master that lost the library
// (restarted without persistence) gets it again: decisions on its slots
// alone, and across slots, run after it rejoins.
func TestClusterRestartedMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a cluster master: about 4 s")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	client, err := NewClient("redis+cluster://" + strings.Join(c.Addrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	s := New(client)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	// Charges on every master, so that one of them is on the restarted one.
	var charges []limit.Charge
	masters := map[string]bool{}
	for i := 0; len(masters) < 3; i++ {
		k := key(limit.SlidingWindow, time.Hour, fmt.Sprint(i))
		node, err := s.cluster.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if masters[node.Options().Addr] {
			continue
		}
		masters[node.Options().Addr] = true
		charges = append(charges, limit.Charge{Key: k, Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Hour, Cost: 1})
	}
	if ok, _ := apply(t, s, t0, charges...); !ok {
		t.Fatal("decision denied")
	}

	c.Servers()[1].Restart()
	c.Wait(t)
	// The client's connections to the restarted node broke with it: the
	// first calls may fail on them, never for want of the library.
	run := func(cs ...limit.Charge) []limit.Result {
		t.Helper()
		res := make([]limit.Result, len(cs))
		for attempt := 0; ; attempt++ {
			ok, err := s.Apply(ctx, t0, cs, res)
			switch {
			case err == nil && ok:
				return res
			case err == nil, attempt == 5, strings.Contains(err.Error(), "Function not found"):
				t.Fatalf("Apply after a restart = %v, %v", ok, err)
			}
		}
	}
	for _, ch := range charges {
		run(ch)
	}
	// Three charges on each key, but the restarted master lost the first.
	var got []uint64
	for _, r := range run(charges...) {
		got = append(got, r.Remaining)
	}
	slices.Sort(got)
	if want := []uint64{7, 7, 8}; !slices.Equal(got, want) {
		t.Errorf("after the restart, %v left, want %v", got, want)
	}
	libs, err := c.Servers()[1].Client(t).FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 || libs[0].Name != "tollgate_"+strings.TrimPrefix(s.apply.names[fnApply], "tollgate_apply_") {
		t.Errorf("the restarted master holds the libraries %+v (%v), want the store's", libs, err)
	}
}
