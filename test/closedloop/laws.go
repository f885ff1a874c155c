package closedloop

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Law is one of issue 13's laws, as measured on one run. Definition says
// exactly how Measured was computed from the run, so that the table in
// docs/closed-loop.md can be checked against the CSV.
type Law struct {
	Scenario, Name, Definition string
	// Cmp is "<=" or ">=": Pass is Measured Cmp Threshold.
	Cmp                 string
	Threshold, Measured float64
	Unit                string
	// Note says why Measured is missing (NaN), when it is: a law that
	// could not be measured does not pass.
	Note string
	Pass bool
}

func newLaw(name, def, cmp string, threshold, measured float64, unit string) Law {
	l := Law{Name: name, Definition: def, Cmp: cmp, Threshold: threshold, Measured: measured, Unit: unit}
	switch {
	case math.IsNaN(measured):
		l.Pass = false
	case cmp == "<=":
		l.Pass = measured <= threshold
	default:
		l.Pass = measured >= threshold
	}
	return l
}

func (l Law) noted(note string) Law {
	l.Note = note
	return l
}

// Phase names the laws read; scenarios use them.
const (
	PhaseSteady   = "steady"
	PhaseSpike    = "spike"
	PhaseAfter    = "after"
	PhaseOutage   = "outage"
	PhaseRecover  = "recovered"
	PhaseRedisOff = "redis-down"
	PhaseRedisOn  = "redis-back"
)

// LawParams are the figures some laws need beyond the run.
type LawParams struct {
	// Warmup is left out at the start of the steady phase (connections,
	// scripts, the first breaker and pressure readings).
	Warmup time.Duration
	// HotTenant and HotLimit: a tenant driven over a per-minute request
	// limit of HotLimit (after its plan), for "the limits hold".
	HotTenant string
	HotLimit  int
	// Spend is each tenant's settled token spend as Tollgate holds it,
	// and Usage the upstream's real usage; both nil when the scenario has
	// no budgets.
	Spend, Usage map[string]int64
}

// goodput is the tier's 2xx answers a second that ended in [from, to).
func goodput(run *Run, tier string, from, to time.Time) float64 {
	n := 0
	for _, r := range run.Records {
		end := r.Sent.Add(r.Latency)
		if r.Tier == tier && !r.Dropped && r.Source == SourceUpstream && r.Status/100 == 2 && !end.Before(from) && end.Before(to) {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds()
}

// p99 is the nearest-rank p99 of the tier's goodput latencies that ended
// in [from, to).
func p99(run *Run, tier string, from, to time.Time) time.Duration {
	var ls []time.Duration
	for _, r := range run.Records {
		end := r.Sent.Add(r.Latency)
		if r.Tier == tier && !r.Dropped && r.Source == SourceUpstream && r.Status/100 == 2 && !end.Before(from) && end.Before(to) {
			ls = append(ls, r.Latency)
		}
	}
	return Quantile(ls, 0.99)
}

// upAt is the last upstream sample at or before t (zero before any).
func upAt(run *Run, t time.Time) UpstreamStats {
	var s UpstreamStats
	for _, u := range run.Up {
		if u.At.After(t) {
			break
		}
		s = u.UpstreamStats
	}
	return s
}

// overloads is the upstream's overload answers between its samples at
// from and at to.
func overloads(run *Run, from, to time.Time) float64 {
	return float64(upAt(run, to).Overloads() - upAt(run, from).Overloads())
}

// shedState is a replica's shedding as one comparable string: every
// tollgate_pressure_level and tollgate_control_shed_fraction series with
// its value (fractions to 2 decimals), sorted. idle says it sheds
// nothing (every level -1, every fraction 0).
func shedState(v map[string]float64) (state string, idle bool) {
	var parts []string
	idle = true
	for k, x := range v {
		switch {
		case strings.HasPrefix(k, "tollgate_pressure_level"):
			parts = append(parts, fmt.Sprintf("%s=%g", k, x))
			idle = idle && x < 0
		case strings.HasPrefix(k, "tollgate_control_shed_fraction"):
			parts = append(parts, fmt.Sprintf("%s=%.2f", k, x))
			idle = idle && x == 0
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " "), idle
}

// breakerState is the highest tollgate_breaker_state a sample shows
// (0 closed, 1 half-open, 2 open); 0 when none is exported, since a
// breaker that never saw a failure is closed.
func breakerState(v map[string]float64) float64 {
	s := 0.0
	for k, x := range v {
		if strings.HasPrefix(k, "tollgate_breaker_state") {
			s = max(s, x)
		}
	}
	return s
}

// change is a replica's state taking a new value at a sample.
type change struct {
	at    time.Time
	state string
}

func shedChanges(samples []RepSample) []change {
	var out []change
	prev, have := "", false
	for _, s := range samples {
		if s.Err != nil {
			continue
		}
		st, _ := shedState(s.Values)
		if have && st != prev {
			out = append(out, change{s.At, st})
		}
		prev, have = st, true
	}
	return out
}

// stateAt is the replica's shedding state at its last good sample at or
// before t, and the time of that sample.
func stateAt(samples []RepSample, t time.Time) (string, bool) {
	st, ok := "", false
	for _, s := range samples {
		if s.At.After(t) {
			break
		}
		if s.Err == nil {
			st, _ = shedState(s.Values)
			ok = true
		}
	}
	return st, ok
}

// SpikeLaws are issue 13's laws for the free x10 spike: phases steady,
// spike and after.
func SpikeLaws(run *Run, p LawParams) []Law {
	s0, s1, ok1 := run.PhaseWindow(PhaseSteady)
	k0, k1, ok2 := run.PhaseWindow(PhaseSpike)
	if !ok1 || !ok2 {
		return []Law{newLaw("phases", "the run has a steady and a spike phase", ">=", 1, math.NaN(), "").noted("phase missing")}
	}
	s0 = s0.Add(p.Warmup)
	var laws []Law
	for _, g := range []struct {
		tier string
		min  float64
	}{{"premium", 0.95}, {"standard", 0.80}} {
		st, sp := goodput(run, g.tier, s0, s1), goodput(run, g.tier, k0, k1)
		laws = append(laws, newLaw(
			fmt.Sprintf("%s goodput >= %.0f%% of steady", g.tier, g.min*100),
			fmt.Sprintf("%s 2xx answers/s ending in the spike phase, over the same in the steady phase after its warm-up (%.1f/s over %.1f/s)", g.tier, sp, st),
			">=", g.min, ratio(sp, st), "x"))
	}
	pst, psp := p99(run, "premium", s0, s1), p99(run, "premium", k0, k1)
	laws = append(laws, newLaw("premium p99 <= 2x steady",
		fmt.Sprintf("nearest-rank p99 of premium 2xx latencies (send to last byte) ending in the spike, over the same in steady (%v over %v)", psp.Round(time.Millisecond), pst.Round(time.Millisecond)),
		"<=", 2, ratio(psp.Seconds(), pst.Seconds()), "x"))
	laws = append(laws, newLaw("upstream overloads 0 after the spike's first 5 s",
		"upstream 503 queue-full + 504 queue-timeout + 429 answers from 5 s into the spike to the run's end (upstream counters sampled each scrape)",
		"<=", 0, overloads(run, k0.Add(5*time.Second), run.End), "answers"))
	laws = append(laws, newLaw("shedding changes <= 4 a minute",
		"per replica, changes of its shedding state (every tollgate_pressure_level and tollgate_control_shed_fraction series, fractions to 2 decimals) between scrapes, counted in the 60 s after each change; the most of any replica and window",
		"<=", 4, maxChangesPerMinute(run), "changes"))
	laws = append(laws, newLaw("replicas agree within 2 s",
		"the longest span in which the replicas' shedding states differ, each replica's state being its last scrape's (every tollgate_pressure_level and tollgate_control_shed_fraction series, fractions to 2 decimals), on the time grid of all scrapes",
		"<=", 2, agreeLag(run).Seconds(), "s"))
	laws = append(laws, newLaw("full admission within 30 s after the spike",
		"from the spike's end to the later of: the last shed denial, and the first scrape from which every replica sheds nothing to the run's end",
		"<=", 30, fullAdmission(run, k1).Seconds(), "s"))
	laws = append(laws, newLaw("no second overload wave",
		"upstream overload answers (503 queue-full + 504 queue-timeout + 429) from the spike's end to the run's end",
		"<=", 0, overloads(run, k1, run.End), "answers"))
	return laws
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func maxChangesPerMinute(run *Run) float64 {
	most := 0
	for _, samples := range run.Reps {
		cs := shedChanges(samples)
		for i := range cs {
			n := 0
			for j := i; j < len(cs) && cs[j].at.Sub(cs[i].at) < time.Minute; j++ {
				n++
			}
			most = max(most, n)
		}
	}
	return float64(most)
}

// agreeLag is the longest span in which the replicas' shedding states
// differ: on the time grid of every replica's scrapes, each replica's
// state is its last scrape's at or before that time, and a span runs
// from the first grid time the states differ to the first at which they
// agree again (the run's end when they never do). A state that one
// replica shows for a scrape and another passes between its scrapes
// counts only for as long as they differ, not as a state never shown.
func agreeLag(run *Run) time.Duration {
	var grid []time.Time
	for _, samples := range run.Reps {
		for _, s := range samples {
			grid = append(grid, s.At)
		}
	}
	slices.SortFunc(grid, func(a, b time.Time) int { return a.Compare(b) })
	var worst time.Duration
	var from time.Time
	apart := false
	for _, t := range grid {
		agree, first, seen := true, "", false
		for _, samples := range run.Reps {
			st, ok := stateAt(samples, t)
			if !ok {
				continue
			}
			if !seen {
				first, seen = st, true
			} else if st != first {
				agree = false
			}
		}
		switch {
		case !agree && !apart:
			from, apart = t, true
		case agree && apart:
			worst, apart = max(worst, t.Sub(from)), false
		}
	}
	if apart {
		worst = max(worst, run.End.Sub(from))
	}
	return worst
}

func fullAdmission(run *Run, spikeEnd time.Time) time.Duration {
	last := spikeEnd
	for _, r := range run.Records {
		if r.Source == SourceTollgate && r.Reason == "shed" && r.Sent.After(last) {
			last = r.Sent
		}
	}
	for _, samples := range run.Reps {
		// The first good sample from which this replica is idle to the end.
		idleFrom := run.End
		for k := len(samples) - 1; k >= 0; k-- {
			if samples[k].Err != nil {
				continue
			}
			if _, idle := shedState(samples[k].Values); !idle {
				break
			}
			idleFrom = samples[k].At
		}
		if idleFrom.After(last) {
			last = idleFrom
		}
	}
	return max(last.Sub(spikeEnd), 0)
}

// SteadyLaws: at 70% of capacity, no denial but the configured limits.
func SteadyLaws(run *Run, p LawParams) []Law {
	from, to, ok := run.PhaseWindow(PhaseSteady)
	if !ok {
		return []Law{newLaw("phases", "the run has a steady phase", ">=", 1, math.NaN(), "").noted("phase missing")}
	}
	n := 0
	for _, r := range run.Records {
		if r.Sent.Before(from.Add(p.Warmup)) || !r.Sent.Before(to) {
			continue
		}
		if (r.Source == SourceTollgate && r.Reason != "limit") || (r.Source == SourceEnvoy && r.Attempts == 0) {
			n++
		}
	}
	return []Law{newLaw("no denial but the configured limits",
		"requests sent in the steady phase after its warm-up that Tollgate refused for any reason but a limit (x-tollgate-reason other than limit), or that Envoy answered itself",
		"<=", 0, float64(n), "requests")}
}

// breakerSpan is a span in which at least one replica shows the breaker
// not closed, and how many times the cluster's highest state entered
// open in it.
type breakerSpan struct {
	from, to time.Time
	opens    int
}

// opensIn is how many times the breaker went to open within sp, from the
// replicas' transition counters: each replica's last scrape before sp's
// start to its first at or after its end. A probe that fails at
// once spends milliseconds half-open, which no scrape sees; the counters
// do.
func opensIn(run *Run, sp breakerSpan) int {
	n := 0.0
	for _, samples := range run.Reps {
		var before, after float64
		haveAfter := false
		for _, s := range samples {
			if s.Err != nil {
				continue
			}
			v := transitions(s.Values, "open")
			// The span starts at the scrape that shows the opening,
			// whose counter already holds it: before is the scrape
			// before that.
			if s.At.Before(sp.from) {
				before = v
			} else if !s.At.Before(sp.to) && !haveAfter {
				after, haveAfter = v, true
			}
		}
		if haveAfter {
			n += after - before
		}
	}
	return int(n)
}

// closedBy bounds when the breaker of sp closed: the replica whose
// tollgate_breaker_transitions_total{to=closed} rose first within sp made
// the transition after its previous scrape, whose time closedBy returns
// (no earlier than sp.from); sp.to when none rose.
func closedBy(run *Run, sp breakerSpan) time.Time {
	var first time.Time
	at := sp.to
	for _, samples := range run.Reps {
		base, have := 0.0, false
		prev := sp.from
		for _, s := range samples {
			if s.Err != nil {
				continue
			}
			v := transitions(s.Values, "closed")
			if !s.At.After(sp.from) || !have {
				base, have = v, true
				if !s.At.After(sp.from) {
					continue
				}
			}
			// The scrape that ends the span may be the one that shows
			// the close.
			if s.At.After(sp.to) {
				break
			}
			if v > base {
				if first.IsZero() || s.At.Before(first) {
					first, at = s.At, prev
				}
				break
			}
			prev = s.At
		}
	}
	return at
}

// breakerEvent is one replica's breaker state at one of its scrapes.
type breakerEvent struct {
	at    time.Time
	rep   int
	state float64
}

// breakerEvents are every replica's good scrapes' breaker states, in time
// order.
func breakerEvents(run *Run) []breakerEvent {
	var evs []breakerEvent
	for r, samples := range run.Reps {
		for _, s := range samples {
			if s.Err == nil {
				evs = append(evs, breakerEvent{s.At, r, breakerState(s.Values)})
			}
		}
	}
	slices.SortFunc(evs, func(a, b breakerEvent) int { return a.at.Compare(b.at) })
	return evs
}

// transitions sums a scrape's tollgate_breaker_transitions_total series
// into state to ("open", "closed").
func transitions(values map[string]float64, to string) float64 {
	v := 0.0
	for k, x := range values {
		if strings.HasPrefix(k, "tollgate_breaker_transitions_total") && strings.Contains(k, "to="+to) {
			v += x
		}
	}
	return v
}

// breakerSpans merges the replicas' scrapes in time order.
func breakerSpans(run *Run) []breakerSpan {
	evs := breakerEvents(run)
	cur := make([]float64, len(run.Reps))
	var spans []breakerSpan
	var open *breakerSpan
	prevMax := 0.0
	for _, e := range evs {
		cur[e.rep] = e.state
		m := slices.Max(cur)
		switch {
		case m > 0 && open == nil:
			spans = append(spans, breakerSpan{from: e.at})
			open = &spans[len(spans)-1]
		case m == 0 && open != nil:
			open.to = e.at
			open = nil
		}
		if open != nil && m == 2 && prevMax != 2 {
			open.opens++
		}
		prevMax = m
	}
	if open != nil {
		open.to = run.End
	}
	return spans
}

// OutageLaws are the vendor outage's: phases steady, outage (the upstream
// fails) and recovered.
func OutageLaws(run *Run, p LawParams) []Law {
	o0, o1, ok := run.PhaseWindow(PhaseOutage)
	if !ok {
		return []Law{newLaw("phases", "the run has an outage phase", ">=", 1, math.NaN(), "").noted("phase missing")}
	}
	// Opens on all replicas: the latest, over replicas, of the first
	// scrape in the outage showing any breaker open.
	var worst time.Duration
	for _, samples := range run.Reps {
		seen := false
		for _, s := range samples {
			// Open, or half-open: a replica shows half-open only after
			// the breaker opened and its open period ended, which a
			// scrape may have missed (open_for 1s, scrapes every 250ms).
			if s.Err == nil && !s.At.Before(o0) && !s.At.After(o1) && breakerState(s.Values) >= 1 {
				worst, seen = max(worst, s.At.Sub(o0)), true
				break
			}
		}
		if !seen {
			worst = max(worst, o1.Sub(o0))
		}
	}
	laws := []Law{newLaw("breaker opens on all replicas within 1 s",
		"from the outage's start to the last replica's first scrape that shows a tollgate_breaker_state of 2 (open) or 1 (half-open, which follows open); the outage's length when one never does",
		"<=", 1, worst.Seconds(), "s")}
	extra, retries := 0, 0
	for _, sp := range breakerSpans(run) {
		probes := 0
		to := closedBy(run, sp)
		for _, r := range run.Records {
			if !r.Dropped && r.Attempts > 0 && !r.Sent.Before(sp.from) && r.Sent.Before(to) {
				probes++
				retries += r.Attempts - 1
			}
		}
		extra = max(extra, probes-max(sp.opens, opensIn(run, sp)))
	}
	laws = append(laws,
		newLaw("one probe per open interval, cluster-wide",
			"for each span in which any replica shows its breaker not closed: requests sent upstream from the span's start to the last scrape before the breaker's closing transition (the span's end when it never closes; requests after a close are not probes) minus the open intervals in it (the increase of tollgate_breaker_transitions_total{to=open} summed over replicas, each transition counted once by the replica that made it; at least the times a scrape saw the cluster's highest state enter open); the most of any span",
			"<=", 0, float64(extra), "requests"),
		newLaw("retries 0 while open",
			"retries (attempts beyond the first) of requests sent while any replica shows the breaker not closed",
			"<=", 0, float64(retries), "retries"))
	// Closes: from recovery to the first scrape at which every
	// replica's latest scrape shows it closed.
	closed := firstAllClosed(run, o1)
	laws = append(laws, newLaw("closes within 2 s of recovery",
		"from the outage's end (the upstream answers again) to the first moment every replica's latest scrape shows every breaker closed",
		"<=", 2, closed.Sub(o1).Seconds(), "s"))
	return laws
}

func firstAllClosed(run *Run, from time.Time) time.Time {
	evs := breakerEvents(run)
	cur := make([]float64, len(run.Reps))
	for i := range cur {
		cur[i] = 2
	}
	for _, e := range evs {
		cur[e.rep] = e.state
		if !e.at.Before(from) && slices.Max(cur) == 0 {
			return e.at
		}
	}
	return run.End
}

// RedisLaws are the Redis-killed scenario's: phases steady, redis-down
// and redis-back.
func RedisLaws(run *Run, p LawParams) []Law {
	d0, _, ok1 := run.PhaseWindow(PhaseRedisOff)
	b0, _, ok2 := run.PhaseWindow(PhaseRedisOn)
	if !ok1 || !ok2 {
		return []Law{newLaw("phases", "the run has redis-down and redis-back phases", ">=", 1, math.NaN(), "").noted("phase missing")}
	}
	unanswered := 0
	for _, r := range run.Records {
		if !r.Dropped && !r.Sent.Before(d0) && (r.Source == SourceEnvoy && r.Attempts == 0) {
			unanswered++
		}
	}
	laws := []Law{newLaw("every call answered within the deadline by the policy",
		"requests sent from Redis's kill to the run's end that Envoy answered itself (Check failed or timed out) instead of Tollgate's decision",
		"<=", 0, float64(unanswered), "requests")}
	if p.HotTenant != "" && p.HotLimit > 0 {
		var sent []time.Time
		for _, r := range run.Records {
			if r.Tenant == p.HotTenant && !r.Dropped && r.Attempts > 0 {
				sent = append(sent, r.Sent)
			}
		}
		slices.SortFunc(sent, time.Time.Compare)
		most := 0
		for i := range sent {
			j, _ := slices.BinarySearchFunc(sent, sent[i].Add(time.Minute), time.Time.Compare)
			most = max(most, j-i)
		}
		laws = append(laws, newLaw("limits hold: admitted <= limit x 1.1",
			fmt.Sprintf("tenant %s, driven over its %d/min limit: the most requests admitted upstream in any 60 s (by send time), over the limit", p.HotTenant, p.HotLimit),
			"<=", 1.1, float64(most)/float64(p.HotLimit), "x"))
	}
	// Recovery: the first scrape after the restart from which every
	// replica's store circuit is closed.
	rec := math.NaN()
	note := "no replica exports tollgate_store_circuit_state"
	type ev struct {
		at time.Time
		r  int
		v  float64
	}
	var evs []ev
	for r, samples := range run.Reps {
		for _, s := range samples {
			if v, ok := s.Values["tollgate_store_circuit_state"]; ok && s.Err == nil {
				evs = append(evs, ev{s.At, r, v})
			}
		}
	}
	if len(evs) > 0 {
		note = ""
		slices.SortFunc(evs, func(a, b ev) int { return a.at.Compare(b.at) })
		cur := make([]float64, len(run.Reps))
		for i := range cur {
			cur[i] = 2
		}
		rec = run.End.Sub(b0).Seconds()
		for _, e := range evs {
			cur[e.r] = e.v
			if !e.at.Before(b0) && slices.Max(cur) == 0 {
				rec = e.at.Sub(b0).Seconds()
				break
			}
		}
	}
	return append(laws, newLaw("recovery under 1 s",
		"from Redis's restart to the first scrape at which every replica's tollgate_store_circuit_state is 0 (closed)",
		"<=", 1, rec, "s").noted(note))
}

// SpendTenants is who the budget law compares: every tenant that sent a
// request in run (drops excluded) and every name the upstream accounted
// usage to, sorted. A tenant whose requests were all denied is in it too:
// its spend must come back to 0, so a reservation never returned shows.
func SpendTenants(run *Run, usage map[string]int64) []string {
	set := map[string]struct{}{}
	for _, r := range run.Records {
		if !r.Dropped {
			set[r.Tenant] = struct{}{}
		}
	}
	for t := range usage {
		set[t] = struct{}{}
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// BudgetLaws: every tenant's settled spend is within one request's
// estimate error of the upstream's real usage. Every tenant of
// SpendTenants is compared, and one whose spend was not read makes the
// law unmeasured: a law over no tenant, or over some only, would pass on
// nothing.
func BudgetLaws(run *Run, p LawParams) []Law {
	const name = "settled spend within one estimate error of real usage"
	if p.Spend == nil || p.Usage == nil {
		return []Law{newLaw(name, "", "<=", 1, math.NaN(), "x").noted("spend or usage not read")}
	}
	// A tenant's bound is the largest |estimate - actual| of one of its
	// answered requests; with none (all denied), 1 token, so its spend
	// must be what the upstream billed (0 for requests it never served).
	maxErr := map[string]int64{}
	for _, r := range run.Records {
		if r.Dropped || r.Source != SourceUpstream || r.Status/100 != 2 {
			continue
		}
		e := r.Estimate - (r.PromptTokens + r.CompletionTokens)
		maxErr[r.Tenant] = max(maxErr[r.Tenant], e, -e)
	}
	tenants := SpendTenants(run, p.Usage)
	for t := range p.Spend {
		if _, ok := slices.BinarySearch(tenants, t); !ok {
			tenants = append(tenants, t)
		}
	}
	slices.Sort(tenants)
	if len(tenants) == 0 {
		return []Law{newLaw(name, "", "<=", 1, math.NaN(), "x").noted("no tenant compared: none sent a request")}
	}
	var unread []string
	worst, who := -1.0, ""
	var exact int
	var spent, used int64
	for _, tenant := range tenants {
		s, ok := p.Spend[tenant]
		if !ok {
			unread = append(unread, tenant)
			continue
		}
		u := p.Usage[tenant]
		spent, used = spent+s, used+u
		d := s - u
		if d < 0 {
			d = -d
		}
		if d == 0 {
			exact++
		}
		bound := max(maxErr[tenant], 1)
		if q := float64(d) / float64(bound); q > worst {
			worst, who = q, fmt.Sprintf("%s: spend %d, usage %d, bound %d", tenant, s, u, bound)
		}
	}
	def := fmt.Sprintf("per tenant (every one that sent a request or that the upstream billed), |settled token spend in Tollgate - the upstream's real usage| over that tenant's largest |estimate - actual| of one answered request (1 without one); the most of any tenant. %d tenants compared, %d exactly; spend %d, usage %d in all; the most: %s",
		len(tenants)-len(unread), exact, spent, used, who)
	if len(unread) > 0 {
		return []Law{newLaw(name, def, "<=", 1, math.NaN(), "x").noted(fmt.Sprintf("spend of %d tenants not read, %s first", len(unread), unread[0]))}
	}
	return []Law{newLaw(name, def, "<=", 1, worst, "x")}
}

// WriteTable writes laws as a markdown table.
func WriteTable(w io.Writer, laws []Law) error {
	var b strings.Builder
	b.WriteString("| scenario | law | threshold | measured | pass | how it is measured |\n|---|---|---|---|---|---|\n")
	for _, l := range laws {
		m := fmt.Sprintf("%.3g %s", l.Measured, l.Unit)
		if math.IsNaN(l.Measured) {
			m = "n/a"
		}
		if l.Note != "" {
			m += " (" + l.Note + ")"
		}
		pass := "FAIL"
		if l.Pass {
			pass = "pass"
		}
		esc := func(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
		fmt.Fprintf(&b, "| %s | %s | %s %g %s | %s | %s | %s |\n", esc(l.Scenario), esc(l.Name), l.Cmp, l.Threshold, l.Unit, esc(m), pass,
			esc(l.Definition))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
