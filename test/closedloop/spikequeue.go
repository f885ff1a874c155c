package closedloop

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// SpikeQueueFairShare turns on fair_share on the contended gpt-4o limit of
// the spike-queue scenario (SpikeQueueRules' one fairShareLine) and the
// fair-share laws (FairShareLaws). It is off until the fair-share config
// (issue 16, item 1's wiring) is merged: a rules file with fair_share does
// not parse before it, and the replicas would not start.
const SpikeQueueFairShare = false

// The contended shared limit of spike-queue: the shipped gpt4o_global
// token bucket lowered from 10,000/min (burst 500), which the traffic never
// reaches, to 6,000/min (100/s) with a burst of 100: under the steady 94/s,
// above by four times in the free x10 spike, so free requests are refused
// by the limit and wait in the queue.
const (
	contendedPerMinute = 6000
	contendedBurst     = 100
	shippedGlobalLimit = "requests_per_unit: 10000\n      algorithm: token_bucket\n      burst: 500"
	// fairShareLine is the one line that makes the limit fair-shared by
	// tenant, weighted by plan (docs/fair-share.md, "What a rule declares"),
	// at the rule's level beside rate_limit.
	fairShareLine = "    fair_share: {key: tenant, weights: plan}\n"
)

// QueueTier is one tier's queue bound in spike-queue's rules.
type QueueTier struct {
	Tier      string
	MaxWait   time.Duration
	MaxLength int
}

// SpikeQueueTiers are the queue's tiers, highest priority first. Every
// wait is under the shipped ext_authz timeout (250 ms, so a wait is cut at
// 225 ms) with WaitTolerance to spare: the tier's bound, not Envoy's
// timeout, ends a wait, and a Check that Envoy timed out breaks the law.
var SpikeQueueTiers = []QueueTier{
	{Tier: "premium", MaxWait: 150 * time.Millisecond, MaxLength: 100},
	{Tier: "standard", MaxWait: 100 * time.Millisecond, MaxLength: 100},
	{Tier: "free", MaxWait: 50 * time.Millisecond, MaxLength: 50},
}

// WaitTolerance is what a Check may take beyond its tier's max_wait: the
// last store call after the bound, gRPC both ways, and scheduling on two
// shared cores.
const WaitTolerance = 50 * time.Millisecond

// SpikeQueueFlags are spike-queue's flags beyond TollgateFlags: an
// in-flight capacity per replica, so that the retry budget has a pressure
// input (without it the pressure reads 0 and the law "0 at pressure >=
// 0.9" is never exercised). 20 Checks in flight on one replica is about
// what a third of the spike's free refusals, each held up to 50 ms, keeps
// there.
var SpikeQueueFlags = []string{"--pressure-capacity", "20"}

// SpikeQueueRules returns shipped (config/inference.yaml) with the gpt-4o
// shared limit made contended, the queue and the retry budget on, and,
// with fair set, the limit fair-shared by tenant.
func SpikeQueueRules(shipped string, fair bool) (string, error) {
	if !strings.Contains(shipped, shippedGlobalLimit) {
		return "", fmt.Errorf("spike-queue rules: the shipped gpt4o_global limit (%q) is not in the rules", shippedGlobalLimit)
	}
	out := strings.Replace(shipped, shippedGlobalLimit,
		fmt.Sprintf("requests_per_unit: %d\n      algorithm: token_bucket\n      burst: %d", contendedPerMinute, contendedBurst), 1)
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

// repValue is the largest value of a series of family name (a prefix of
// its key) in one scrape; NaN when the scrape has none.
func repValue(values map[string]float64, name string) float64 {
	v := math.NaN()
	for k, x := range values {
		if k == name || strings.HasPrefix(k, name+"{") {
			if math.IsNaN(v) || x > v {
				v = x
			}
		}
	}
	return v
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

// retryZeroState is the retry budget's "must be 0" state in one scrape:
// the breaker open or half-open, or the replica's own pressure (the
// in-flight signal, the budget's pressure input) at or above 0.9.
func retryZeroState(v map[string]float64) bool {
	return breakerState(v) >= 1 || repValue(v, "tollgate_pressure_local_score") >= 0.9
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

	// Bounded wait, per request: its Check's time.
	over, checked := 0, 0
	worst, who := time.Duration(0), ""
	for _, r := range run.Records {
		b, ok := bound[r.Tier]
		if r.Dropped || r.Replica < 0 || !ok {
			continue
		}
		checked++
		if r.Check > b.MaxWait+WaitTolerance {
			over++
		}
		if d := r.Check - b.MaxWait; d > worst {
			worst, who = d, fmt.Sprintf("%s %v over its %v", r.Tier, r.Check.Round(time.Millisecond), b.MaxWait)
		}
	}
	l := newLaw(fmt.Sprintf("no wait over its tier's max_wait + %v", WaitTolerance),
		fmt.Sprintf("requests whose Check (envoysim's send to answer, Envoy's timeout included) took longer than the tier's max_wait (premium 150 ms, standard 100 ms, free 50 ms) + %v; %d Checks, the most over its bound: %s", WaitTolerance, checked, who),
		"<=", 0, float64(over), "requests")
	if checked == 0 {
		l = newLaw(l.Name, l.Definition, "<=", 0, math.NaN(), "requests").noted("no Check recorded")
	}
	laws = append(laws, l)

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
	l = newLaw("queue length never over max_length",
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

	// Premium's p99 wait in the seconds in which free was refused.
	shedSecs := map[int64]bool{}
	for _, r := range run.Records {
		if r.Tier == "free" && !r.Dropped && r.Source == SourceTollgate && !r.Sent.Before(k0) && r.Sent.Before(k1) {
			shedSecs[r.Sent.Unix()] = true
		}
	}
	var waits []time.Duration
	for _, r := range run.Records {
		if r.Tier == "premium" && !r.Dropped && r.Replica >= 0 && shedSecs[r.Sent.Unix()] && !r.Sent.Before(k0) && r.Sent.Before(k1) {
			waits = append(waits, r.Check)
		}
	}
	pb := bound["premium"].MaxWait
	pw := math.NaN()
	note := ""
	if len(waits) == 0 {
		note = "free was never refused in the spike, or premium sent nothing then"
	} else {
		pw = Quantile(waits, 0.99).Seconds() * 1000
	}
	laws = append(laws, newLaw("premium p99 wait under its bound while free is shed",
		fmt.Sprintf("nearest-rank p99 of premium Check times sent in the spike's seconds in which a free request was refused by Tollgate (%d seconds, %d premium Checks), against premium's max_wait", len(shedSecs), len(waits)),
		"<=", float64(pb.Milliseconds()), pw, "ms").noted(note))

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

	// 0 whenever the breaker is open or pressure >= 0.9.
	inState, nonzero := 0, 0
	for _, r := range run.Records {
		if r.Dropped || r.Attempts == 0 || r.Replica < 0 || r.Replica >= len(run.Reps) {
			continue
		}
		if heldAt(run.Reps[r.Replica], r.Sent.Add(r.Check), retryZeroState) {
			inState++
			if effectiveRetries(r) > 0 {
				nonzero++
			}
		}
	}
	l = newLaw("max-retries 0 while the breaker is open or pressure >= 0.9",
		fmt.Sprintf("admitted requests whose deciding replica's scrapes on both sides of the decision show a tollgate_breaker_state >= 1 or a tollgate_pressure_local_score >= 0.9 (this replica's in-flight signal, the budget's pressure input), and whose x-envoy-max-retries as the router saw it was not 0 (none counts as the route's num_retries, %d); %d such requests", routeRetries, inState),
		"<=", 0, float64(nonzero), "requests")
	if inState == 0 {
		l = newLaw(l.Name, l.Definition, "<=", 0, math.NaN(), "requests").noted("no request was decided under pressure >= 0.9 or a breaker not closed")
	}
	laws = append(laws, l)

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
// proportional share between backlogged tenants over every 10 windows,
// and the hard cap in every window. A request counts against the shared
// limit when it was sent upstream (the Check admitted it), at its
// decision (send + Check time); a tenant is backlogged in a window when
// Tollgate refused one of its requests for a limit in it.
func FairShareLaws(run *Run, _ LawParams) []Law {
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
	// Proportional share: over each 10 consecutive windows, the tenants
	// backlogged in every one of them; admitted/weight of each over the
	// mean of theirs.
	spread, blocks := math.NaN(), 0
	for b := 0; b+10 <= n; b += 10 {
		var ratios []float64
		for t := range backlog[b] {
			all := true
			for w := b; w < b+10 && all; w++ {
				all = backlog[w][t]
			}
			if !all {
				continue
			}
			sum := 0.0
			for w := b; w < b+10; w++ {
				sum += admitted[w][t]
			}
			ratios = append(ratios, sum/fairWeights[tier[t]])
		}
		if len(ratios) < 2 {
			continue
		}
		blocks++
		mean := 0.0
		for _, x := range ratios {
			mean += x
		}
		mean /= float64(len(ratios))
		if mean == 0 {
			continue
		}
		for _, x := range ratios {
			if d := math.Abs(x/mean - 1); math.IsNaN(spread) || d > spread {
				spread = d
			}
		}
	}
	l := newLaw("proportional share within 0.02 over 10 windows",
		fmt.Sprintf("for each %d consecutive %v windows of the spike, over the tenants refused for a limit in every one of them: admitted requests over the tenant's weight (its plan), relative to their mean; the largest |ratio/mean - 1| of any tenant and block (%d blocks with two or more such tenants)", 10, FairWindow, blocks),
		"<=", 0.02, spread, "")
	if math.IsNaN(spread) {
		l = l.noted("no 10 windows with two tenants backlogged in each")
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

// spikeQueuePhases are spike-queue's: the spike scenario's.
func spikeQueuePhases(d func(float64) time.Duration) []Phase {
	return []Phase{
		{Name: PhaseSteady, Duration: d(25)},
		{Name: PhaseSpike, Duration: d(45), Scale: map[string]float64{"free": SpikeFactor}},
		{Name: PhaseAfter, Duration: d(40)},
	}
}
