package limit

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// poissonTier is one plan's tenants in simulatePoisson.
type poissonTier struct {
	name    string
	weight  float64
	tenants int
	// rate is the tier's requests/s over all its tenants, in the steady
	// phase and in the spike.
	rate [2]float64
	// wait is how long a refused request keeps asking, every retry.
	wait int64
}

// ask is one request's ask in simulatePoisson: when, when the request
// first asked, whose, and its arrival's order (ties go by it).
type ask struct {
	at, first int64
	tenant    int
	seq       int
}

// askQueue orders asks by time, then arrival.
type askQueue struct{ asks []ask }

func (q *askQueue) Len() int { return len(q.asks) }
func (q *askQueue) Less(i, j int) bool {
	a, b := &q.asks[i], &q.asks[j]
	return a.at < b.at || a.at == b.at && a.seq < b.seq
}
func (q *askQueue) Swap(i, j int) { q.asks[i], q.asks[j] = q.asks[j], q.asks[i] }
func (q *askQueue) Push(x any)    { q.asks = append(q.asks, x.(ask)) }
func (q *askQueue) Pop() any {
	x := q.asks[len(q.asks)-1]
	q.asks = q.asks[:len(q.asks)-1]
	return x
}

// poissonRun is simulatePoisson's admissions per tenant and second, and
// whether a tenant was refused in each second.
type poissonRun struct {
	tenants  []int // the tier of each tenant
	admitted [][]int64
	refused  [][]bool
}

// simulatePoisson runs the closed-loop spike-queue scenario's shape on a
// fake clock: tenants ask at Poisson times (seeded), steady for 25 s then
// the spike from time 0 for 45 s, against a fair-shared token bucket of
// perSec with a burst of one second; a refused request asks again every
// retry ms until its tier's wait has passed, as the admission queue's
// paced retries do. Seconds are counted from the spike's start.
func simulatePoisson(p *FairPolicy, tiers []poissonTier, perSec uint64, retry int64, seed uint64) poissonRun {
	const steady, spike = 25_000, 45_000
	var run poissonRun
	var rates [][2]float64
	for ti, tr := range tiers {
		for range tr.tenants {
			run.tenants = append(run.tenants, ti)
			rates = append(rates, [2]float64{tr.rate[0] / float64(tr.tenants), tr.rate[1] / float64(tr.tenants)})
		}
	}
	rnd := rand.New(rand.NewPCG(seed, 0x5eed))
	var asks []ask
	for i, r := range rates {
		for at := int64(-steady); ; {
			rate := r[0]
			if at >= 0 {
				rate = r[1]
			}
			at += int64(rnd.ExpFloat64() / rate * 1000)
			if at >= spike {
				break
			}
			asks = append(asks, ask{at: at, first: at, tenant: i, seq: len(asks)})
		}
	}
	q := &askQueue{asks: asks}
	heap.Init(q)
	run.admitted = make([][]int64, spike/1000)
	run.refused = make([][]bool, spike/1000)
	for s := range run.admitted {
		run.admitted[s] = make([]int64, len(rates))
		run.refused[s] = make([]bool, len(rates))
	}
	ch := Charge{Algorithm: TokenBucket, Amount: perSec * 60, Window: time.Minute, Burst: perSec, Cost: 1}
	var (
		st  FairState
		ctr Counter
	)
	base := int64(1_800_000_000_000)
	for q.Len() > 0 {
		a := heap.Pop(q).(ask)
		tr := &tiers[run.tenants[a.tenant]]
		now, key := base+a.at, fmt.Sprint(tr.name, a.tenant)
		room, _ := ctr.Report(&ch, now)
		ok := st.Gate(p, now, key, tr.weight, 1, int64(room))
		if ok {
			ok, _ = ctr.Step(&ch, now)
		} else {
			ctr.Touch(&ch, now)
		}
		out := FairDenied
		if ok {
			out = FairAdmitted
		}
		st.Record(p, now, key, tr.weight, 1, out)
		if !ok && a.at+retry-a.first <= tr.wait {
			heap.Push(q, ask{at: a.at + retry, first: a.first, tenant: a.tenant, seq: a.seq})
		}
		if a.at < 0 || a.at >= spike {
			continue
		}
		if s := a.at / 1000; ok {
			run.admitted[s][a.tenant]++
		} else {
			run.refused[s][a.tenant] = true
		}
	}
	return run
}

// shares returns, for seconds [from, to), each tier's admissions to its
// tenants that were refused at least once in them (backlogged) over their
// number times the tier's weight, relative to the mean of the tiers, as
// the closed loop's proportional-share law computes it.
func (r *poissonRun) shares(tiers []poissonTier, from, to int) []float64 {
	adm, wsum := make([]float64, len(tiers)), make([]float64, len(tiers))
	for i, ti := range r.tenants {
		var n int64
		backlogged := false
		for s := from; s < to; s++ {
			n += r.admitted[s][i]
			backlogged = backlogged || r.refused[s][i]
		}
		if backlogged {
			adm[ti] += float64(n)
			wsum[ti] += tiers[ti].weight
		}
	}
	mean := 0.0
	for ti := range tiers {
		mean += adm[ti] / wsum[ti] / float64(len(tiers))
	}
	out := make([]float64, len(tiers))
	for ti := range tiers {
		out[ti] = adm[ti]/wsum[ti]/mean - 1
	}
	return out
}

// TestFairPoissonTiers: proportional share between tiers whose tenants ask
// at Poisson times, past their shares, at different rates, as in the
// closed loop's spike-queue but on a limit twice as large (3 premium x3, 4
// standard x2 and 33 free x1 tenants on a 100/s token bucket; standard's
// tenants ask least often, 7/s against a share of 4/s; premium and
// standard wait up to 190 ms, free 40 ms). Over the spike after its first
// 5 s, every tier is within 0.02 of the mean, for every seed.
//
// Before the Clock was held at the waiting keys' mean (FairState.settle),
// standard got up to 3.7% less than its share (worst 0.037; with
// standard waiting 40 ms, 2.5-7.2% less in every seed): the Clock ran
// ahead of every key while nobody waited, each key
// then stayed at the floor Credit behind it, and a key that did not ask
// when room freed was lifted and lost what it was owed.
//
// Ten-second blocks are logged, not judged: at any instant a backlogged
// key may be owed up to w x Credit of requests that it has not yet asked
// for (Poisson gaps), which moves a tier's count in a block of about 160
// by a few percent either way (up to 6.3% here). That is mostly the
// arrival process: a quantum of 0.25-0.5, closer to strict F order, cut
// the worst block by about a third in a throwaway simulation.
func TestFairPoissonTiers(t *testing.T) {
	t.Parallel()
	tiers := []poissonTier{
		{name: "premium", weight: 3, tenants: 3, rate: [2]float64{28, 28}, wait: 190},
		{name: "standard", weight: 2, tenants: 4, rate: [2]float64{28, 28}, wait: 190},
		{name: "free", weight: 1, tenants: 33, rate: [2]float64{38, 380}, wait: 40},
	}
	p := &FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 2}
	worst := 0.0
	for seed := range uint64(6) {
		r := simulatePoisson(p, tiers, 100, 20, seed)
		sh := r.shares(tiers, 5, 45)
		var blocks []string
		for b := 5; b+10 <= 45; b += 10 {
			blocks = append(blocks, fmt.Sprintf("%+.3f", r.shares(tiers, b, b+10)))
		}
		t.Logf("seed %d: spike %+.3f; 10 s blocks %s", seed, sh, strings.Join(blocks, " "))
		for ti, d := range sh {
			worst = max(worst, math.Abs(d))
			if math.Abs(d) > 0.02 {
				t.Errorf("seed %d: %s got %+.3f of the tiers' mean share, want within 0.02", seed, tiers[ti].name, d)
			}
		}
	}
	t.Logf("worst %.4f", worst)
}
