package storetest

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fairGated reports whether a charge goes through its fair gate: a
// charge or check with a policy on a window or token bucket. A refund or
// a Force charge records what was already spent and asks nobody.
func fairGated(ch *limit.Charge) bool {
	return ch.Fair.Policy != nil && ch.Cost >= 0 && !ch.Force && ch.Algorithm <= limit.TokenBucket
}

// fairRetryAfter is a gate denial's RetryAfter (ms): the end of the
// window's current bucket, or one emission interval of a token bucket,
// saturating at MaxWindow: with Amount 0 the interval is +Inf, whose
// int64 conversion Go leaves to the platform (1 ms after max on amd64).
func fairRetryAfter(ch *limit.Charge, now int64) int64 {
	if ch.Algorithm == limit.TokenBucket {
		return max(int64(min(math.Ceil(limit.EmissionMillis(ch)), float64(limit.MaxWindow/time.Millisecond))), 1)
	}
	return limit.BucketEnd(ch, now) - now
}

// fairModel is model (the reference Store) with the fair states: the gate
// before each fair charge's step with the room its counter has then,
// Record of every fair charge once the decision is known, nothing for a
// voided one. It has no expiry: testFairModel keeps every state alive.
type fairModel struct {
	model
	fair map[string]*limit.FairState
	// gated counts the gate's denials.
	gated int
}

func (md *fairModel) apply(now time.Time, charges []limit.Charge) (bool, []limit.Result) {
	return md.decide(now, charges, &fairDecision{md: md, work: map[string]*limit.FairState{}})
}

// fairDecision is one decision's fair work: the extension of model's.
type fairDecision struct {
	md *fairModel
	// work holds the working copies of the fair states, by FairStateKey.
	work map[string]*limit.FairState
}

var _ extension = (*fairDecision)(nil)

// state returns the working copy of the fair state at key.
func (d *fairDecision) state(key string) *limit.FairState {
	s, ok := d.work[key]
	if !ok {
		s = &limit.FairState{}
		if old := d.md.fair[key]; old != nil {
			s.Clock, s.Keys = old.Clock, slices.Clone(old.Keys)
		}
		d.work[key] = s
	}
	return s
}

func (d *fairDecision) gate(ch *limit.Charge, c *limit.Counter, at int64) (bool, int64) {
	if !fairGated(ch) {
		return true, 0
	}
	room, _ := c.Report(ch, at)
	if d.state(limit.FairStateKey(ch.Key)).Gate(ch.Fair.Policy, at, ch.Fair.Member, ch.Fair.Weight, ch.Cost, int64(min(room, math.MaxInt64))) {
		return true, 0
	}
	// The counter records the time as a step would (its high-water mark).
	c.Touch(ch, at)
	d.md.gated++
	return false, fairRetryAfter(ch, at)
}

func (d *fairDecision) keep(charges []limit.Charge, res []limit.Result, admitted bool, at int64) {
	for i := range charges {
		ch := &charges[i]
		if !fairGated(ch) {
			continue
		}
		out := limit.FairElsewhere
		switch {
		case !res[i].Fits:
			out = limit.FairDenied
		case admitted:
			out = limit.FairAdmitted
		}
		d.state(limit.FairStateKey(ch.Key)).Record(ch.Fair.Policy, at, ch.Fair.Member, ch.Fair.Weight, ch.Cost, out)
	}
	for k, s := range d.work {
		d.md.fair[k] = s
	}
}

// testFairModel runs random decisions on one fair-shared limit of each
// algorithm, by six members (weights among them NaN, 0 and huge, one the
// empty member), with checks, shadow, Force, refunds and costs past the
// limit, the same key twice in a decision, another limit that denies and
// Once marks that void; it requires every answer of the store to equal the
// model's. Time moves by at most a third of Backlog between decisions,
// each of which records into the state, so no store expires it.
func testFairModel(t *testing.T, newStore func(testing.TB) limit.Store) {
	for _, alg := range fairAlgs {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", alg.name, seed), func(t *testing.T) {
				t.Parallel()
				r := newRand(seed)
				e := newEnv(t, newStore)
				p := &limit.FairPolicy{MinShare: 0.1, Backlog: 30 * time.Second, Quantum: 2, Credit: 6}
				shared := e.charge("shared", alg.give)
				other := e.charge("other", limit.Charge{Algorithm: limit.SlidingWindow, Amount: 6, Window: 10 * time.Second, Buckets: 5})
				once := e.charge("once", limit.Charge{Algorithm: limit.Once, Window: 5 * time.Second})
				members := []string{"a", "b", "c", "d", "e", ""}
				weights := []float64{1, 2, 4, math.NaN(), 0, 1e300}
				md := &fairModel{model: model{counters: map[string]*limit.Counter{}}, fair: map[string]*limit.FairState{}}
				now := int64(0)
				const steps = 1500
				for step := range steps {
					if r.IntN(4) == 0 { // else at the same instant: contention
						now += r.Int64N(p.Backlog.Milliseconds()/3 + 1)
					}
					e.at(now)
					m := r.IntN(len(members))
					c := fair(shared, p, members[m], weights[m])
					switch x := r.IntN(20); {
					case x < 2:
						c.Cost = 0
					case x < 3:
						c.Cost = -1 - r.Int64N(3)
					case x < 4:
						c.Cost = 11
					default:
						c.Cost = 1 + r.Int64N(3)
					}
					c.Shadow = r.IntN(10) == 0
					c.Force = c.Cost > 0 && r.IntN(15) == 0
					charges := []limit.Charge{c}
					if r.IntN(8) == 0 {
						m2 := r.IntN(len(members))
						charges = append(charges, cost(fair(shared, p, members[m2], weights[m2]), 1))
					}
					if r.IntN(4) == 0 {
						charges = append(charges, cost(other, 1+r.Int64N(2)))
					}
					if r.IntN(15) == 0 {
						charges = append(charges, cost(once, 1))
					}
					e.sameAsModel(step, now, charges, md.apply, func(c *limit.Charge) string {
						return fmt.Sprintf("%v %q member %q weight %v cost %d shadow %v force %v", c.Algorithm, c.Key[len(c.Key)-6:], c.Fair.Member, c.Fair.Weight, c.Cost, c.Shadow, c.Force)
					})
				}
				t.Logf("%d decisions: %d void, %d denied, %d gate denials", steps, md.voids, md.denials, md.gated)
				if md.voids < steps/100 || md.denials < steps/10 || md.gated < steps/100 {
					t.Errorf("%d void, %d denied decisions, %d gate denials: the schedule misses them", md.voids, md.denials, md.gated)
				}
			})
		}
	}
}
