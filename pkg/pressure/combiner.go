package pressure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Combine is how the replicas' published scores make one.
type Combine int

const (
	// CombineMax takes the largest live score: one saturated replica
	// sheds for all.
	CombineMax Combine = iota
	// CombineMean takes the mean of the live scores.
	CombineMean
)

// ParseCombine reads "max" or "mean".
func ParseCombine(s string) (Combine, error) {
	switch s {
	case "max":
		return CombineMax, nil
	case "mean":
		return CombineMean, nil
	}
	return 0, fmt.Errorf("combine: %q is not one of max|mean", s)
}

func (c Combine) String() string {
	if c == CombineMean {
		return "mean"
	}
	return "max"
}

// Scope is one scope a Combiner keeps: "global", or a model.
type Scope struct {
	// Name is the scope's name on the Board (Required).
	Name string
	// Local is this replica's signal for the scope (Optional; nil: the
	// replica publishes nothing for it, and reads the others' and the
	// pushed score).
	Local Signal
	// Evaluator receives the combined score (Required).
	Evaluator *Evaluator
}

// CombinerConfig configures a Combiner.
type CombinerConfig struct {
	// Board is where the replicas meet (Required).
	Board limit.Board
	// Replica names this replica on the Board, unique among the live
	// ones, such as the pod name (Required).
	Replica string
	// Combine is how replicas' scores combine (Optional, default max).
	Combine Combine
	// TTL is how long a published score counts, a few intervals
	// (Required): a replica that stops publishing stops counting after
	// it.
	TTL time.Duration
	// Clock (Optional, default limit.SystemClock).
	Clock limit.Clock
	// Scopes, with unique names (Required, at least one).
	Scopes []Scope
	// OnError is told of each failed publish or read (Optional); the
	// composition root logs and counts them.
	OnError func(scope string, err error)
	// Cells, when set, shares each scope's step and hold among the
	// replicas (steps.go): one computes them per Interval and the others
	// adopt them, so they shed alike (Optional; nil: each replica keeps
	// its own, as Evaluator.Update does).
	Cells limit.Cells
	// Domain names the domain in the cells' keys (Optional; required in
	// effect when several domains share Cells and a scope name).
	Domain string
	// Interval is how often Tick runs (Required with Cells): a shared
	// step computed within it is adopted, an older one is computed
	// afresh, and each cell call is bounded by it.
	Interval time.Duration
}

// ScopeState is a scope's last reading.
type ScopeState struct {
	Scope string
	// Combined is the score fed to the Evaluator: the combined replica
	// scores, or the pushed score if higher.
	Combined float64
	// Local is this replica's own score.
	Local float64
	// Replicas are the live replica scores read (this replica's with its
	// fresh Local), sorted by replica.
	Replicas  []limit.ReplicaScore
	Pushed    float64
	HasPushed bool
	// At is when the reading was taken.
	At time.Time
	// Stale: the board could not be read, and Combined is Local alone
	// (the replica still protects itself; a remembered high score could
	// shed for as long as the store is down).
	Stale bool
	// Outcome is the Evaluator's outcome after the reading.
	Outcome Outcome
	// Step is the Evaluator's step and hold after the reading.
	Step StepState
	// StepsLocal: with Cells, this reading's step was evaluated on this
	// replica alone (the cell could not be read or written, or the board
	// could not be read); Evaluator.Fallbacks counts them.
	StepsLocal bool
}

// Combiner publishes this replica's scores and feeds the combined ones to
// each scope's Evaluator, once per Tick; with Cells, through the scope's
// shared step (steps.go).
type Combiner struct {
	cfg   CombinerConfig
	state []atomic.Pointer[ScopeState]
	keys  []string // each scope's step cell, with Cells
}

// NewCombiner checks cfg and returns a Combiner.
func NewCombiner(cfg CombinerConfig) (*Combiner, error) {
	var errs []error
	if cfg.Board == nil {
		errs = append(errs, errors.New("combiner: no board"))
	}
	if cfg.Replica == "" {
		errs = append(errs, errors.New("combiner: no replica name"))
	}
	if cfg.TTL < time.Millisecond {
		errs = append(errs, fmt.Errorf("combiner: ttl %v is under 1ms", cfg.TTL))
	}
	if cfg.Combine != CombineMax && cfg.Combine != CombineMean {
		errs = append(errs, fmt.Errorf("combiner: unknown combine %d", cfg.Combine))
	}
	if len(cfg.Scopes) == 0 {
		errs = append(errs, errors.New("combiner: no scopes"))
	}
	if cfg.Cells != nil && cfg.Interval < time.Millisecond {
		errs = append(errs, fmt.Errorf("combiner: interval %v is under 1ms", cfg.Interval))
	}
	for i, s := range cfg.Scopes {
		switch {
		case s.Name == "":
			errs = append(errs, fmt.Errorf("combiner: scopes[%d]: no name", i))
		case slices.IndexFunc(cfg.Scopes, func(o Scope) bool { return o.Name == s.Name }) < i:
			errs = append(errs, fmt.Errorf("combiner: scopes[%d]: %q listed twice", i, s.Name))
		}
		if s.Evaluator == nil {
			errs = append(errs, fmt.Errorf("combiner: scopes[%d]: no evaluator", i))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = limit.SystemClock{}
	}
	cfg.Scopes = slices.Clone(cfg.Scopes)
	c := &Combiner{cfg: cfg, state: make([]atomic.Pointer[ScopeState], len(cfg.Scopes))}
	for i, s := range cfg.Scopes {
		c.state[i].Store(&ScopeState{Scope: s.Name, Stale: true, Outcome: s.Evaluator.Outcome(), Step: s.Evaluator.state()})
		if cfg.Cells != nil {
			c.keys = append(c.keys, stepKey(cfg.Domain, s.Name, &s.Evaluator.policy))
		}
	}
	return c, nil
}

// Run calls Tick at once and then every interval until ctx ends.
func (c *Combiner) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		c.Tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick takes one reading of every scope: publish the local score, read
// the board, combine, update the Evaluator. Errors go to OnError and make
// the reading Stale.
func (c *Combiner) Tick(ctx context.Context) {
	for i := range c.cfg.Scopes {
		c.tick(ctx, i)
	}
}

func (c *Combiner) tick(ctx context.Context, i int) {
	s := &c.cfg.Scopes[i]
	now := c.cfg.Clock.Now()
	st := &ScopeState{Scope: s.Name, At: now}
	if s.Local != nil {
		st.Local = min(max(s.Local.Score(now), 0), 1)
		if err := c.cfg.Board.Publish(ctx, now, s.Name, c.cfg.Replica, st.Local, c.cfg.TTL); err != nil {
			c.fail(s.Name, err)
		}
	}
	read, err := c.cfg.Board.Scores(ctx, now, s.Name)
	if err != nil {
		c.fail(s.Name, err)
		st.Stale = true
		st.Combined = st.Local
	} else {
		st.Replicas, st.Pushed, st.HasPushed = read.Replicas, read.Pushed, read.HasPushed
		if s.Local != nil {
			st.Replicas = withSelf(st.Replicas, c.cfg.Replica, st.Local)
		}
		st.Combined = c.combine(st.Replicas)
		if st.HasPushed {
			st.Combined = max(st.Combined, st.Pushed)
		}
	}
	if c.cfg.Cells != nil {
		c.step(ctx, i, st, now)
	} else {
		s.Evaluator.Update(st.Combined)
	}
	st.Outcome = s.Evaluator.Outcome()
	st.Step = s.Evaluator.state()
	c.state[i].Store(st)
}

// withSelf puts this replica's fresh score in rs, whether or not its
// publish reached the board.
func withSelf(rs []limit.ReplicaScore, self string, score float64) []limit.ReplicaScore {
	i, found := slices.BinarySearchFunc(rs, self, func(r limit.ReplicaScore, name string) int { return strings.Compare(r.Replica, name) })
	if found {
		rs[i].Score = score
		return rs
	}
	return slices.Insert(rs, i, limit.ReplicaScore{Replica: self, Score: score})
}

func (c *Combiner) combine(rs []limit.ReplicaScore) float64 {
	if len(rs) == 0 {
		return 0
	}
	out := 0.0
	for _, r := range rs {
		if c.cfg.Combine == CombineMean {
			out += r.Score
		} else {
			out = max(out, r.Score)
		}
	}
	if c.cfg.Combine == CombineMean {
		out /= float64(len(rs))
	}
	return min(max(out, 0), 1)
}

func (c *Combiner) fail(scope string, err error) {
	if c.cfg.OnError != nil {
		c.cfg.OnError(scope, err)
	}
}

// Snapshot returns every scope's last reading, in configuration order.
// Before the first Tick a scope reads as Stale with score 0.
func (c *Combiner) Snapshot() []ScopeState {
	out := make([]ScopeState, len(c.state))
	for i := range c.state {
		out[i] = *c.state[i].Load()
	}
	return out
}

// Evaluator returns scope's Evaluator, nil for an unknown scope.
func (c *Combiner) Evaluator(scope string) *Evaluator {
	for _, s := range c.cfg.Scopes {
		if s.Name == scope {
			return s.Evaluator
		}
	}
	return nil
}
