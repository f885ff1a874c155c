package admission_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// noBurst is a Shedder whose active step has burst: false for every tier.
type noBurst struct{}

func (noBurst) Shed(_, _, _ string) limit.ShedState { return limit.ShedState{NoBurst: true} }

// TestBurstFloorSteadyStream is issue 13's premium case: a steady stream
// at a shared token bucket's rate, whose arrivals jitter as any real
// stream's do, while a shedding step with burst: false is active. With
// the default floor (one second of the rate) it sees no 429; with a
// floor of a millisecond (a burst of 1, the old behaviour) it sees many,
// which is what the floor is for.
func TestBurstFloorSteadyStream(t *testing.T) {
	t.Parallel()
	const rate = 30 // per second, the bucket's rate and the stream's
	tests := []struct {
		name       string
		floor      time.Duration
		wantDenied bool
	}{
		{name: "default floor", floor: 0, wantDenied: false},
		{name: "one second", floor: time.Second, wantDenied: false},
		{name: "a burst of 1", floor: time.Millisecond, wantDenied: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := limit.NewRuleSet(&limit.Domain{
				Name: "d",
				Shedding: &limit.Shedding{
					Steps:      []limit.ShedStep{{Above: 0.8, NoBurst: true}},
					BurstFloor: tt.floor,
				},
				Descriptors: []*limit.Rule{{Key: "model", Value: "m", RateLimit: &limit.Limit{
					Amount: rate, Unit: limit.Second, Algorithm: limit.TokenBucket, Burst: 5 * rate,
				}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
			l := admission.NewLimiter(memstore.New(), clock, rs, admission.WithShedder(noBurst{}))
			rnd := rand.New(rand.NewPCG(13, 13))
			period := time.Second / rate
			start := clock.Now()
			denied := 0
			const n = 60 * rate // a minute
			for i := range n {
				// Each arrival is up to half a period late: the stream
				// keeps the bucket's rate on average and never passes it.
				jitter := time.Duration(rnd.Int64N(int64(period / 2)))
				clock.Set(start.Add(time.Duration(i)*period + jitter))
				dec, err := l.Decide(context.Background(), &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
					{Entries: []limit.Entry{{Key: "model", Value: "m"}}},
				}})
				if err != nil {
					t.Fatal(err)
				}
				if dec.Code != limit.CodeOK {
					denied++
				}
			}
			if got := denied > 0; got != tt.wantDenied {
				t.Errorf("%d of %d requests denied; want some denied: %v", denied, n, tt.wantDenied)
			}
			t.Logf("%d of %d denied", denied, n)
		})
	}
}
