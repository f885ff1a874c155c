package closedloop

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SpikeQueueFairShare turns on fair_share on the contended gpt-4o limit of
// the spike-queue scenario (SpikeQueueRules' one fairShareLine) and the
// fair-share laws (FairShareLaws). false runs the same scenario without
// fair share, the comparison docs/closed-loop-spike-queue.md describes.
const SpikeQueueFairShare = true

// The contended shared limit of spike-queue: the shipped gpt4o_global
// token bucket lowered from 10,000/min (burst 500), which the traffic never
// reaches, to 3,000/min (50/s) with a burst of 50: under the steady 94/s
// already, and by eight times in the free x10 spike, so that every tenant
// asks well past its fair share (FairShareLaws needs backlogged tenants)
// and free requests are refused by the limit and wait in the queue.
const (
	contendedPerMinute = 3000
	contendedBurst     = 50
	shippedGlobalLimit = "requests_per_unit: 10000\n      algorithm: token_bucket\n      burst: 500"
	// shippedTenantModelLimit is the shipped per-tenant gpt-4o limit
	// (100/min x plan), which spike-queue's few busy tenants would meet
	// before the shared one: raised out of the way.
	shippedTenantModelLimit = "name: tenant_gpt4o_requests\n          unit: minute\n          requests_per_unit: 100\n"
	// fairShareLine is the one line that makes the limit fair-shared by
	// tenant, weighted by plan (docs/fair-share.md, "What a rule declares"),
	// at the rule's level beside rate_limit.
	fairShareLine = "    fair_share: {key: tenant, weights: plan}\n"
)

// SpikeQueueTenants are spike-queue's tenants per tier: few, so that each
// asks well past its fair share of the contended limit and is backlogged
// (a premium tenant 9.3/s against 2.2/s, a standard one 7/s against
// 1.5/s, a free one 7.6/s in the spike against 0.75/s), and under the
// shipped per-tenant limit of 600/min x plan. With the 12/20/400,
// a free tenant asks once a second against a fifth of one and no tenant
// is backlogged for the fair-share laws to judge.
var SpikeQueueTenants = map[string]int{"premium": 3, "standard": 4, "free": 50}

// shippedFairShare is the gpt-4o rule's fair_share block in the shipped
// rules: the key and its indented lines.
var shippedFairShare = regexp.MustCompile(`\n    fair_share:\n(?:      [^\n]*\n)+`)

// QueueTier is one tier's queue bound in spike-queue's rules.
type QueueTier struct {
	Tier      string
	MaxWait   time.Duration
	MaxLength int
}

// SpikeQueueTiers are the queue's tiers, highest priority first. The paid
// tiers wait as long as each other: a tenant whose refused request waits
// asks again while it waits, and with standard at 40 ms its tenants, who
// ask least often, were the ones a freed unit of room most often found
// not asking (pkg/limit's TestFairPoissonTiers: 0.036 at 40 ms). Each
// bound plus waitSlack is a bucket bound of tollgate_queue_wait_seconds,
// which the laws read (pkg/app/queue.go: 0.1, 0.25). Every wait is under the shipped ext_authz timeout (250 ms, so a wait is cut at
// 225 ms) with WaitTolerance to spare: the tier's bound, not Envoy's
// timeout, ends a wait, and a Check that Envoy timed out breaks the law.
var SpikeQueueTiers = []QueueTier{
	{Tier: "premium", MaxWait: 190 * time.Millisecond, MaxLength: 100},
	{Tier: "standard", MaxWait: 190 * time.Millisecond, MaxLength: 100},
	{Tier: "free", MaxWait: 40 * time.Millisecond, MaxLength: 50},
}

// WaitTolerance is what a Check may take beyond its tier's max_wait: the
// last store call after the bound, gRPC both ways, and scheduling on two
// shared cores.
const WaitTolerance = 50 * time.Millisecond

// SpikeQueueFlags are spike-queue's flags beyond TollgateFlags: an
// in-flight capacity of 1 per replica, so that every decision is made at
// in-flight pressure 1 (the Check itself is in flight), and the retry
// budget must be 0 on every admitted request. The pressure is the count
// of Checks in flight at the moment of the decision, which no metric
// exports per decision and envoysim cannot bound from outside (a loaded
// replica starts counting a Check an unknown time after envoysim sent
// it: the second run, with capacity 8 and a 10 ms margin, judged 5 of
// 22 budgets wrong that may have been right). Pinned, the law is exact;
// the budget's other values are pkg/limit's property test's.
var SpikeQueueFlags = []string{"--pressure-capacity", strconv.Itoa(spikeQueueCapacity)}

// spikeQueueCapacity is the replicas' --pressure-capacity in spike-queue.
const spikeQueueCapacity = 1

// SpikeQueueRules returns shipped (config/inference.yaml) with the gpt-4o
// shared limit made contended, shedding off, the queue and the retry
// budget on, and,
// with fair set, the limit fair-shared by tenant.
func SpikeQueueRules(shipped string, fair bool) (string, error) {
	if !strings.Contains(shipped, shippedGlobalLimit) {
		return "", fmt.Errorf("spike-queue rules: the shipped gpt4o_global limit (%q) is not in the rules", shippedGlobalLimit)
	}
	out := strings.Replace(shipped, shippedGlobalLimit,
		fmt.Sprintf("requests_per_unit: %d\n      algorithm: token_bucket\n      burst: %d", contendedPerMinute, contendedBurst), 1)
	if !strings.Contains(out, shippedTenantModelLimit) {
		return "", fmt.Errorf("spike-queue rules: the shipped tenant_gpt4o_requests limit (%q) is not in the rules", shippedTenantModelLimit)
	}
	out = strings.Replace(out, shippedTenantModelLimit, strings.Replace(shippedTenantModelLimit, ": 100\n", ": 100000\n", 1), 1)
	// Shedding off, steps and all. The in-flight controller sheds free
	// before the limit refuses it, and a shed request never waits
	// (docs/admission-queue.md, "What waits"): with it, the first run's
	// queue held no one. The steps read the in-flight pressure, which
	// SpikeQueueFlags pins at 1. The contended limit is what protects the
	// upstream here.
	if !strings.Contains(out, "\nshedding:\n") {
		return "", fmt.Errorf("spike-queue rules: no shedding section")
	}
	out = RulesWithout(out, "shedding")
	// The shipped rules share gpt-4o fairly already; the scenario writes
	// its own line (or none, for the comparison without fair share).
	out = shippedFairShare.ReplaceAllString(out, "\n")
	if fair {
		const at = "  - key: model\n    value: gpt-4o\n"
		if !strings.Contains(out, at) {
			return "", fmt.Errorf("spike-queue rules: no top-level gpt-4o rule (%q) for fair_share", at)
		}
		out = strings.Replace(out, at, at+fairShareLine, 1)
	}
	var b strings.Builder
	b.WriteString(out)
	b.WriteString("\n# spike-queue (test/closedloop/spikequeue.go): the admission queue and the retry budget.\nqueue:\n  poll: 50ms\n  tiers:\n")
	for _, t := range SpikeQueueTiers {
		fmt.Fprintf(&b, "    - {tier: %s, max_wait: %s, max_length: %d}\n", t.Tier, t.MaxWait, t.MaxLength)
	}
	b.WriteString("retry_budget: {}\n")
	return b.String(), nil
}

// routeRetries is envoy/envoy-ext-authz.yaml's num_retries: what the
// router allows a request that carries no x-envoy-max-retries.
const routeRetries = 1

// effectiveRetries is the retries the router allows r: Tollgate's header,
// or the route's num_retries without one.
func effectiveRetries(r Record) int {
	if r.MaxRetries < 0 {
		return routeRetries
	}
	return r.MaxRetries
}

// heldAt says whether replica rep's scrapes on both sides of t (its last
// good one at or before t and its first good one after) satisfy ok: the
// state held, as far as the scrapes can tell, when t's decision was made.
func heldAt(samples []RepSample, t time.Time, ok func(map[string]float64) bool) bool {
	var before, after map[string]float64
	for _, s := range samples {
		if s.Err != nil {
			continue
		}
		if !s.At.After(t) {
			before = s.Values
			continue
		}
		after = s.Values
		break
	}
	return before != nil && after != nil && ok(before) && ok(after)
}

// SpikeQueueLaws are issue 16's bounded-wait and retry-budget laws, on a
// run with phases steady, spike and after.
func SpikeQueueLaws(run *Run, p LawParams) []Law {
	k0, k1, ok := run.PhaseWindow(PhaseSpike)
	if !ok {
		return []Law{newLaw("phases", "the run has a spike phase", ">=", 1, math.NaN(), "").noted("phase missing")}
	}
	bound := map[string]QueueTier{}
	for _, t := range SpikeQueueTiers {
		bound[t.Tier] = t
	}
	var laws []Law

	laws = append(laws, queueWaitLaw(run, bound))

	// The queue's length, per replica and tier, at every scrape.
	longest := math.NaN()
	worstLen := ""
	for r, samples := range run.Reps {
		for _, s := range samples {
			for k, v := range s.Values {
				if !strings.HasPrefix(k, "tollgate_queue_length{") {
					continue
				}
				for _, t := range SpikeQueueTiers {
					if strings.Contains(k, "tier="+t.Tier) {
						if q := v / float64(t.MaxLength); math.IsNaN(longest) || q > longest {
							longest, worstLen = q, fmt.Sprintf("replica %d, %s: %g of %d", r, t.Tier, v, t.MaxLength)
						}
					}
				}
			}
		}
	}
	l := newLaw("queue length never over max_length",
		"per replica and tier, tollgate_queue_length at every scrape over the tier's max_length; the most (scrapes every 250 ms: a peak between two is not seen; the queue refuses past its length in code, pkg/admission/queue.go). The most: "+worstLen,
		"<=", 1, longest, "x")
	if math.IsNaN(longest) {
		l = l.noted("no replica exports tollgate_queue_length: the queue is off")
	}
	laws = append(laws, l)

	// The queue was used: without waits the bounded-wait law holds on
	// nothing.
	waited := 0.0
	for _, samples := range run.Reps {
		last := math.NaN()
		for _, s := range samples {
			if s.Err != nil {
				continue
			}
			n := 0.0
			for k, v := range s.Values {
				if strings.HasPrefix(k, "tollgate_queue_wait_seconds_count{") && strings.Contains(k, "outcome=admitted") {
					n += v
				}
			}
			last = n
		}
		if !math.IsNaN(last) {
			waited += last
		}
	}
	laws = append(laws, newLaw("the queue admits waiters",
		"waits that ended admitted (tollgate_queue_wait_seconds_count{outcome=admitted}, every tier, summed over replicas at their last scrape)",
		">=", 1, waited, "waits"))

	laws = append(laws, premiumWaitLaw(run, k0, k1, bound["premium"].MaxWait))

	// Retry budget: every admitted request carries the header.
	admitted, bare := 0, 0
	for _, r := range run.Records {
		if !r.Dropped && r.Attempts > 0 && r.Replica >= 0 {
			admitted++
			if r.MaxRetries < 0 {
				bare++
			}
		}
	}
	laws = append(laws, newLaw("every admitted request carries x-envoy-max-retries",
		fmt.Sprintf("requests sent upstream after a Check without x-envoy-max-retries from Tollgate (the retry budget is on for the domain); %d sent upstream", admitted),
		"<=", 0, float64(bare), "requests"))

	laws = append(laws, retryZeroLaw(run))

	retried, beyond := 0, 0
	for _, r := range run.Records {
		if r.Dropped || r.Attempts == 0 {
			continue
		}
		retried += r.Attempts - 1
		if r.Attempts-1 > effectiveRetries(r) {
			beyond++
		}
	}
	laws = append(laws, newLaw("retries within x-envoy-max-retries",
		fmt.Sprintf("requests whose retries (attempts beyond the first, as the simulator sent them) exceed the x-envoy-max-retries the router saw (the route's num_retries, %d, without one); %d retries in all", routeRetries, retried),
		"<=", 0, float64(beyond), "requests"))
	if SpikeQueueFairShare {
		laws = append(laws, FairShareLaws(run, p)...)
	}
	return laws
}

// FairWindow is the window of the fair-share laws.
const FairWindow = time.Second

// fairWeights are the plans of config/inference.yaml: on a fair-shared
// limit the plan is the weight.
var fairWeights = map[string]float64{"premium": 3, "standard": 2, "free": 1}

// FairShareLaws are issue 16's fair-share laws on the spike phase:
// proportional share between backlogged tenants over the spike after its
// warm-up, and the hard cap in every window. A request counts against the shared
// limit when it was sent upstream (the Check admitted it), at its
// decision (send + Check time); a tenant is backlogged in a window when
// Tollgate refused one of its requests for a limit in it.
func FairShareLaws(run *Run, p LawParams) []Law {
	k0, k1, ok := run.PhaseWindow(PhaseSpike)
	if !ok {
		return []Law{newLaw("phases", "the run has a spike phase", ">=", 1, math.NaN(), "").noted("phase missing")}
	}
	n := int(k1.Sub(k0) / FairWindow)
	admitted := make([]map[string]float64, n)
	backlog := make([]map[string]bool, n)
	tier := map[string]string{}
	for i := range n {
		admitted[i], backlog[i] = map[string]float64{}, map[string]bool{}
	}
	for _, r := range run.Records {
		if r.Dropped || r.Replica < 0 {
			continue
		}
		at := r.Sent.Add(r.Check)
		if at.Before(k0) {
			continue
		}
		w := int(at.Sub(k0) / FairWindow)
		if w >= n {
			continue
		}
		tier[r.Tenant] = r.Tier
		switch {
		case r.Attempts > 0:
			admitted[w][r.Tenant]++
		case r.Source == SourceTollgate && r.Reason == "limit":
			backlog[w][r.Tenant] = true
		}
	}
	// Proportional share, by tier: over windows [b, e), the tenants of a
	// tier that a limit refused at least once in them (with demand past
	// their share), the tier's admissions over their number times the
	// tier's weight, against the mean of the tiers. By tier, not by
	// tenant: one tenant's count is too small to compare to 2%.
	share := func(b, e int) (float64, string) {
		backlogged := map[string]bool{}
		for w := b; w < e; w++ {
			for t := range backlog[w] {
				backlogged[t] = true
			}
		}
		tenants, got := map[string]float64{}, map[string]float64{}
		for t := range backlogged {
			tenants[tier[t]]++
			for w := b; w < e; w++ {
				got[tier[t]] += admitted[w][t]
			}
		}
		mean := 0.0
		for tr, k := range tenants {
			mean += got[tr] / (k * fairWeights[tr]) / float64(len(tenants))
		}
		if len(tenants) < 2 || mean == 0 {
			return math.NaN(), ""
		}
		// Each tenant's admissions, fewest and most per tier.
		lo, hi := map[string]float64{}, map[string]float64{}
		for t := range backlogged {
			n := 0.0
			for w := b; w < e; w++ {
				n += admitted[w][t]
			}
			if v, ok := lo[tier[t]]; !ok || n < v {
				lo[tier[t]] = n
			}
			hi[tier[t]] = max(hi[tier[t]], n)
		}
		spread := 0.0
		var parts []string
		for _, tr := range slices.Sorted(maps.Keys(tenants)) {
			d := got[tr]/(tenants[tr]*fairWeights[tr])/mean - 1
			spread = max(spread, math.Abs(d))
			parts = append(parts, fmt.Sprintf("%s %+.3f (%g of %g tenants admitted %g, each %g-%g)", tr, d, tenants[tr], float64(SpikeQueueTenants[tr]), got[tr], lo[tr], hi[tr]))
		}
		return spread, strings.Join(parts, ", ")
	}
	// Judged over the spike after the warm-up: when the spike begins, the
	// free tenants that were under their share are owed up to the credit
	// and catch up (the algorithm's bounded debt, docs/fair-share.md); in
	// the first run premium got 0.63 of the mean in the spike's first 5 s.
	//
	// Not judged per 10 windows: a backlogged tenant asking at Poisson
	// times may be owed up to its weight x credit of requests it has not
	// asked for yet, so a tier's count in a 10-window block (about 60
	// for premium here) moves by a few percent either way, mostly with the
	// arrivals (pkg/limit's TestFairPoissonTiers: up to 6.3% on a limit
	// twice this one, 0.016 over the spike). The
	// blocks are listed in the detail; the three-replica test on one Redis
	// (test/fairshare), whose tenants ask on a steady beat, judges every
	// 10 windows.
	warm := int(p.Warmup / FairWindow)
	spread, all := share(warm, n)
	var perBlock []string
	for b := warm; b+10 <= n; b += 10 {
		if d, parts := share(b, b+10); !math.IsNaN(d) {
			perBlock = append(perBlock, fmt.Sprintf("windows %d-%d: %.3f (%s)", b, b+9, d, parts))
		}
	}
	l := newLaw("proportional share within 0.02 over the spike",
		fmt.Sprintf("over the %d %v windows of the spike after its first %v, for each tier: requests admitted to the tier's tenants that a limit refused at least once in them, over their number times the tier's weight (its plan), relative to the mean of the tiers; the largest |ratio/mean - 1| of any tier (%s). Not judged, each 10 windows: %s", max(n-warm, 0), FairWindow, p.Warmup, all, strings.Join(perBlock, "; ")),
		"<=", 0.02, spread, "")
	if math.IsNaN(spread) {
		l = l.noted("no two tiers backlogged after the warm-up")
	}
	// Hard cap: a token bucket admits at most its burst plus its rate
	// times the window in any window, and a fair-shared limit is never
	// scaled by the plan.
	limit := float64(contendedBurst) + float64(contendedPerMinute)/60*FairWindow.Seconds()
	most := 0.0
	for _, a := range admitted {
		s := 0.0
		for _, v := range a {
			s += v
		}
		most = max(most, s)
	}
	return []Law{l, newLaw("hard cap never exceeded per window",
		fmt.Sprintf("requests admitted upstream (at send + Check time) in each %v window of the spike, the most, over the shared limit's burst + rate x window (%g)", FairWindow, limit),
		"<=", 1, most/limit, "x")}
}

// spikeQueuePhases are spike-queue's: the spike scenario's, with a spike
// twice as long. The proportional-share law is judged over the spike,
// and what decides whether a tier is 2% off over it is the debts at its
// two ends: every backlogged tenant may be owed up to its weight x credit
// of requests (4-6 for a paid tenant here) at any instant, against about
// 270 admissions a paid tier in 40 s. Over 40 s six runs had standard
// 1.4-2.0% under the tiers' mean counted at decision time, and premium
// 1.4-2.2% over it counted at send time; 85 s halves that.
func spikeQueuePhases(d func(float64) time.Duration) []Phase {
	return []Phase{
		{Name: PhaseSteady, Duration: d(25)},
		{Name: PhaseSpike, Duration: d(90), Scale: map[string]float64{"free": SpikeFactor}},
		{Name: PhaseAfter, Duration: d(40)},
	}
}

// waitBuckets are tollgate_queue_wait_seconds' bucket bounds
// (pkg/app/queue.go), in seconds.
var waitBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10, 30}

// waitSlack is what a wait may pass its bound by: the waiter's last
// store call, begun before the bound, may end after it, and one call is
// bounded by --store-timeout (50 ms in TollgateFlags), plus 10 ms of
// scheduling. The run with slack 10 ms and bounds 50/50/100 ms saw 67 of
// 7,785 waits past it, and premium's p99 in the 0.25 s bucket.
const waitSlack = 60 * time.Millisecond

// queueWaitLaw: no wait the queue measured (tollgate_queue_wait_seconds,
// every outcome) beyond its tier's max_wait. The histogram tells only
// buckets, so a wait counts as over when it is above the first bucket at
// or past max_wait + waitSlack. The Checks' own times (wait plus the
// decision's service time on a loaded machine) are reported beside it.
func queueWaitLaw(run *Run, bound map[string]QueueTier) Law {
	over, total := 0.0, 0.0
	seen := false
	var parts []string
	for _, t := range SpikeQueueTiers {
		le := math.Inf(1)
		for _, b := range waitBuckets {
			if b >= (t.MaxWait + waitSlack).Seconds() {
				le = b
				break
			}
		}
		tierOver, tierAll := 0.0, 0.0
		for _, samples := range run.Reps {
			var last map[string]float64
			for _, s := range samples {
				if s.Err == nil {
					last = s.Values
				}
			}
			for k, v := range last {
				if !strings.Contains(k, "tier="+t.Tier) {
					continue
				}
				switch {
				case strings.HasPrefix(k, "tollgate_queue_wait_seconds_count{"):
					seen = true
					tierAll += v
					tierOver += v
				case strings.HasPrefix(k, "tollgate_queue_wait_seconds_bucket{") && strings.Contains(k, "le="+strconv.FormatFloat(le, 'g', -1, 64)+","):
					tierOver -= v
				}
			}
		}
		over, total = over+tierOver, total+tierAll
		parts = append(parts, fmt.Sprintf("%s (max_wait %v): %g of %g over %gs", t.Tier, t.MaxWait, tierOver, tierAll, le))
	}
	checks, slow := 0, 0
	var worst time.Duration
	for _, r := range run.Records {
		b, ok := bound[r.Tier]
		if r.Dropped || r.Replica < 0 || !ok {
			continue
		}
		checks++
		if r.Check > b.MaxWait+WaitTolerance {
			slow++
		}
		worst = max(worst, r.Check-b.MaxWait)
	}
	l := newLaw("no queue wait over its tier's max_wait",
		fmt.Sprintf("waits the queue observed (tollgate_queue_wait_seconds, every outcome, each replica's last scrape) above the first histogram bucket at or past the tier's max_wait + %v: %s. Not asserted: %d of %d Checks took longer than max_wait + %v end to end (wait plus the decision on these 2 shared cores), the most by %v",
			waitSlack, strings.Join(parts, "; "), slow, checks, WaitTolerance, worst.Round(time.Millisecond)),
		"<=", 0, over, "waits")
	if !seen {
		l = newLaw(l.Name, l.Definition, "<=", 0, math.NaN(), "waits").noted("no replica exports tollgate_queue_wait_seconds: the queue is off")
	}
	return l
}

// checkMargin is how far apart, at most, envoysim's and Tollgate's views
// of a Check's start and end are (a gRPC hop each way on loopback, on a
// loaded machine): a Check whose envoysim interval covers another's with
// this margin on both sides was in flight on the replica while the other
// was decided.
const checkMargin = 10 * time.Millisecond

// inFlightLowerBound is, for each record decided by a replica, at least
// how many Checks that replica had in flight when it decided it: itself
// and every other Check to the same replica whose interval covers its
// own by checkMargin on both sides. The retry budget's pressure is that
// count over --pressure-capacity (pressure.InFlight), which no metric
// exports per decision; a lower bound is what the records can prove.
func inFlightLowerBound(run *Run) []int {
	type iv struct {
		i        int
		from, to time.Time
	}
	byRep := map[int][]iv{}
	for i, r := range run.Records {
		if r.Dropped || r.Replica < 0 || r.Check <= 0 {
			continue
		}
		from := r.Sent.Add(r.CheckAfter)
		byRep[r.Replica] = append(byRep[r.Replica], iv{i, from, from.Add(r.Check)})
	}
	out := make([]int, len(run.Records))
	for _, ivs := range byRep {
		slices.SortFunc(ivs, func(a, b iv) int { return a.from.Compare(b.from) })
		for k, x := range ivs {
			n := 1
			for j := k - 1; j >= 0; j-- {
				y := ivs[j]
				if x.from.Sub(y.from) > time.Second {
					break // no Check outlives Envoy's timeout by that much
				}
				if !y.from.After(x.from.Add(-checkMargin)) && !y.to.Before(x.to.Add(checkMargin)) {
					n++
				}
			}
			out[x.i] = n
		}
	}
	return out
}

// retryZeroLaw: an admitted request's x-envoy-max-retries is 0 when its
// replica was at pressure >= 0.9 (at least 0.9 x capacity Checks in
// flight by inFlightLowerBound) or its breaker was not closed (both
// scrapes around the decision show it).
func retryZeroLaw(run *Run) Law {
	need := int(math.Ceil(0.9 * spikeQueueCapacity))
	flights := inFlightLowerBound(run)
	byPressure, byBreaker, nonzero := 0, 0, 0
	values := map[int]int{}
	for i, r := range run.Records {
		if r.Dropped || r.Attempts == 0 || r.Replica < 0 {
			continue
		}
		pressured := flights[i] >= need
		broken := r.Replica < len(run.Reps) && heldAt(run.Reps[r.Replica], r.Sent.Add(r.CheckAfter+r.Check),
			func(v map[string]float64) bool { return breakerState(v) >= 1 })
		if !pressured && !broken {
			continue
		}
		if pressured {
			byPressure++
		}
		if broken {
			byBreaker++
		}
		values[effectiveRetries(r)]++
		if effectiveRetries(r) > 0 {
			nonzero++
		}
	}
	l := newLaw("max-retries 0 while the breaker is open or pressure >= 0.9",
		fmt.Sprintf("admitted requests decided at pressure >= 0.9 (at least %d of --pressure-capacity %d Checks in flight on the deciding replica: itself and the Checks whose envoysim interval covers its own by %v each side) or with the breaker not closed (the replica's scrapes on both sides of the decision show tollgate_breaker_state >= 1), whose x-envoy-max-retries as the router saw it was not 0 (none counts as the route's num_retries, %d); %d such requests by pressure, %d by breaker; their budgets: %v",
			need, spikeQueueCapacity, checkMargin, routeRetries, byPressure, byBreaker, values),
		"<=", 0, float64(nonzero), "requests")
	if byPressure+byBreaker == 0 {
		l = newLaw(l.Name, l.Definition, "<=", 0, math.NaN(), "requests").noted("no request was decided under pressure >= 0.9 or a breaker not closed")
	}
	return l
}

// waitHist sums tollgate_queue_wait_seconds of tier (every outcome) over
// the replicas, as the increase from each one's last good scrape at or
// before from to its last at or before to: the count, and the cumulative
// count at each bucket bound.
func waitHist(run *Run, tier string, from, to time.Time) (count float64, buckets map[float64]float64, seen bool) {
	buckets = map[float64]float64{}
	for _, samples := range run.Reps {
		var a, b map[string]float64
		for _, s := range samples {
			if s.Err != nil {
				continue
			}
			if !s.At.After(from) {
				a = s.Values
			}
			if !s.At.After(to) {
				b = s.Values
			}
		}
		add := func(v map[string]float64, sign float64) {
			for k, x := range v {
				if !strings.Contains(k, "tier="+tier) {
					continue
				}
				switch {
				case strings.HasPrefix(k, "tollgate_queue_wait_seconds_count{"):
					seen = true
					count += sign * x
				case strings.HasPrefix(k, "tollgate_queue_wait_seconds_bucket{"):
					for _, le := range waitBuckets {
						if strings.Contains(k, "le="+strconv.FormatFloat(le, 'g', -1, 64)+",") {
							buckets[le] += sign * x
						}
					}
				}
			}
		}
		add(b, 1)
		add(a, -1)
	}
	return count, buckets, seen
}

// premiumWaitLaw: at the 10x burst, premium's p99 wait is under its bound
// while free is refused. A premium request that never waited waited 0;
// the waits are the queue's histogram's, so the p99 is known to the
// bucket: the law measures the bucket bound that holds it.
func premiumWaitLaw(run *Run, k0, k1 time.Time, bound time.Duration) Law {
	n, freeRefused := 0, 0
	var checks []time.Duration
	for _, r := range run.Records {
		if r.Dropped || r.Replica < 0 || r.Sent.Before(k0) || !r.Sent.Before(k1) {
			continue
		}
		switch r.Tier {
		case "premium":
			n++
			checks = append(checks, r.Check)
		case "free":
			if r.Source == SourceTollgate {
				freeRefused++
			}
		}
	}
	w, buckets, seen := waitHist(run, "premium", k0, k1)
	p99 := math.NaN()
	note := ""
	switch {
	case !seen:
		note = "no replica exports tollgate_queue_wait_seconds: the queue is off"
	case n == 0 || freeRefused == 0:
		note = "free was never refused in the spike, or premium sent nothing then"
	default:
		total := max(float64(n), w)
		rank := math.Ceil(0.99 * total)
		zeros := total - w
		p99 = math.Inf(1)
		if rank <= zeros {
			p99 = 0
		} else {
			for _, le := range waitBuckets {
				if buckets[le] >= rank-zeros {
					p99 = le * 1000
					break
				}
			}
		}
	}
	return newLaw("premium p99 wait under its bound while free is shed",
		fmt.Sprintf("the spike's premium requests (%d; free refused %d times then), those the queue held counted at their wait (tollgate_queue_wait_seconds{tier=premium}, every outcome, its increase over the spike summed over replicas: %g waits), the others at 0: the bound of the histogram bucket that holds the nearest-rank p99, against premium's max_wait + %v (the last store call). Not asserted: the p99 of premium Checks end to end is %v",
			n, freeRefused, w, waitSlack, Quantile(checks, 0.99).Round(time.Millisecond)),
		"<=", float64((bound + waitSlack).Milliseconds()), p99, "ms").noted(note)
}
