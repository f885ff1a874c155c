package replicas

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// The shedding policy under test and how fast the replicas follow it.
const (
	pressureDomain = "pressure"
	pressureToken  = "ramp-token-ramp-token-ramp-token" // 32 bytes, the shortest accepted
	// pressureInterval is --pressure-interval: each replica publishes its
	// score and reads the combined one (and the pushed one) this often.
	pressureInterval = 100 * time.Millisecond
	// hold is the policy's hold. It is longer than a ramp phase on
	// purpose: the Evaluator counts the hold from the last step change,
	// not from the drop in pressure, so with a hold shorter than the 0.95
	// phase the 0.5 phase would recover at its first tick and show
	// nothing about the hold. With 2s against 1.5s phases, the step
	// entered at 0.95 is held about 0.5s into the 0.5 phase.
	hold = 2 * time.Second
	// settle is ignored at the start of every phase: the replica's next
	// tick (up to one interval) reads the push, a second interval covers
	// a tick that began before the push landed, plus 100ms for the
	// store round trip and the client call that straddles the change.
	settle = 2*pressureInterval + 100*time.Millisecond
	// callEvery paces each worker: call k is due k*callEvery after it
	// starts, and is sent when due or, if the worker is behind, as soon as
	// the previous call has been answered (see load).
	callEvery = 20 * time.Millisecond
	// pressureCallTimeout bounds one ShouldRateLimit call.
	pressureCallTimeout = 2 * time.Second
)

// pressureRules: a per-tenant limit far above what the workers send
// (about 50 calls/s per tenant per replica, 150/s in all, against
// 100000/s x plan), so that every refusal in the test is shedding.
var pressureRules = fmt.Sprintf(`domain: %s
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000}
tiers:
  key: tier
  default: free
  plans: {premium: 3, standard: 2, free: 1}
shedding:
  steps:
    - above: 0.7
      shed: [free]
    - above: 0.9
      admit_only: [premium]
  hysteresis: 0.05
  hold: %v
`, pressureDomain, hold)

var tiers = []string{"premium", "standard", "free"}

// pressureCluster is redis and three tollgate processes sharing the
// pressure board, with the push endpoint on every one.
type pressureCluster struct {
	reps []*tollgatetest.Process
}

func startPressureCluster(t *testing.T) *pressureCluster {
	t.Helper()
	bin := tollgatetest.Build(t)
	rdb := redistest.Start(t)
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	tokenPath := filepath.Join(dir, "token")
	if err := os.WriteFile(rulesPath, []byte(pressureRules), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenPath, []byte(pressureToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &pressureCluster{reps: make([]*tollgatetest.Process, replicas)}
	for i := range c.reps {
		// --replica-id: the default is the hostname, which all three
		// share, and they would overwrite each other's board entry.
		c.reps[i] = startReplica(t, bin, i, rdb.URL(), rulesPath,
			"--replica-id", fmt.Sprintf("r%d", i),
			"--pressure-token-file", tokenPath,
			"--pressure-interval", pressureInterval.String(),
			"--pressure-ttl", "1s",
		)
	}
	return c
}

// push PUTs a global pressure score on replica 0 and returns when it was
// sent and when it was acknowledged.
func (c *pressureCluster) push(t *testing.T, score float64) (sent, acked time.Time) {
	t.Helper()
	body := fmt.Sprintf(`{"scope":"global","pressure":%v,"ttl":"1m"}`, score)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+c.reps[0].Admin+"/v1/pressure", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+pressureToken)
	req.Header.Set("Content-Type", "application/json")
	sent = time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT /v1/pressure %v: %v", score, err)
	}
	resp.Body.Close()
	acked = time.Now()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /v1/pressure %v = %s, want 204", score, resp.Status)
	}
	return sent, acked
}

// tcall is one ShouldRateLimit call as the client saw it.
type tcall struct {
	send, recv time.Time
	tier       string
	replica    int
	ok         bool   // OK; else OVER_LIMIT (anything else is in err)
	reason     string // x-tollgate-reason
	err        error
}

// load runs one paced worker per (tier, replica) per perReplica until
// stop is closed, and returns every call once they have all finished.
func (c *pressureCluster) load(t *testing.T, tierList []string, perReplica int, stop <-chan struct{}) func() []tcall {
	t.Helper()
	var mu sync.Mutex
	var calls []tcall
	var wg sync.WaitGroup
	for i, r := range c.reps {
		cc, err := grpc.NewClient(r.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("replica %d: dial %s: %v", i, r.GRPC, err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		client := rlsv3.NewRateLimitServiceClient(cc)
		for _, tier := range tierList {
			req := &rlsv3.RateLimitRequest{
				Domain: pressureDomain,
				Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{
					{Key: "tenant", Value: "t-" + tier},
					{Key: "tier", Value: tier},
				}}},
			}
			for range perReplica {
				wg.Go(func() {
					var mine []tcall
					defer func() {
						mu.Lock()
						calls = append(calls, mine...)
						mu.Unlock()
					}()
					// Call k is due at k*callEvery; a worker that fell
					// behind (a slow call, a busy machine) sends at once to
					// catch up, but never more than maxBehind calls' worth,
					// so a transient stall costs no throughput and a
					// sustained slowdown does.
					const maxBehind = 10
					next := time.Now()
					timer := time.NewTimer(0)
					defer timer.Stop()
					errs := 0
					for {
						select {
						case <-stop:
							return
						case <-t.Context().Done():
							return
						case <-timer.C:
						}
						now := time.Now()
						if next = next.Add(callEvery); next.Before(now.Add(-maxBehind * callEvery)) {
							next = now
						}
						timer.Reset(max(0, next.Sub(now)))
						ctx, cancel := context.WithTimeout(t.Context(), pressureCallTimeout)
						cl := tcall{send: time.Now(), tier: tier, replica: i}
						resp, err := client.ShouldRateLimit(ctx, req)
						cancel()
						cl.recv = time.Now()
						switch {
						case err != nil:
							cl.err = err
						case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
							cl.ok = true
						case resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT:
							cl.err = fmt.Errorf("overall code %v", resp.GetOverallCode())
						}
						for _, h := range resp.GetResponseHeadersToAdd() {
							if strings.EqualFold(h.GetKey(), "x-tollgate-reason") {
								cl.reason = h.GetValue()
							}
						}
						mine = append(mine, cl)
						if cl.err != nil {
							if errs++; errs >= maxErrors {
								return
							}
						}
					}
				})
			}
		}
	}
	return func() []tcall {
		wg.Wait()
		slices.SortFunc(calls, func(a, b tcall) int { return a.send.Compare(b.send) })
		return calls
	}
}

// phase is one step of the ramp: the score pushed, and when.
type phase struct {
	score        float64
	sent, acked  time.Time // the push
	end          time.Time // the next push was sent (or the load stopped)
	from         time.Time // acked + settle: calls sent from here are judged
	name         string
	tierStats    map[string]*tierStat
	judgedWindow time.Duration // end - from
}

type tierStat struct {
	calls, ok, shed, otherOver int
}

// Dead replicas (a replica whose published score stops counting after
// --pressure-ttl) are not tested here: a process's own pressure is hard
// to raise from outside, and pkg/app's TestPressureAcrossReplicas already
// stops a replica and waits for it to leave the board.

// TestPressureRamp pushes pressure 0 -> 0.75 -> 0.85 -> 0.95 -> 0.5 -> 0
// on replica 0 while premium, standard and free callers load all three
// replicas, and checks each phase's admissions from the callers' side.
//
// Premium's load is paced (one call per callEvery per worker, the next
// only after the answer, catching up after a stall), not a tight closed
// loop: on a small machine a tight loop's throughput is whatever CPU the
// shed tiers leave it, since shed calls come back faster and their
// workers then spin faster, so a 95% throughput bound would measure the
// client's scheduler. Paced, a worker's throughput is 1/callEvery as long
// as its calls answer within callEvery on average, and drops if they get
// slow for longer than a hiccup or are refused. The test checks
// both the admitted fraction (every premium call, in every phase, is
// admitted) and the admitted throughput (>= 95% of the unpressured
// phase's).
//
// Not parallel: the throughput comparison needs the CPU not shared with
// TestReplicasShareOneLimit's load, so this runs before the parallel
// tests of the package start.
func TestPressureRamp(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and three tollgate processes for about 12s; skipped with -short")
	}
	began := time.Now()
	c := startPressureCluster(t)
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))

	const phaseFor = 1500 * time.Millisecond
	scores := []float64{0, 0.75, 0.85, 0.95, 0.5, 0}
	lengths := []time.Duration{phaseFor, phaseFor, phaseFor, phaseFor, 2 * time.Second, phaseFor}

	stop := make(chan struct{})
	// Pressure 0 before the load starts, so the first phase starts clean.
	c.push(t, 0)
	time.Sleep(settle)
	wait := c.load(t, tiers, 1, stop)
	phases := make([]*phase, len(scores))
	for i, s := range scores {
		p := &phase{score: s, name: fmt.Sprintf("#%d %.2f", i, s), tierStats: map[string]*tierStat{}}
		p.sent, p.acked = c.push(t, s)
		if i > 0 {
			phases[i-1].end = p.sent
		}
		phases[i] = p
		time.Sleep(lengths[i])
	}
	phases[len(phases)-1].end = time.Now()
	close(stop)
	calls := wait()
	for _, p := range phases {
		p.from = p.acked.Add(settle)
		p.judgedWindow = p.end.Sub(p.from)
	}

	var failed []tcall
	for _, cl := range calls {
		if cl.err != nil {
			failed = append(failed, cl)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d calls failed, e.g. %s on replica %d at +%v: %v",
			len(failed), failed[0].tier, failed[0].replica, failed[0].send.Sub(began), failed[0].err)
	}

	// Premium is shed by no step: every premium call of the run, settling
	// margins included, is admitted.
	for _, cl := range calls {
		if cl.tier == "premium" && cl.err == nil && !cl.ok {
			t.Errorf("premium call on replica %d at +%v refused (reason %q)", cl.replica, cl.send.Sub(began), cl.reason)
		}
	}

	// Every refusal must be a shed: the limit is out of reach.
	for _, cl := range calls {
		if cl.err == nil && !cl.ok && cl.reason != "shed" {
			t.Errorf("%s call on replica %d at +%v: OVER_LIMIT with reason %q, want shed", cl.tier, cl.replica, cl.send.Sub(began), cl.reason)
			break
		}
	}

	// Per phase: the calls sent from settle after the push was acked to
	// the next push, each by tier.
	judged := func(p *phase, cl tcall) bool { return !cl.send.Before(p.from) && cl.recv.Before(p.end) }
	for _, p := range phases {
		for _, tier := range tiers {
			p.tierStats[tier] = &tierStat{}
		}
		for _, cl := range calls {
			if cl.err != nil || !judged(p, cl) {
				continue
			}
			st := p.tierStats[cl.tier]
			st.calls++
			switch {
			case cl.ok:
				st.ok++
			case cl.reason == "shed":
				st.shed++
			default:
				st.otherOver++
			}
		}
	}

	// want[i][tier]: admitted (true) or shed (false) in the judged part
	// of phase i. Phase 4 (0.5) is judged separately below, since the
	// hold puts its change inside the phase.
	want := map[int]map[string]bool{
		0: {"premium": true, "standard": true, "free": true},
		1: {"premium": true, "standard": true, "free": false},
		2: {"premium": true, "standard": true, "free": false},
		3: {"premium": true, "standard": false, "free": false},
		5: {"premium": true, "standard": true, "free": true},
	}
	for i, w := range want {
		p := phases[i]
		for tier, admit := range w {
			st := p.tierStats[tier]
			if st.calls == 0 {
				t.Errorf("phase %s: no %s call judged", p.name, tier)
				continue
			}
			if admit && st.ok != st.calls {
				t.Errorf("phase %s: %s admitted %d of %d, want all", p.name, tier, st.ok, st.calls)
			}
			if !admit && st.shed != st.calls {
				t.Errorf("phase %s: %s shed %d of %d, want all", p.name, tier, st.shed, st.calls)
			}
		}
	}

	// Phase 0.5: 0.5 is below every step's above - hysteresis (0.65,
	// 0.85), so the replicas leave step 0.9 for no step at all, but no
	// sooner than hold after they entered it, which was after the 0.95
	// push was sent.
	//   - Lower bound: free was shed continuously from the 0.75 phase on,
	//     and standard on a replica from its first shed standard call
	//     after the 0.95 push on; an admitted call of either after that
	//     was decided after the replica left the step, so its answer came
	//     no sooner than hold after the 0.95 push was sent.
	//   - Upper bound: every replica entered the step within settle of the
	//     0.95 ack and leaves it at its first tick after both the hold and
	//     the 0.5 push: calls sent settle after max(0.95 ack + hold, 0.5
	//     ack) are all admitted.
	p95, p50 := phases[3], phases[4]
	leaveBy := p50.acked
	if h := p95.acked.Add(hold); h.After(leaveBy) {
		leaveBy = h
	}
	heldUntil := p95.sent.Add(hold)
	recovered := map[int]time.Time{} // replica -> first admitted free call after the 0.95 push
	stdShed := map[int]bool{}        // replica -> a standard call was shed after the 0.95 push
	type split struct{ held, heldOK, margin, marginOK, after, afterOK int }
	splits := map[string]*split{"free": {}, "standard": {}}
	for _, cl := range calls {
		if cl.err != nil || (cl.tier != "free" && cl.tier != "standard") || cl.send.Before(p95.sent) || !cl.recv.Before(p50.end) {
			continue
		}
		inStep := cl.tier == "free" || stdShed[cl.replica]
		if !cl.ok && cl.tier == "standard" {
			stdShed[cl.replica] = true
		}
		if cl.ok && inStep && cl.recv.Before(heldUntil) {
			t.Errorf("%s call on replica %d admitted %v after the 0.95 push, before the hold (%v) ran out",
				cl.tier, cl.replica, cl.recv.Sub(p95.sent).Round(time.Millisecond), hold)
		}
		if cl.ok && cl.tier == "free" {
			if _, seen := recovered[cl.replica]; !seen {
				recovered[cl.replica] = cl.recv
			}
		}
		if !cl.ok && !cl.send.Before(leaveBy.Add(settle)) {
			t.Errorf("%s call on replica %d sent %v after the hold ran out (and %v after the 0.5 push) was shed",
				cl.tier, cl.replica, cl.send.Sub(leaveBy).Round(time.Millisecond), cl.send.Sub(p50.acked).Round(time.Millisecond))
		}
		if cl.send.Before(p50.sent) {
			continue
		}
		sp := splits[cl.tier]
		switch {
		case cl.recv.Before(heldUntil):
			sp.held++
			if cl.ok {
				sp.heldOK++
			}
		case cl.send.Before(leaveBy.Add(settle)):
			sp.margin++
			if cl.ok {
				sp.marginOK++
			}
		default:
			sp.after++
			if cl.ok {
				sp.afterOK++
			}
		}
	}
	for i := range c.reps {
		at, ok := recovered[i]
		if !ok {
			t.Errorf("replica %d: free never admitted again in the 0.5 phase", i)
			continue
		}
		t.Logf("replica %d: free admitted again %v after the 0.95 push (hold %v), %v into the 0.5 phase",
			i, at.Sub(p95.sent).Round(time.Millisecond), hold, at.Sub(p50.sent).Round(time.Millisecond))
	}
	for _, tier := range []string{"free", "standard"} {
		sp := splits[tier]
		t.Logf("phase %s %s: held (answered < 0.95 push + hold) %d/%d admitted; margin %d/%d; after hold + settle %d/%d",
			p50.name, tier, sp.heldOK, sp.held, sp.marginOK, sp.margin, sp.afterOK, sp.after)
		if sp.after == 0 {
			t.Errorf("phase %s: no %s call after the hold ran out: the phase is too short to show recovery", p50.name, tier)
		}
	}

	// Premium's admitted throughput, per judged second, against the
	// unpressured phase's.
	rate := func(p *phase, tier string) float64 {
		return float64(p.tierStats[tier].ok) / p.judgedWindow.Seconds()
	}
	base := rate(phases[0], "premium")
	for _, p := range phases {
		line := fmt.Sprintf("phase %-8s judged %v:", p.name, p.judgedWindow.Round(time.Millisecond))
		for _, tier := range tiers {
			st := p.tierStats[tier]
			frac := 0.0
			if st.calls > 0 {
				frac = float64(st.ok) / float64(st.calls)
			}
			line += fmt.Sprintf("  %s %d/%d admitted (%.0f%%, %.0f/s)", tier, st.ok, st.calls, 100*frac, rate(p, tier))
		}
		var lat []time.Duration
		for _, cl := range calls {
			if cl.err == nil && cl.tier == "premium" && judged(p, cl) {
				lat = append(lat, cl.recv.Sub(cl.send))
			}
		}
		slices.Sort(lat)
		if n := len(lat); n > 0 {
			line += fmt.Sprintf("  premium latency p50 %v p99 %v", lat[n/2].Round(time.Microsecond), lat[n*99/100].Round(time.Microsecond))
		}
		t.Log(line)
		if got := rate(p, "premium"); got < 0.95*base {
			t.Errorf("phase %s: premium admitted %.0f/s, want >= 95%% of the unpressured %.0f/s", p.name, got, base)
		}
	}
	t.Logf("%d calls; whole test %v", len(calls), time.Since(began).Round(time.Millisecond))
}

// TestPressureFlapping pushes pressure oscillating around the free
// step's threshold every 100ms and counts, per replica, how often free's
// admitted state flips as a sequential free caller sees it. Counting per
// replica with one caller each is what makes the count exact: each
// replica's Evaluator changes step at its own ticks, so calls spread
// over replicas, or overlapping calls to one, would show changes in an
// order no replica had.
//
// Two oscillations, 3s each:
//   - 0.72 / 0.66: crosses 0.7 but stays above 0.7 - hysteresis, so after
//     free is first shed it stays shed: one flip per replica.
//   - 0.75 / 0.55: crosses the whole hysteresis band, so only the hold
//     keeps the step. Entering a step is immediate and only leaving waits
//     for the hold (counted from the last change), so the hold bounds the
//     recoveries (shed -> admitted): at most duration/hold + 1 of them,
//     the +1 for one that may come at once because the step was entered
//     more than hold before the oscillation began. Each recovery is
//     followed by at most one shed, so at most 2*(duration/hold + 1)
//     flips in all. The sharper check is the hold itself: from the last
//     admitted call before a shed to the first admitted call after it is
//     at least hold.
func TestPressureFlapping(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and three tollgate processes for about 8s; skipped with -short")
	}
	began := time.Now()
	c := startPressureCluster(t)
	c.push(t, 0)
	time.Sleep(settle)

	const (
		flip     = 100 * time.Millisecond
		duration = 3 * time.Second
	)
	oscillate := func(hi, lo float64) (from, to time.Time) {
		from = time.Now()
		for i := 0; time.Since(from) < duration; i++ {
			s := hi
			if i%2 == 1 {
				s = lo
			}
			c.push(t, s)
			time.Sleep(flip)
		}
		return from, time.Now()
	}

	stop := make(chan struct{})
	wait := c.load(t, []string{"free"}, 1, stop)
	time.Sleep(settle)
	aFrom, aTo := oscillate(0.72, 0.66)
	bFrom, bTo := oscillate(0.75, 0.55)
	close(stop)
	calls := wait()
	c.push(t, 0)

	type window struct {
		name     string
		from, to time.Time
		maxFlips int
		maxRecov int
	}
	recoveries := int(duration/hold) + 1
	windows := []window{
		{"0.72/0.66", aFrom, aTo, 1, 0},
		{"0.75/0.55", bFrom, bTo, 2 * recoveries, recoveries},
	}
	for i := range c.reps {
		var mine []tcall
		for _, cl := range calls {
			if cl.replica != i {
				continue
			}
			if cl.err != nil {
				t.Errorf("replica %d: call at +%v failed: %v", i, cl.send.Sub(began), cl.err)
				continue
			}
			mine = append(mine, cl)
		}
		for _, w := range windows {
			flips, recov := 0, 0
			var lastOK *tcall // last admitted call before the current shed run
			var prev *tcall
			for k := range mine {
				cl := &mine[k]
				// A window starts with the call before it (its state then),
				// and counts changes of the calls sent inside it.
				if cl.send.Before(w.from) {
					prev = cl
					if cl.ok {
						lastOK = cl
					}
					continue
				}
				if !cl.send.Before(w.to) {
					break
				}
				if prev != nil && prev.ok != cl.ok {
					flips++
					if cl.ok {
						recov++
						// lastOK is nil if free was shed since before the
						// load began, which the push of 0 rules out.
						if lastOK != nil && cl.recv.Sub(lastOK.send) < hold {
							t.Errorf("replica %d, %s: free shed after +%v and admitted again at +%v: %v, under the hold %v",
								i, w.name, lastOK.send.Sub(began), cl.recv.Sub(began), cl.recv.Sub(lastOK.send), hold)
						}
					}
				}
				if cl.ok {
					lastOK = cl
				}
				prev = cl
			}
			t.Logf("replica %d, %s over %v: free flipped %d times (%d recoveries); at most %d (%d) allowed",
				i, w.name, w.to.Sub(w.from).Round(time.Millisecond), flips, recov, w.maxFlips, w.maxRecov)
			if flips > w.maxFlips || recov > w.maxRecov {
				t.Errorf("replica %d, %s: free flipped %d times with %d recoveries, want at most %d and %d",
					i, w.name, flips, recov, w.maxFlips, w.maxRecov)
			}
		}
	}
	t.Logf("%d calls; whole test %v", len(calls), time.Since(began).Round(time.Millisecond))
}
