package pressure

import (
	"math"
	"sync/atomic"
	"time"
)

// Signal is one local source of pressure: a score in [0,1] at now.
// Implementations are safe for concurrent use. Latency p95 against an SLA
// and error rate from the access log are the next ones.
type Signal interface {
	Score(now time.Time) float64
}

// Signals is a replica's local score for a scope: the largest of its
// signals' scores, clamped to [0,1] (NaN counts as 0); 0 with none.
type Signals []Signal

// Score implements Signal.
func (s Signals) Score(now time.Time) float64 {
	m := 0.0
	for _, sig := range s {
		if v := sig.Score(now); v > m { // false for NaN
			m = v
		}
	}
	return min(m, 1)
}

// InFlight counts this replica's checks in flight against a capacity.
// Inc and Dec are one atomic add each.
type InFlight struct {
	n        atomic.Int64
	capacity int64
}

var _ Signal = (*InFlight)(nil)

// NewInFlight returns an InFlight of capacity (at least 1).
func NewInFlight(capacity int) *InFlight { return &InFlight{capacity: int64(max(capacity, 1))} }

// Inc counts a check in.
func (f *InFlight) Inc() { f.n.Add(1) }

// Dec counts a check out.
func (f *InFlight) Dec() { f.n.Add(-1) }

// Load returns the checks in flight.
func (f *InFlight) Load() int64 { return f.n.Load() }

// Score is min(1, in flight / capacity), 0 if the count is negative (an
// unmatched Dec).
func (f *InFlight) Score(time.Time) float64 {
	n := f.n.Load()
	if n <= 0 {
		return 0
	}
	return math.Min(1, float64(n)/float64(f.capacity))
}
