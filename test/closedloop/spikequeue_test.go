package closedloop

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	qlen    = "tollgate_queue_length{domain=inference,tier=free}"
	qcount  = "tollgate_queue_wait_seconds_count{domain=inference,outcome=admitted,tier=free}"
	qbucket = "tollgate_queue_wait_seconds_bucket{domain=inference,le=0.1,outcome=admitted,tier=free}"
	pcount  = "tollgate_queue_wait_seconds_count{domain=inference,outcome=admitted,tier=premium}"
	pb05    = "tollgate_queue_wait_seconds_bucket{domain=inference,le=0.05,outcome=admitted,tier=premium}"
	pb1     = "tollgate_queue_wait_seconds_bucket{domain=inference,le=0.1,outcome=admitted,tier=premium}"
	pb25    = "tollgate_queue_wait_seconds_bucket{domain=inference,le=0.25,outcome=admitted,tier=premium}"
	pb5     = "tollgate_queue_wait_seconds_bucket{domain=inference,le=0.5,outcome=admitted,tier=premium}"
)

// queueRun is a spike-queue run in which every law holds: steady [0,10),
// spike [10,30), after [30,40); one replica scraped every second; free
// refused for its limit in the spike, its waits counted by the histogram;
// 80 premium requests in the spike, one of which waited 30 ms; every
// admitted request with a budget of 0 (the scenario's capacity of 1 puts
// every decision at pressure 1).
type queueRun struct {
	premiumWaits float64 // premium waits in the spike, each of premiumWait
	premiumWait  string  // the bucket key they fall in
	budget       int     // the header Tollgate set on every admitted request
	attempts     int
	queueLen     float64 // the scraped free queue length
	overWaits    float64 // free waits the histogram puts past 0.1 s
	queueOff     bool    // no queue series at all
	noChecks     bool    // no request records its Check (Replica -1)
}

func healthyQueue() queueRun {
	return queueRun{premiumWaits: 1, premiumWait: pb05, attempts: 1, queueLen: 20}
}

func (q queueRun) build() *Run {
	b := newRun(40, PhaseSteady, 0.0, PhaseSpike, 10.0, PhaseAfter, 30.0)
	for s := 0.0; s <= 40; s++ {
		v := map[string]float64{}
		if !q.queueOff {
			v[qlen], v[qcount], v[qbucket] = q.queueLen, 10*s, 10*s-q.overWaits
			v[pcount], v[pb05], v[pb1], v[pb25], v[pb5] = 0, 0, 0, 0, 0
			if s >= 20 {
				v[pcount] = q.premiumWaits
				// Cumulative: the wait's bucket and every wider one.
				in := false
				for _, k := range []string{pb05, pb1, pb25, pb5} {
					in = in || k == q.premiumWait
					if in {
						v[k] = q.premiumWaits
					}
				}
			}
		}
		b.scrape(0, s, v)
	}
	rep := 0
	if q.noChecks {
		rep = -1
	}
	for s := 0.25; s < 40; s += 0.5 {
		b.rec(Record{Sent: at(s), Tier: "premium", Tenant: "premium-0", Result: Result{Status: 200, Source: SourceUpstream,
			Attempts: q.attempts, MaxRetries: q.budget, Check: 5 * time.Millisecond, Replica: rep}})
		if s >= 10 && s < 30 {
			b.rec(Record{Sent: at(s), Tier: "free", Tenant: "free-0", Result: Result{Status: 429, Source: SourceTollgate,
				Reason: "limit", Check: 60 * time.Millisecond, Replica: rep, MaxRetries: -1}})
		}
	}
	return b.run
}

func TestSpikeQueueLaws(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give func(*queueRun)
		// want: each law (by name prefix) that fails; every other passes.
		want []string
	}{
		{name: "healthy", give: func(*queueRun) {}},
		{
			// 2 of 80 waited 100-250 ms: within 190 ms + 60 ms.
			name: "premium's p99 in the 0.25 s bucket",
			give: func(q *queueRun) { q.premiumWaits, q.premiumWait = 2, pb25 },
		},
		{
			// Free waits past 0.1 s against a 40 ms bound + 60 ms.
			name: "a wait past its tier's bound",
			give: func(q *queueRun) { q.overWaits = 3 },
			want: []string{"no queue wait over"},
		},
		{
			name: "the queue off",
			give: func(q *queueRun) { q.queueOff = true },
			want: []string{"no queue wait over", "queue length", "the queue admits", "premium p99 wait"},
		},
		{
			name: "a queue past its length",
			give: func(q *queueRun) { q.queueLen = 51 },
			want: []string{"queue length"},
		},
		{
			// 2 of 80 premium requests waited 250-500 ms: the p99 is in
			// the 0.5 s bucket, over the 190 ms bound + 60 ms.
			name: "premium held while free is shed",
			give: func(q *queueRun) { q.premiumWaits, q.premiumWait = 2, pb5 },
			want: []string{"no queue wait over", "premium p99 wait"},
		},
		{
			// 1 of 80 waited 250-500 ms: the p99 (rank 80) is that one.
			name: "premium's p99 is its slowest of 80",
			give: func(q *queueRun) { q.premiumWait = pb5 },
			want: []string{"no queue wait over", "premium p99 wait"},
		},
		{
			name: "the retry budget off: no header",
			give: func(q *queueRun) { q.budget = -1 },
			want: []string{"every admitted request carries", "max-retries 0"},
		},
		{
			name: "the retry budget a constant 3",
			give: func(q *queueRun) { q.budget = 3 },
			want: []string{"max-retries 0"},
		},
		{
			// No Check recorded: nothing to judge the budget or waits by.
			name: "no Checks",
			give: func(q *queueRun) { q.noChecks = true },
			want: []string{"max-retries 0", "premium p99 wait"},
		},
		{
			name: "retries beyond the header",
			give: func(q *queueRun) { q.attempts = 2 },
			want: []string{"retries within"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := healthyQueue()
			tt.give(&q)
			laws := SpikeQueueLaws(q.build(), LawParams{Warmup: time.Second})
			if len(laws) != 7+len(fairShareLawNames) {
				t.Fatalf("%d laws, want %d: %+v", len(laws), 7+len(fairShareLawNames), laws)
			}
			// The fair-share laws are TestFairShareLaws' (this run has no
			// backlogged tenants for them).
			laws = slices.DeleteFunc(laws, func(l Law) bool {
				return slices.ContainsFunc(fairShareLawNames, func(n string) bool { return strings.HasPrefix(l.Name, n) })
			})
			for _, l := range laws {
				fail := false
				for _, w := range tt.want {
					fail = fail || strings.HasPrefix(l.Name, w)
				}
				if l.Pass == fail {
					t.Errorf("law %q: pass = %v, want %v (measured %g %s; %s; %s)", l.Name, l.Pass, !fail, l.Measured, l.Unit, l.Note, l.Definition)
				}
			}
		})
	}
}

// fairShareLawNames are the laws SpikeQueueLaws adds with
// SpikeQueueFairShare.
var fairShareLawNames = func() []string {
	if SpikeQueueFairShare {
		return []string{"proportional share", "hard cap"}
	}
	return nil
}()

func TestSpikeQueueRules(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(ShippedRules())
	if err != nil {
		t.Fatal(err)
	}
	shipped := string(data)
	tests := []struct {
		name     string
		give     string
		giveFair bool
		want     []string
		wantNot  []string
		wantErr  bool
	}{
		{
			name:    "queue and budget on a contended limit",
			give:    shipped,
			want:    []string{"requests_per_unit: 3000\n      algorithm: token_bucket\n      burst: 50", "name: tenant_gpt4o_requests\n          unit: minute\n          requests_per_unit: 100000\n", "\nqueue:\n", "{tier: free, max_wait: 40ms, max_length: 50}", "\nretry_budget: {}\n"},
			wantNot: []string{"requests_per_unit: 10000\n", "requests_per_unit: 100\n", "\n    fair_share:", "\nshedding:", "  steps:"},
		},
		{
			name:     "fair share is one line on the model rule",
			give:     shipped,
			giveFair: true,
			want:     []string{"  - key: model\n    value: gpt-4o\n    fair_share: {key: tenant, weights: plan}\n    rate_limit:\n      name: gpt4o_global"},
		},
		{name: "the shipped limit changed", give: strings.Replace(shipped, "burst: 500", "burst: 400", 1), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := SpikeQueueRules(tt.give, tt.giveFair)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want an error: %v", err, tt.wantErr)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("rules lack %q:\n%s", w, got)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(got, w) {
					t.Errorf("rules have %q", w)
				}
			}
			if n := strings.Count(got, "\n    fair_share:"); tt.giveFair && n != 1 {
				t.Errorf("fair_share %d times, want once", n)
			}
		})
	}
}

func TestFairShareLaws(t *testing.T) {
	t.Parallel()
	var buildHalves func(first, second [2]int) *Run
	// spike [0,20): two backlogged tenants, premium (weight 3) and free
	// (weight 1), refused in every window; per window premium admitted
	// give[0], free give[1].
	build := func(perWindow [2]int) *Run { return buildHalves(perWindow, perWindow) }
	buildHalves = func(first, second [2]int) *Run {
		b := newRun(20, PhaseSpike, 0.0)
		for w := range 20 {
			perWindow := first
			if w >= 10 {
				perWindow = second
			}
			for i, tn := range []struct{ tier, name string }{{"premium", "premium-0"}, {"free", "free-0"}} {
				b.rec(Record{Sent: at(float64(w) + 0.9), Tier: tn.tier, Tenant: tn.name,
					Result: Result{Status: 429, Source: SourceTollgate, Reason: "limit", Replica: 0}})
				for k := range perWindow[i] {
					b.rec(Record{Sent: at(float64(w) + 0.8*float64(k)/float64(perWindow[i])), Tier: tn.tier, Tenant: tn.name,
						Result: Result{Status: 200, Source: SourceUpstream, Attempts: 1, Replica: 0}})
				}
			}
		}
		return b.run
	}
	tests := []struct {
		name      string
		give      [2]int
		second    [2]int // windows 10-19, when not give
		wantShare float64
		wantCap   float64
	}{
		// Premium 160 a weight in windows 0-9, free 120; then premium
		// 140, free 180: each block 1/7 off, the spike exactly 1 to 1.
		{name: "fair over the spike, not in each 10 windows", give: [2]int{48, 12}, second: [2]int{42, 18}, wantShare: 0, wantCap: 0.6},
		// The cap is burst + rate x window: 50 + 50 = 100 a window.
		{name: "3 to 1 by weight, under the cap", give: [2]int{45, 15}, wantShare: 0, wantCap: 0.6},
		// 72/3 = 24 against 28: each 1/13 from their mean of 26.
		{name: "skewed", give: [2]int{72, 28}, wantShare: 2.0 / 26, wantCap: 1},
		{name: "over the cap", give: [2]int{150, 50}, wantShare: 0, wantCap: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			run := build(tt.give)
			if tt.second != ([2]int{}) {
				run = buildHalves(tt.give, tt.second)
			}
			laws := FairShareLaws(run, LawParams{})
			share, hard := findLaw(t, laws, "proportional share"), findLaw(t, laws, "hard cap")
			if math.Abs(share.Measured-tt.wantShare) > 1e-9 || share.Pass != (tt.wantShare <= 0.02) {
				t.Errorf("share = %g (pass %v), want %g", share.Measured, share.Pass, tt.wantShare)
			}
			if math.Abs(hard.Measured-tt.wantCap) > 1e-9 || hard.Pass != (tt.wantCap <= 1) {
				t.Errorf("hard cap = %g (pass %v), want %g", hard.Measured, hard.Pass, tt.wantCap)
			}
		})
	}
}
