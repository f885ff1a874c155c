package pressure

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestControllerRedisRestart is issue 13's redis-killed scenario on the
// controller alone: three replicas on one real Redis under a steady load
// well within capacity (about 23 of 32 in flight), Redis killed for 20 s
// and restarted empty. Nothing is over capacity at any time, so no tier
// may be shed at any time, and above all not after Redis is back: the
// bench measured free and standard shed whole for the 15 s dwell after
// the restart, because the counts every tick of the outage failed to add
// were added to the first bucket after it, which read as a 50x burst of
// every tier (premium's took all of R).
func TestControllerRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a redis-server: about 9 s")
	}
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	// No retries: a call to the killed server fails at once, as the
	// replicas' calls do behind their store circuit.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rc.Close() })
	clock := storetest.NewFakeClock(t0)
	var ctl []*Controller
	for i := range 3 {
		c, err := NewController(ControllerConfig{
			Flights: redisstore.NewFlights(rc), Meters: redisstore.NewMeters(rc), Cells: redisstore.NewCells(rc),
			Replica: fmt.Sprintf("r%d", i), Clock: clock, QueueSize: 1 << 12,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ControlDomain{Name: "inference", Control: testControl, Tiers: []string{"free", "premium", "standard"}, Upstreams: map[string]int64{"m": 32}}); err != nil {
			t.Fatal(err)
		}
		ctl = append(ctl, c)
	}
	// Per tick of 250 ms: the bench's 28/s premium, 28/s standard and
	// 40/s free; each admitted request completes a tick later.
	perTick := []struct {
		tier string
		n    int
	}{{"premium", 7}, {"standard", 7}, {"free", 10}}
	type flight struct {
		replica int
		id      string
	}
	var inFlight []flight
	seq := 0
	// localDeny: while Redis is down, the replicas' local limits refuse
	// most of standard and free, as the bench measured (about 16/s of
	// standard and 5/s of free admitted).
	localDeny := false
	tick := func() {
		for _, f := range inFlight {
			ctl[f.replica].Completed(&limit.Request{Domain: "inference", ID: f.id,
				Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "model", Value: "m"}}}}})
		}
		inFlight = inFlight[:0]
		for _, p := range perTick {
			for range p.n {
				seq++
				r := seq % len(ctl)
				c := ctl[r]
				f := c.Fraction("inference", "m", p.tier)
				// Deterministic shedding: every request while a tier is
				// shed at all, which is what this test forbids anyway.
				admit := f == 0 && !(localDeny && p.tier != "premium" && seq%3 != 0)
				if id := c.Decided("inference", "m", p.tier, admit, fmt.Sprintf("q%d", seq)); id != "" {
					inFlight = append(inFlight, flight{replica: r, id: id})
				}
			}
		}
		for _, c := range ctl {
			c.Flush(ctx)
		}
		for _, c := range ctl {
			c.Tick(ctx)
			clock.Advance(limit.DefaultControlInterval / 4)
		}
		clock.Advance(limit.DefaultControlInterval - 3*limit.DefaultControlInterval/4)
	}
	phases := []struct {
		name  string
		give  func()
		ticks int
		check bool // nothing may be shed
	}{
		{name: "steady", ticks: 60, check: true},
		{name: "redis killed", give: func() { srv.Kill(); localDeny = true }, ticks: 80},
		{name: "redis back, empty", give: func() { srv.Restart(); waitPing(t, rc); localDeny = false }, ticks: 60, check: true},
	}
	for _, ph := range phases {
		if ph.give != nil {
			ph.give()
		}
		for i := range ph.ticks {
			tick()
			if !ph.check {
				continue
			}
			for r, c := range ctl {
				for _, tier := range []string{"free", "standard"} {
					if f := c.Fraction("inference", "m", tier); f != 0 {
						t.Fatalf("%s, tick %d: replica %d sheds %v of %s at %d in flight of 32: %+v",
							ph.name, i, r, f, tier, c.Snapshot()[0].InFlight, c.Snapshot()[0])
					}
				}
			}
		}
	}
	if errs := ctl[0].StoreErrors(); errs[OpAdd] == 0 || errs[OpLoad] == 0 {
		t.Errorf("no store errors counted while Redis was killed: %v", errs)
	}
	if snap := ctl[0].Snapshot()[0]; snap.Stale || snap.InFlight == 0 {
		t.Errorf("after Redis came back: %+v, want fresh and counting flights", snap)
	}
}

// waitPing waits until c reaches its server again: after failed dials,
// go-redis's pool redials in the background about once a second, so a
// restarted server is not seen at once.
func waitPing(tb testing.TB, c *redis.Client) {
	tb.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		select {
		case <-deadline:
			tb.Fatal("redis: no answer to PING within 10s of its restart")
		case <-tick.C:
		}
	}
}
