// Package failover holds the acceptance tests that Tollgate, under load,
// rides out a Redis master's crash: Sentinel or Redis Cluster promotes
// its replica, no call hangs meanwhile, decisions resume on the new
// master, and the global limit holds in the windows after the failover.
package failover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// The limit under test, and the load.
const (
	limitAmount = 300
	window      = 2 * time.Second
	buckets     = 20

	tollgates          = 2
	workersPerTollgate = 8
	// runFor is the load's length; the master dies at killAt. Failover
	// takes 2-5s here, which leaves at least a window after it.
	runFor = 11 * time.Second
	killAt = 3 * time.Second
	// hangBound is the longest any call may take, failover or not.
	hangBound = 2 * time.Second
	// recoverBound is the longest the failover, as the clients see it,
	// may take: Sentinel's and the cluster's detection and election,
	// and the client finding the new master.
	recoverBound = 6 * time.Second
)

// tollgateFlags are the flags of every tollgate: every decision asks
// Redis (no leases), so what is checked is the store's failover.
var tollgateFlags = []string{"--lease-fraction=0", "--log-level=warn"}

// TestFailover kills a Redis master under load, behind Sentinel and in a
// cluster. One after the other: two such runs at once would share two
// cores, and this test is about failover, not the machine.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tollgate and runs 2 tollgates on Sentinel, then on a cluster, for about 12s each; skipped with -short")
	}
	t.Parallel()
	bin := tollgatetest.Build(t)
	t.Run("Sentinel", func(t *testing.T) { testSentinelFailover(t, bin) })
	t.Run("Cluster", func(t *testing.T) { testClusterFailover(t, bin) })
}

// testSentinelFailover: a master, a replica and three sentinels; two
// tollgates on redis+sentinel:// under load; the master is killed.
func testSentinelFailover(t *testing.T, bin string) {
	flags, deny := setup(t, bin)

	began := time.Now()
	const name = "failover"
	master := redistest.Start(t)
	replica := redistest.Start(t, redistest.WithReplicaOf(master))
	waitFor(t, "replica in sync", 10*time.Second, func(ctx context.Context) error { return inSync(ctx, replica) })
	var sentinels []*redistest.Server
	var addrs []string
	for range 3 {
		s := redistest.StartSentinel(t, master, name, redistest.WithSentinelTimeouts(500*time.Millisecond, 3*time.Second, 2))
		sentinels = append(sentinels, s)
		addrs = append(addrs, s.Addr())
	}
	// Each sentinel must know the replica and the other two before the
	// master dies, or there is nothing to promote and no quorum.
	waitFor(t, "sentinels know each other and the replica", 15*time.Second, func(ctx context.Context) error {
		for _, s := range sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
			others, err := sc.Sentinels(ctx, name).Result()
			if err == nil && len(others) != 2 {
				err = fmt.Errorf("sentinel %s knows %d others", s.Addr(), len(others))
			}
			if err == nil {
				var reps []map[string]string
				if reps, err = sc.Replicas(ctx, name).Result(); err == nil && len(reps) != 1 {
					err = fmt.Errorf("sentinel %s knows %d replicas", s.Addr(), len(reps))
				}
			}
			_ = sc.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	url := "redis+sentinel://" + strings.Join(addrs, ",") + "/" + name
	tgs := make([]*tollgatetest.Process, tollgates)
	for i := range tgs {
		tgs[i] = startTollgate(t, bin, i, append([]string{"--redis-url", url}, flags...)...)
	}
	t.Logf("started a master, a replica, 3 sentinels and %d tollgates in %v", tollgates, time.Since(began).Round(time.Millisecond))

	calls := drive(t, tgs, workersPerTollgate, runFor, killAt, master.Kill)

	sc := redis.NewSentinelClient(&redis.Options{Addr: addrs[0]})
	defer sc.Close()
	got, err := sc.GetMasterAddrByName(t.Context(), name).Result()
	if err != nil {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
	}
	if addr := net.JoinHostPort(got[0], got[1]); addr != replica.Addr() {
		t.Errorf("sentinel reports master %s after the failover, want the replica %s", addr, replica.Addr())
	}
	check(t, calls, deny)
}

// testClusterFailover: three masters with a replica each; two tollgates
// on redis+cluster:// under load; the master of the limit's slot is
// killed.
func testClusterFailover(t *testing.T, bin string) {
	flags, deny := setup(t, bin)

	began := time.Now()
	c := redistest.StartCluster(t, 3, redistest.WithReplicas(1), redistest.WithArgs("--cluster-node-timeout", "1000"))
	// The master that holds the limit's key, and its replica.
	key := limit.Key(limit.Requests, limit.SlidingWindow, window, "failover", []limit.Entry{{Key: "tenant", Value: "acme"}})
	slot, err := c.Servers()[0].Client(t).ClusterKeySlot(t.Context(), key).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	victim := -1
	for i, m := range c.Servers() {
		if owns(t, m, int(slot)) {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("no master serves the slot of %q", key)
	}
	master, replica := c.Servers()[victim], c.Replicas()[victim]
	url := "redis+cluster://" + strings.Join(c.Addrs(), ",")
	tgs := make([]*tollgatetest.Process, tollgates)
	for i := range tgs {
		tgs[i] = startTollgate(t, bin, i, append([]string{"--redis-url", url}, flags...)...)
	}
	t.Logf("started a cluster of 3 masters and 3 replicas and %d tollgates in %v; killing master %s, replica %s",
		tollgates, time.Since(began).Round(time.Millisecond), master.Addr(), replica.Addr())

	calls := drive(t, tgs, workersPerTollgate, runFor, killAt, master.Kill)

	role, err := replica.Client(t).Do(t.Context(), "role").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Errorf("the replica's ROLE after the failover = %v, %v; want master", role, err)
	}
	check(t, calls, deny)
}

// owns reports whether m serves slot.
func owns(t *testing.T, m *redistest.Server, slot int) bool {
	t.Helper()
	slots, err := m.Client(t).ClusterSlots(t.Context()).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	for _, r := range slots {
		if r.Start <= slot && slot <= r.End {
			return r.Nodes[0].Addr == m.Addr()
		}
	}
	return false
}

// inSync reports whether replica's link to its master is up.
func inSync(ctx context.Context, replica *redistest.Server) error {
	c := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "master_link_status:up") {
		return errors.New("master_link_status is not up")
	}
	return nil
}

// bucket is the resolution at which check finds the failover.
const bucket = 100 * time.Millisecond

// check asserts what a run with a master killed at killAt must show, and
// logs its figures.
//
// The failover, as the clients see it, is the span of 100ms buckets
// after the kill in which at least half the calls failed or were
// answered degraded. A loaded machine also degrades an odd call at any
// time (a store call over --store-timeout): those are reported, and only
// fail the test as gRPC errors with store_failure deny, which must
// answer every call.
func check(t *testing.T, calls []call, deny bool) {
	t.Helper()
	var counts [4]int
	var slowest time.Duration
	var hangs, troubleBefore int
	var firstErr error
	var perBucket [][2]int // per bucket: calls in trouble, all calls
	for _, c := range calls {
		counts[c.outcome]++
		d := c.recv - c.send
		slowest = max(slowest, d)
		if d > hangBound {
			hangs++
		}
		if c.outcome == failed && firstErr == nil {
			firstErr = c.err
		}
		trouble := c.outcome == failed || c.outcome == degraded
		if trouble && c.recv < killAt {
			troubleBefore++
		}
		b := int(c.recv / bucket)
		for len(perBucket) <= b {
			perBucket = append(perBucket, [2]int{})
		}
		perBucket[b][1]++
		if trouble {
			perBucket[b][0]++
		}
	}
	began, recovered := time.Duration(-1), killAt
	var errsDuring, degradedDuring int
	for b, n := range perBucket {
		at := time.Duration(b) * bucket
		if at+bucket <= killAt || 2*n[0] < n[1] {
			continue
		}
		if began < 0 {
			began = at
		}
		recovered = at + bucket
	}
	for _, c := range calls {
		if c.recv >= killAt && c.recv < recovered {
			switch c.outcome {
			case failed:
				errsDuring++
			case degraded:
				degradedDuring++
			}
		}
	}
	t.Logf("%d calls: %d admitted, %d over limit, %d degraded answers, %d gRPC errors; slowest call %v",
		len(calls), counts[admitted], counts[overLimit], counts[degraded], counts[failed], slowest.Round(time.Millisecond))
	t.Logf("before the kill at +%v: %d calls failed or degraded (store calls over --store-timeout)", killAt, troubleBefore)
	if began >= 0 {
		t.Logf("failover: most calls failed or degraded from +%v to +%v: decisions resumed %v after the kill; meanwhile %d gRPC errors, %d degraded answers",
			began, recovered, recovered-killAt, errsDuring, degradedDuring)
	} else {
		t.Logf("failover: no 100ms bucket after the kill had most calls failed or degraded")
	}
	if firstErr != nil {
		t.Logf("first gRPC error: %v", firstErr)
	}
	t.Logf("timeline (admitted/over/degraded/errors per %v): %s", timelineStep, timeline(calls))

	if hangs > 0 {
		t.Errorf("HANG: %d calls took longer than %v (slowest %v)", hangs, hangBound, slowest)
	}
	if deny && counts[failed] > 0 {
		t.Errorf("with --store-failure=deny, %d calls failed with a gRPC error, want every call answered (e.g. %v)", counts[failed], firstErr)
	}
	if recovered-killAt > recoverBound {
		t.Errorf("RECOVERY: decisions failed until +%v, %v after the kill, want within %v", recovered, recovered-killAt, recoverBound)
	}
	var okAfter int
	for _, c := range calls {
		if c.outcome == admitted && c.send >= recovered {
			okAfter++
		}
	}
	if okAfter == 0 {
		t.Errorf("RECOVERY: no call was admitted after +%v: tollgate did not follow the new master", recovered)
	}

	// Safety before the kill, over windows that end before it.
	var before []call
	for _, c := range calls {
		if c.recv < killAt {
			before = append(before, c)
		}
	}
	worst, at := maxSurelyInWindow(before, 0, window)
	t.Logf("before the kill: most admissions surely inside one %v window: %d (limit %d), from +%v", window, worst, limitAmount, at.Round(time.Millisecond))
	if worst > limitAmount {
		t.Errorf("SAFETY before the kill: %d admissions in the window from +%v, limit %d", worst, at, limitAmount)
	}
	// Safety after the failover: counts the old master took after the
	// replica's last sync are lost, which can only loosen the windows
	// that span the failover; windows that start once it is over must
	// hold.
	worst, at = maxSurelyInWindow(calls, recovered, window)
	t.Logf("after the failover (+%v on): %d admitted; most admissions surely inside one %v window: %d (limit %d), from +%v",
		recovered, okAfter, window, worst, limitAmount, at.Round(time.Millisecond))
	if worst > limitAmount {
		t.Errorf("SAFETY after the failover: %d admissions in the window from +%v, limit %d", worst, at, limitAmount)
	}
	if runFor-recovered < window {
		t.Logf("less than a window of load after the failover: the safety check above saw a partial window")
	}
}

// timelineStep is the resolution of the timeline check logs.
const timelineStep = 500 * time.Millisecond

// timeline renders the outcomes per timelineStep, by answer time.
func timeline(calls []call) string {
	var steps [][4]int
	for _, c := range calls {
		i := int(c.recv / timelineStep)
		for len(steps) <= i {
			steps = append(steps, [4]int{})
		}
		steps[i][c.outcome]++
	}
	var b strings.Builder
	for i, n := range steps {
		fmt.Fprintf(&b, "\n  +%-5v %4d/%5d/%5d/%4d", time.Duration(i)*timelineStep, n[admitted], n[overLimit], n[degraded], n[failed])
	}
	return b.String()
}
