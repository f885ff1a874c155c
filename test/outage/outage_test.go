// Package outage holds the process-level tests of what Tollgate answers
// when Redis cannot: killed, slower than the store timeout, its
// connections reset, or cut off by a network that drops everything; and
// how soon it serves from Redis again once Redis is back. Each case runs one redis-server and one
// tollgate process, drives ShouldRateLimit from a few workers through a
// real gRPC client, and prints the latencies and recovery times that
// docs/reliability.md quotes.
package outage

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/test/faultproxy"
	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

const (
	domain = "outage"
	// limitPerMinute is the tenant's limit; the local policy admits
	// localLimit of it (the automatic local share of a lone replica, 0.1)
	// while Redis is down. The warm-up sends fewer calls than the limit,
	// so no answer before the fault is over limit or known to be.
	limitPerMinute = 3000
	localLimit     = limitPerMinute / 10

	// storeTimeout is --store-timeout: how long a decision waits for Redis.
	storeTimeout = 10 * time.Millisecond
	// answerMargin is what the p99 answer may take beyond storeTimeout
	// while Redis cannot answer: the gRPC round trip and the scheduling of
	// three busy processes (redis-server, tollgate, and this test under
	// -race, which hosts the gRPC client and the fault proxy) on the two
	// cores of a shared machine, where a healthy p99 is 5-15ms. It stays
	// far below the circuit's backoff (100ms-1s) and the Redis client's
	// read timeout (250ms), so a decision that waited for a probe, for a
	// reconnect or for Redis would fail it. When the machine is slower
	// than that before the fault (its healthy p99 over answerMargin), the
	// bound is the healthy p99 plus storeTimeout: the promise is that a
	// decision waits no more than the store timeout for Redis, on top of
	// what the machine costs.
	answerMargin = 40 * time.Millisecond

	// deadWait is the least a decision that waited on the dead store
	// itself would take: the shortest of the Redis client's own timeouts
	// (read, write, dial), which are what end a call to a Redis that
	// stopped answering when nothing shorter does.
	deadWait = min(redisstore.DefaultReadTimeout, redisstore.DefaultWriteTimeout, redisstore.DefaultDialTimeout)
	// maxWait bounds every call during the fault, less the time this
	// process was visibly starved during it: halfway between what a
	// decision that waits for --store-timeout at most takes (storeTimeout,
	// plus the machine) and what one that waited on the dead store takes
	// (deadWait or more). A healthy run's worst is 5-30ms.
	maxWait = (storeTimeout + deadWait) / 2

	// stallLimit is how late this process may wake from a short sleep
	// during a call for the call's latency to count (see testOutage).
	stallLimit = 10 * time.Millisecond

	// workers call every pace at most: about 1000 calls a second in all,
	// well under what two cores serve, so that latency measures waiting,
	// not a saturated CPU.
	workers = 4
	pace    = 4 * time.Millisecond
	// callTimeout is how long a call may take before it counts as
	// unanswered; every call must be answered well within it.
	callTimeout = 2 * time.Second

	// warmFor is how long the load runs with Redis answering before the
	// fault, outageFor how long the fault lasts, and afterFor how long the
	// load runs once decisions come from Redis again. The circuit probes
	// 100, 300, 700 and 1500ms after it first opens, then every second:
	// a fault of 1.5s would end just before a probe and make recovery
	// look instant. Ending it at 2s, halfway between two probes, gives
	// the typical recovery of a long outage (0 to 1s, 0.5s on average).
	warmFor   = 700 * time.Millisecond
	outageFor = 2 * time.Second
	afterFor  = 500 * time.Millisecond
	// recoveryBound is how soon after Redis is back the first decision
	// must come from Redis again. The circuit probes at most every second
	// (its longest backoff), so about 1s is expected; 5s leaves room for
	// a slow machine without hiding a client that never reconnects.
	recoveryBound = 5 * time.Second
	// slowBy is the latency fault: Redis's replies arrive this late, far
	// beyond storeTimeout.
	slowBy = 50 * time.Millisecond

	degradedHeader = "x-tollgate-degraded"
	degradedValue  = "store"
)

var rules = fmt.Sprintf(`domain: %s
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: %d
`, domain, limitPerMinute)

// fault is a way for Redis to stop answering. begin returns once the
// fault is in place; end once Redis could answer again.
type fault struct {
	name       string
	viaProxy   bool
	begin, end func(*redistest.Server, *faultproxy.Proxy)
}

var faults = []fault{
	{
		name:  "kill",
		begin: func(r *redistest.Server, _ *faultproxy.Proxy) { r.Kill() },
		end:   func(r *redistest.Server, _ *faultproxy.Proxy) { r.Restart() },
	},
	{
		name:     "latency",
		viaProxy: true,
		begin:    func(_ *redistest.Server, p *faultproxy.Proxy) { p.Latency(0, slowBy) },
		end:      func(_ *redistest.Server, p *faultproxy.Proxy) { p.Pass() },
	},
	{
		// Connections reset and refused while Redis keeps running: a
		// network or proxy failure, not a crash; Redis keeps its counters.
		name:     "reset",
		viaProxy: true,
		begin:    func(_ *redistest.Server, p *faultproxy.Proxy) { p.Reset() },
		end:      func(_ *redistest.Server, p *faultproxy.Proxy) { p.Pass() },
	},
	{
		name:     "blackhole",
		viaProxy: true,
		begin:    func(_ *redistest.Server, p *faultproxy.Proxy) { p.Blackhole() },
		end:      func(_ *redistest.Server, p *faultproxy.Proxy) { p.Pass() },
	},
}

// policy is a --store-failure value. What its degraded answers say is
// checked in testOutage.
type policy struct {
	name string
	// ready is whether /readyz stays 200 while Redis is down: not for
	// deny, which refuses everything then, so Kubernetes should send the
	// traffic to a replica that still reaches Redis.
	ready bool
}

var policies = []policy{
	{name: "allow", ready: true},
	{name: "deny", ready: false},
	{name: "local", ready: true},
}

// TestStoreOutage takes Redis away from a loaded tollgate in each of the
// faults, under each --store-failure policy, and checks that every call
// is still answered, within the store timeout plus a margin at p99, as
// the policy says and marked degraded; that /readyz follows the policy;
// and that decisions come from Redis again soon after it is back.
func TestStoreOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and tollgate twelve times for about 4.5s each; skipped with -short")
	}
	t.Parallel()
	bin := tollgatetest.Build(t)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	// One case at a time: the latency bound is about waiting for Redis,
	// and two loaded cases on two cores would measure the machine.
	for _, f := range faults {
		for _, p := range policies {
			t.Run(f.name+"/"+p.name, func(t *testing.T) { testOutage(t, bin, rulesPath, f, p) })
		}
	}
}

func testOutage(t *testing.T, bin, rulesPath string, f fault, pol policy) {
	rdb := redistest.Start(t)
	addr := rdb.Addr()
	var px *faultproxy.Proxy
	if f.viaProxy {
		px = faultproxy.New(t, rdb.Addr())
		addr = px.Addr()
	}
	tg := tollgatetest.Start(t, bin, "tollgate",
		"--redis-url", "redis://"+addr,
		"--config", rulesPath,
		"--store-timeout", storeTimeout.String(),
		"--store-failure", pol.name,
		// Leases would answer some decisions during the outage from a
		// slice taken before it; this test is about decisions that ask Redis.
		"--lease-fraction=0",
	)
	d := startDriver(t, tg.GRPC, "warm", workers, pace)
	ready := pollReadiness(t, tg.Admin, d.start)

	name := fmt.Sprintf("%s, --store-failure=%s", f.name, pol.name)

	// A new replica's first decisions may be degraded (see the report
	// below); the fault starts warmFor after Redis first answered.
	firstFromRedis, warmed := d.waitHealthy(0, recoveryBound)
	if !warmed {
		t.Fatalf("no answer came from Redis within %v of the start", recoveryBound)
	}
	time.Sleep(warmFor)
	// The outage's calls go to a tenant of their own, with fresh counters
	// in Redis and in the local store.
	d.setTenant("outage")
	faultBegan := d.now()
	f.begin(rdb, px)
	faultAt := d.now()
	time.Sleep(outageFor)
	circuit, circuitFound := metric(t, tg.Admin, "tollgate_store_circuit_state")
	endAt := d.now()
	f.end(rdb, px)
	backAt := d.now()
	first, recovered := d.waitHealthy(backAt, recoveryBound)
	var readyAgain time.Duration = -1
	if !pol.ready {
		readyAgain = waitReadyAgain(t, tg.Admin, d)
	}
	closedAgain := waitCircuitClosed(t, tg.Admin, d)
	afterFrom := d.now()
	time.Sleep(afterFor)
	d.Stop()
	ready.Stop()

	// Every call, in every phase, got an answer.
	all := d.between(0, d.now()+time.Hour)
	var failed []answer
	for _, a := range all {
		if a.err != nil {
			failed = append(failed, a)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d calls got no answer, e.g. sent at +%v: %v", len(failed), len(all), failed[0].send, failed[0].err)
	}

	// Before the fault: from Redis. A new replica's first decisions wait
	// for new connections to Redis and for its function to load, and one
	// timeout opens the circuit for 100ms; on a busy machine a call may
	// wait longer than the store timeout now and then. Degraded answers
	// here are counted and printed, not failed.
	warmFrom := firstFromRedis.recv
	var cold, settled, warmDegraded int
	var degradedFrom, degradedTo time.Duration
	for _, a := range d.between(0, faultBegan) {
		switch {
		case a.err != nil || a.recv >= faultBegan:
			// Reported above, or in flight at the fault.
		case a.send < warmFrom:
			if a.degraded {
				cold++
			}
		case a.degraded:
			if warmDegraded == 0 {
				degradedFrom = a.send
			}
			degradedTo = a.send
			settled++
			warmDegraded++
		default:
			settled++
			if a.code != rlsv3.RateLimitResponse_OK {
				t.Errorf("before the fault: call at +%v answered %v from Redis, want OK", a.send, a.code)
			}
		}
	}
	warm := latenciesOf(d.between(warmFrom, faultBegan))
	after := latenciesOf(d.between(afterFrom, afterFrom+afterFor))
	t.Logf("%s: start-up: %d degraded answers before the first from Redis at +%v", name, cold, warmFrom.Round(time.Millisecond))
	var when string
	if warmDegraded > 0 {
		when = fmt.Sprintf(", sent +%v to +%v", degradedFrom.Round(time.Millisecond), degradedTo.Round(time.Millisecond))
	}
	t.Logf("%s: before the fault %v; %d of %d degraded%s", name, warm, warmDegraded, settled, when)

	// During the fault: answered in time. On this shared machine other
	// work can starve all three processes at once for 100ms and more, so
	// the bound holds for the calls during which this process was not
	// visibly starved (it woke no more than stallLimit late from a short
	// sleep); when that leaves fewer than half the calls, the machine is
	// too busy for a latency bound, the figures are printed and only what
	// the answers say is checked.
	during := d.between(faultAt, endAt)
	lat := latenciesOf(during)
	calm := latenciesOf(d.calm(during, stallLimit))
	t.Logf("%s: during the fault (%v) %v", name, (endAt - faultAt).Round(time.Millisecond), lat)
	t.Logf("%s: during the fault, calls this process was not starved in: %v", name, calm)
	t.Logf("%s: after recovery %v", name, after)
	checkLatency(t, name, d, during, lat, calm)

	// During the fault: degraded, as the policy says.
	var inWindow []answer
	for _, a := range during {
		if a.err == nil && a.recv < endAt {
			inWindow = append(inWindow, a)
		}
	}
	counts := map[rlsv3.RateLimitResponse_Code]int{}
	notDegraded := 0
	for _, a := range inWindow {
		counts[a.code]++
		if !a.degraded {
			notDegraded++
		}
	}
	ok, over := counts[rlsv3.RateLimitResponse_OK], counts[rlsv3.RateLimitResponse_OVER_LIMIT]
	t.Logf("%s: during the fault %d OK, %d OVER_LIMIT, %d without %s", name, ok, over, notDegraded, degradedHeader)
	if notDegraded > 0 {
		t.Errorf("%d of %d answers during the fault lack %s: %s", notDegraded, len(inWindow), degradedHeader, degradedValue)
	}
	switch pol.name {
	case "allow":
		if ok != len(inWindow) {
			t.Errorf("allow: %d of %d answers during the fault OK, want all", ok, len(inWindow))
		}
	case "deny":
		if over != len(inWindow) {
			t.Errorf("deny: %d of %d answers during the fault OVER_LIMIT, want all", over, len(inWindow))
		}
	case "local":
		checkLocal(t, d)
	}
	if n, found := metric(t, tg.Admin, "tollgate_store_degraded_decisions_total",
		`domain="`+domain+`"`, `policy="`+pol.name+`"`); !found || n < float64(len(inWindow)) {
		t.Errorf("tollgate_store_degraded_decisions_total{policy=%q} = %v (found %v), want at least %d", pol.name, n, found, len(inWindow))
	}
	if !circuitFound || circuit == 0 {
		t.Errorf("tollgate_store_circuit_state at the end of the fault = %v (found %v), want 1 or 2 (half-open or open)", circuit, circuitFound)
	}

	// During the fault: /readyz. A poll the machine kept from being
	// answered within its timeout says nothing either way.
	polls, answered, readyPolls := ready.between(faultAt, endAt)
	t.Logf("%s: /readyz during the fault: %d of %d answers ready (%d polls unanswered)", name, readyPolls, answered, polls-answered)
	switch {
	case answered == 0:
		t.Errorf("/readyz did not answer during the fault (%d polls)", polls)
	case pol.ready && readyPolls != answered:
		t.Errorf("/readyz during the fault: %d of %d answers ready, want all (%s keeps answering)", readyPolls, answered, pol.name)
	case !pol.ready && readyPolls == answered:
		t.Errorf("/readyz during the fault: every answer ready, want not ready while the circuit is open (deny)")
	}

	// Recovery.
	if !recovered {
		t.Errorf("%s: no answer from Redis within %v of Redis being back", name, recoveryBound)
		return
	}
	t.Logf("%s: recovery %v from Redis back to the first answer from Redis (ending the fault took %v)",
		name, (first.recv - backAt).Round(time.Millisecond), (backAt - endAt).Round(time.Millisecond))
	if !pol.ready {
		if readyAgain < 0 {
			t.Errorf("/readyz not ready again within %v of the first answer from Redis", recoveryBound)
		} else {
			t.Logf("%s: /readyz ready again %v after Redis was back", name, (readyAgain - backAt).Round(time.Millisecond))
		}
	}
	if closedAgain < 0 {
		t.Errorf("tollgate_store_circuit_state not 0 (closed) within %v of the first answer from Redis", recoveryBound)
	}
}

// checkLatency checks the answers during the fault against bounds derived
// from the timeouts: every call, less the time this process was visibly
// starved during it, within maxWait, whatever the machine does; and the
// p99 of the calls this process was not starved in within
// storeTimeout+answerMargin, when at least half the calls were such (else
// the machine is too busy for a p99 to mean anything, and only the bound
// on every call is checked).
func checkLatency(t *testing.T, name string, d *driver, during []answer, lat, calm latencies) {
	t.Helper()
	bound := storeTimeout + answerMargin
	if bound >= maxWait || maxWait >= deadWait {
		t.Fatalf("bounds out of order: p99 %v, every call %v, the store client's own timeout %v: the test could not tell waiting on the dead store from not",
			bound, maxWait, deadWait)
	}
	if lat.n < 100 {
		t.Errorf("only %d calls during the fault: the load did not run, so the test shows nothing", lat.n)
		return
	}
	var worst answer
	var worstWait, worstStarved time.Duration
	for _, a := range during {
		starved := d.starved(a, stallLimit)
		if w := a.latency() - starved; w > worstWait {
			worst, worstWait, worstStarved = a, w, starved
		}
	}
	t.Logf("%s: during the fault, longest call less starvation %v (sent +%v, took %v, starved %v); bound %v",
		name, worstWait.Round(10*time.Microsecond), worst.send.Round(time.Millisecond), worst.latency().Round(10*time.Microsecond),
		worstStarved.Round(10*time.Microsecond), maxWait)
	if worstWait > maxWait {
		t.Errorf("a call during the fault (sent +%v) took %v, %v of it while this process was not starved: want at most %v, (store timeout %v + the store client's timeout %v)/2: a decision waited on the dead store",
			worst.send.Round(time.Millisecond), worst.latency(), worstWait, maxWait, storeTimeout, deadWait)
	}
	switch {
	case 2*calm.n < lat.n:
		t.Logf("%s: p99 NOT CHECKED, the machine is busy: this process was starved during %d of %d calls (every call was checked above)",
			name, lat.n-calm.n, lat.n)
	case calm.p99 > bound:
		t.Errorf("p99 answer during the fault %v, want at most %v (store timeout %v + %v)", calm.p99, bound, storeTimeout, answerMargin)
	case calm.p50 >= storeTimeout:
		// With the circuit open, most decisions do not wait at all.
		t.Errorf("p50 answer during the fault %v, want under the store timeout %v (the circuit fails fast)", calm.p50, storeTimeout)
	}
}

// checkLocal checks the local policy's answers: OK up to the local limit,
// then OVER_LIMIT, counting every degraded answer of the outage's tenant
// (the local store counts them all, including those after the fault
// ended and before recovery).
func checkLocal(t *testing.T, d *driver) {
	t.Helper()
	var degraded, ok int
	for _, a := range d.between(0, d.now()) {
		if a.err != nil || !a.degraded || a.tenant != "outage" {
			continue
		}
		degraded++
		if a.code == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	want := min(degraded, localLimit)
	t.Logf("local: %d degraded answers, %d OK (local limit %d = 0.1 x %d)", degraded, ok, localLimit, limitPerMinute)
	if ok != want {
		t.Errorf("local: %d of %d degraded answers OK, want %d (the local limit %d, then OVER_LIMIT)", ok, degraded, want, localLimit)
	}
	if degraded <= localLimit {
		t.Errorf("local: only %d degraded answers, not past the local limit %d: the test shows nothing", degraded, localLimit)
	}
}

// waitReadyAgain waits, at most recoveryBound, for /readyz to answer 200,
// and returns when it did on d's clock, or -1.
func waitReadyAgain(t *testing.T, adminAddr string, d *driver) time.Duration {
	deadline := time.Now().Add(recoveryBound)
	for time.Now().Before(deadline) {
		if code, err := readyz(t.Context(), adminAddr); err == nil && code == http.StatusOK {
			return d.now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return -1
}

// waitCircuitClosed waits, at most recoveryBound, for
// tollgate_store_circuit_state to read 0 (closed), and returns when it
// did on d's clock, or -1.
func waitCircuitClosed(t *testing.T, adminAddr string, d *driver) time.Duration {
	deadline := time.Now().Add(recoveryBound)
	for time.Now().Before(deadline) {
		if v, found := metric(t, adminAddr, "tollgate_store_circuit_state"); found && v == 0 {
			return d.now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return -1
}
