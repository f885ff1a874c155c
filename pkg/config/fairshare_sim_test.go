package config

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// TestFairDefaultsManyTenants runs the fair-share defaults on the traffic
// of the closed-loop spike-queue scenario, simulated on a fake clock over
// memstore: 12 premium (weight 3), 20 standard (2) and 400 free (1)
// tenants with Poisson arrivals share a 6,000/min token bucket (burst
// 100); free sends 37/s, then 370/s for 45 s, then 37/s again. In the
// spike every tier wants more than its share; premium's weighted share
// is 100/s x 36/476 = 7.6/s. After it, demand (94/s) is under the limit
// and everything should pass. The control is the defaults this replaced
// (backlog the window, credit one bucket of it): they held room for
// slow free tenants, and after the spike the limit sits mostly idle.
func TestFairDefaultsManyTenants(t *testing.T) {
	t.Parallel()
	d, err := Parse("sim.yaml", []byte(`domain: sim
tiers: {key: tier, default: free, plans: {premium: 3, standard: 2, free: 1}}
descriptors:
  - key: model
    value: m
    rate_limit: {unit: minute, requests_per_unit: 6000, algorithm: token_bucket, burst: 100}
    fair_share: {key: tenant, weights: plan}
`))
	if err != nil {
		t.Fatal(err)
	}
	defaults := d.Descriptors[0].Fair.Rate
	old := *defaults
	old.Backlog, old.Credit = time.Minute, 300
	tests := []struct {
		name        string
		give        *limit.FairPolicy
		wantPremium [2]float64 // admitted/s in the spike, bounds
		wantAfter   float64    // least share of the demand admitted after
	}{
		{name: "defaults", give: defaults, wantPremium: [2]float64{0.8 * 7.6, 1.3 * 7.6}, wantAfter: 0.95},
		// Before the lift's floor was the same for every weight, these
		// also starved premium in the spike (0.07/s); now they waste the
		// limit after it.
		{name: "control: backlog a window, credit a bucket", give: &old, wantPremium: [2]float64{0, math.Inf(1)}, wantAfter: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spike, after := simulateSpike(t, tt.give)
			t.Logf("spike: %v/s; after: %.0f%% of demand", spike, 100*after)
			if p := spike["premium"]; p < tt.wantPremium[0] || p > tt.wantPremium[1] {
				t.Errorf("premium admitted %.1f/s in the spike, want %.1f..%.1f", p, tt.wantPremium[0], tt.wantPremium[1])
			}
			if after < tt.wantAfter {
				t.Errorf("after the spike %.0f%% of the demand was admitted, want at least %.0f%%", 100*after, 100*tt.wantAfter)
			}
			if tt.wantAfter == 0 && after > 0.5 {
				t.Errorf("the control admitted %.0f%% after the spike: it no longer shows the starvation", 100*after)
			}
		})
	}
}

// simulateSpike returns the admitted rate per tier in the spike, and the
// share of the demand admitted in the 20 s after it.
func simulateSpike(t *testing.T, p *limit.FairPolicy) (map[string]float64, float64) {
	t.Helper()
	type tenant struct {
		tier string
		w    float64
		rate [3]float64 // per phase, requests/s
	}
	var ts []tenant
	add := func(n int, tier string, w float64, r [3]float64) {
		for range n {
			ts = append(ts, tenant{tier, w, r})
		}
	}
	add(12, "premium", 3, [3]float64{28.0 / 12, 28.0 / 12, 28.0 / 12})
	add(20, "standard", 2, [3]float64{28.0 / 20, 28.0 / 20, 28.0 / 20})
	add(400, "free", 1, [3]float64{37.0 / 400, 370.0 / 400, 37.0 / 400})
	ends := [3]int64{25_000, 70_000, 110_000} // ms: steady, spike, after
	type arrival struct {
		at     int64
		tenant int
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	var as []arrival
	for i, tn := range ts {
		at := int64(0)
		for ph, end := range ends {
			for {
				gap := int64(rnd.ExpFloat64() / tn.rate[ph] * 1000)
				if at+gap >= end {
					break
				}
				at += gap
				as = append(as, arrival{at, i})
			}
			at = end
		}
	}
	slices.SortStableFunc(as, func(a, b arrival) int { return int(a.at - b.at) })
	st := memstore.New()
	key := limit.Key(limit.Requests, limit.TokenBucket, time.Minute, "sim", []limit.Entry{{Key: "model", Value: "m"}})
	base := time.Unix(1_800_000_000, 0)
	spike := map[string]float64{}
	var asked, admitted float64
	res := make([]limit.Result, 1)
	for _, a := range as {
		tn := ts[a.tenant]
		ch := []limit.Charge{{Key: key, Algorithm: limit.TokenBucket, Amount: 6000, Window: time.Minute, Burst: 100, Cost: 1,
			Fair: limit.FairCharge{Policy: p, Member: limit.FairMember(fmt.Sprint(tn.tier, a.tenant)), Weight: tn.w}}}
		ok, err := st.Apply(context.Background(), base.Add(time.Duration(a.at)*time.Millisecond), ch, res)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case a.at >= ends[0] && a.at < ends[1] && ok:
			spike[tn.tier] += 1 / float64(ends[1]-ends[0]) * 1000
		case a.at >= ends[1]+20_000:
			// The last 20 s: the spike's debts have had 20 s to clear.
			asked++
			if ok {
				admitted++
			}
		}
	}
	return spike, admitted / asked
}
