package closedloop

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

const (
	qlen   = "tollgate_queue_length{domain=inference,tier=free}"
	qwait  = "tollgate_queue_wait_seconds_count{domain=inference,outcome=admitted,tier=free}"
	plocal = "tollgate_pressure_local_score{domain=inference,scope=global}"
)

// queueRun is a spike-queue run in which every law holds: steady [0,10),
// spike [10,30), after [30,40); one replica scraped every second, its
// pressure at 0.95 in [15,20); free refused for its limit in the spike,
// premium's Checks quick, every admitted request with a budget that is 0
// under pressure and 3 otherwise.
type queueRun struct {
	premiumCheck, freeCheck time.Duration
	maxRetries              func(sec float64) int // the header Tollgate set
	attempts                int
	queueLen                float64 // the scraped free queue length
	queueOff                bool    // no queue series at all
	pressure                float64 // in [15,20)
}

func healthyQueue() queueRun {
	return queueRun{
		premiumCheck: 5 * time.Millisecond, freeCheck: 60 * time.Millisecond, attempts: 1, queueLen: 20, pressure: 0.95,
		maxRetries: func(sec float64) int {
			if sec >= 15 && sec < 20 {
				return 0
			}
			return 3
		},
	}
}

func (q queueRun) build() *Run {
	b := newRun(40, PhaseSteady, 0.0, PhaseSpike, 10.0, PhaseAfter, 30.0)
	for s := 0.0; s <= 40; s++ {
		v := map[string]float64{plocal: 0.3}
		if s >= 15 && s < 20 {
			v[plocal] = q.pressure
		}
		if !q.queueOff {
			v[qlen], v[qwait] = q.queueLen, s
		}
		b.scrape(0, s, v)
	}
	for s := 0.25; s < 40; s += 0.5 {
		b.rec(Record{Sent: at(s), Tier: "premium", Tenant: "premium-0", Result: Result{Status: 200, Source: SourceUpstream,
			Attempts: q.attempts, MaxRetries: q.maxRetries(s), Check: q.premiumCheck, Replica: 0}})
		if s >= 10 && s < 30 {
			b.rec(Record{Sent: at(s), Tier: "free", Tenant: "free-0", Result: Result{Status: 429, Source: SourceTollgate,
				Reason: "limit", Check: q.freeCheck, Replica: 0, MaxRetries: -1}})
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
			// A wait cut by Envoy's 250 ms timeout instead of the tier's
			// 50 ms bound, as with max_wait 1s.
			name: "a wait past its tier's bound",
			give: func(q *queueRun) { q.freeCheck = 250 * time.Millisecond },
			want: []string{"no wait over"},
		},
		{
			name: "the queue off",
			give: func(q *queueRun) { q.queueOff, q.freeCheck = true, 2*time.Millisecond },
			want: []string{"queue length", "the queue admits"},
		},
		{
			name: "a queue past its length",
			give: func(q *queueRun) { q.queueLen = 51 },
			want: []string{"queue length"},
		},
		{
			name: "premium held while free is shed",
			// Within premium's 150 ms + tolerance, over its 150 ms bound.
			give: func(q *queueRun) { q.premiumCheck = 180 * time.Millisecond },
			want: []string{"premium p99 wait"},
		},
		{
			name: "the retry budget off: no header",
			give: func(q *queueRun) { q.maxRetries = func(float64) int { return -1 } },
			want: []string{"every admitted request carries", "max-retries 0"},
		},
		{
			name: "the retry budget a constant 3",
			give: func(q *queueRun) { q.maxRetries = func(float64) int { return 3 } },
			want: []string{"max-retries 0"},
		},
		{
			// Never under pressure: the law has nothing to judge.
			name: "no pressure at all",
			give: func(q *queueRun) { q.pressure = 0.5 },
			want: []string{"max-retries 0"},
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
			if len(laws) != 7 {
				t.Fatalf("%d laws, want 7: %+v", len(laws), laws)
			}
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
			want:    []string{"requests_per_unit: 6000\n      algorithm: token_bucket\n      burst: 100", "\nqueue:\n", "{tier: free, max_wait: 50ms, max_length: 50}", "\nretry_budget: {}\n"},
			wantNot: []string{"requests_per_unit: 10000", "fair_share"},
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
			if n := strings.Count(got, "fair_share"); tt.giveFair && n != 1 {
				t.Errorf("fair_share %d times, want once", n)
			}
		})
	}
}

func TestFairShareLaws(t *testing.T) {
	t.Parallel()
	// spike [0,20): two backlogged tenants, premium (weight 3) and free
	// (weight 1), refused in every window; per window premium admitted
	// give[0], free give[1].
	build := func(perWindow [2]int) *Run {
		b := newRun(20, PhaseSpike, 0.0)
		for w := range 20 {
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
		wantShare float64
		wantCap   float64
	}{
		{name: "3 to 1 by weight, under the cap", give: [2]int{75, 25}, wantShare: 0, wantCap: 0.5},
		// 72/3 = 24 against 28: each 1/13 from their mean of 26.
		{name: "skewed", give: [2]int{72, 28}, wantShare: 2.0 / 26, wantCap: 0.5},
		{name: "over the cap", give: [2]int{300, 100}, wantShare: 0, wantCap: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			laws := FairShareLaws(build(tt.give), LawParams{})
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
