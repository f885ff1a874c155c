package pressure

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Shared steps. Each replica reads the same combined score from the
// Board, but an Evaluator of its own would still enter and leave steps
// on its own hold timer: replicas a tick apart then disagree for up to a
// hold (issue 13 measured a run that took 57 s to return to full
// admission). With CombinerConfig.Cells the step and its hold are one
// record per scope, kept as the Controller keeps its fractions:
//
//   - each tick the replica loads the scope's cell; a state computed
//     within the last Interval, by any replica, is adopted as it is;
//   - otherwise the replica computes the next state from the newer of the
//     cell's and its own (Update's rules: hysteresis, hold), at its
//     combined score, and swaps it in at the version it loaded; the loser
//     of a race adopts the winner's. So one replica computes per Interval
//     and every replica steps within an Interval of it, with one hold;
//   - a replica that starts late adopts the cluster's step and the time
//     its hold started.
//
// When the cell cannot be loaded, or the board could not be read this
// tick (the combined score is then this replica's alone, which must not
// become every replica's step), the replica evaluates alone from the
// last state it held, as without Cells, and counts it
// (Evaluator.Fallbacks). When the swap fails, the state computed from
// the cell stands here unshared and is counted alike. Once the store
// answers again the newer state wins: a replica that stepped alone
// during the outage writes its state if no replica has written since,
// and adopts the cluster's otherwise.

// stepTTL is how long a step cell lives after its last write: a few
// intervals at least, so that ticks a little late do not lose the hold.
func stepTTL(interval time.Duration) time.Duration { return max(4*interval, time.Minute) }

// maxStepBy caps the replica name a step record carries, so that a long
// --replica-id cannot make every record too large for a cell.
const maxStepBy = 64

// stepKey is the cell of domain's scope under policy p. The key carries
// a digest of what gives a level its meaning and decides its changes
// (the steps, hysteresis and hold): during a rollout of a new policy the
// replicas on each policy share a record of their own instead of
// adopting levels of the other's steps.
func stepKey(domain, scope string, p *Policy) string {
	h := sha256.New()
	fmt.Fprintf(h, "%v|%v|%v", p.Steps, p.Hysteresis, p.Hold)
	fp := hex.EncodeToString(h.Sum(nil)[:8])
	key := "steps|" + domain + "|" + scope + "|" + fp
	if len(key) <= limit.MaxScopeBytes {
		return key
	}
	// Model names come from the rules and may be long: a key past the
	// store's cap would fail every call.
	sum := sha256.Sum256([]byte(key))
	return "steps|#" + hex.EncodeToString(sum[:16])
}

// encodeStep is the cell record of st.
func encodeStep(st StepState) []byte {
	if len(st.By) > maxStepBy {
		st.By = st.By[:maxStepBy]
	}
	b, _ := json.Marshal(st) // no StepState fails to encode: times and a finite pressure
	return b
}

// decodeStep reads a record encodeStep wrote for e's policy; anything
// else is not ok, and the replica then computes afresh rather than step
// by a corrupt record.
func decodeStep(b []byte, e *Evaluator) (StepState, bool) {
	var st StepState
	if len(b) == 0 || len(b) > limit.MaxCellBytes {
		return st, false
	}
	if err := json.Unmarshal(b, &st); err != nil || !e.validStep(st) {
		return StepState{}, false
	}
	return st, true
}

// step sets scope i's step for the reading st taken at now, through the
// scope's cell.
func (c *Combiner) step(ctx context.Context, i int, st *ScopeState, now time.Time) {
	s := &c.cfg.Scopes[i]
	e := s.Evaluator
	if math.IsNaN(st.Combined) {
		return // as Update: a NaN reading changes nothing
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Interval)
	defer cancel()
	key := c.keys[i]
	val, ver, err := c.cfg.Cells.Load(ctx, now, key)
	if err != nil {
		if parent.Err() != nil {
			return // the Combiner is stopping (a reload): not the store's failure
		}
		c.fail(s.Name, fmt.Errorf("load step cell: %w", err))
		c.alone(e, st)
		return
	}
	rec, ok := decodeStep(val, e)
	if ok && now.Sub(rec.At) < c.cfg.Interval && rec.At.Sub(now) < c.cfg.Interval {
		e.adopt(rec)
		return
	}
	if st.Stale {
		c.alone(e, st)
		return
	}
	prev := e.state()
	if ok && !rec.At.Before(prev.At) {
		prev = rec
	}
	if prev.Since.After(now) {
		prev.Since = now // a clock ahead must not stretch the hold
	}
	next := e.next(prev, st.Combined, now)
	next.By = c.cfg.Replica
	swapped, _, err := c.cfg.Cells.Swap(ctx, now, key, ver, encodeStep(next), stepTTL(c.cfg.Interval))
	if err != nil && parent.Err() != nil {
		return
	}
	if err != nil {
		// Computed from the cluster's last state, but not shared.
		c.fail(s.Name, fmt.Errorf("swap step cell: %w", err))
		e.adopt(next)
		e.fallbacks.Add(1)
		st.StepsLocal = true
		return
	}
	if !swapped {
		// Another replica wrote first: its state is the one all follow.
		val, _, err := c.cfg.Cells.Load(ctx, now, key)
		if err == nil {
			if won, ok := decodeStep(val, e); ok {
				e.adopt(won)
				return
			}
		} else if parent.Err() != nil {
			return
		} else {
			c.fail(s.Name, fmt.Errorf("load step cell: %w", err))
		}
		e.fallbacks.Add(1)
		st.StepsLocal = true
	}
	e.adopt(next)
}

// alone evaluates st on this replica only, as without Cells.
func (c *Combiner) alone(e *Evaluator, st *ScopeState) {
	e.Update(st.Combined)
	e.fallbacks.Add(1)
	st.StepsLocal = true
}
