package breaker

import (
	"slices"
	"time"
)

// Cell is one breaker's state, with the transitions every Store makes:
// memstore keeps Cells, and redisstore's breaker.lua repeats these steps
// on a Redis hash. Times are Unix milliseconds. The zero Cell is a fresh,
// closed breaker.
type Cell struct {
	// State as last written; an Open cell whose Until has come is
	// half-open, and the next Allow writes it so.
	State State
	// Until is when an open cell goes half-open.
	Until int64
	// Successes counts the period's probe successes.
	Successes uint64
	// Failures holds the times of the failures counted while closed, at
	// most FailureThreshold-1 of them.
	Failures []int64
	// Probes holds the half-open slots. A slot is held until its
	// Deadline; only the probe ID of a held slot moves a half-open cell.
	Probes []Probe
}

// Probe is one half-open slot: the probe ID the caller of Allow chose
// (NewProbeID) and when its lease ends.
type Probe struct {
	ID       string
	Deadline int64
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// Allow decides one request at now; a request admitted as a probe holds
// a slot under id, which the caller made with NewProbeID.
func (c *Cell) Allow(now int64, p Params, id string) (Verdict, Transition) {
	tr := Transition{From: c.State, To: c.State}
	if c.State == Open && now >= c.Until {
		c.State, c.Successes, c.Probes = HalfOpen, 0, nil
		tr.To = HalfOpen
	}
	switch c.State {
	case Open:
		return Verdict{State: Open, RetryAfter: time.Duration(c.Until-now) * time.Millisecond}, tr
	case HalfOpen:
		c.Probes = slices.DeleteFunc(c.Probes, func(x Probe) bool { return x.Deadline <= now })
		if uint64(len(c.Probes)) < p.HalfOpenProbes {
			c.Probes = append(c.Probes, Probe{ID: id, Deadline: now + ms(p.ProbeLease)})
			return Verdict{Allowed: true, Probe: true, ProbeID: id, State: HalfOpen}, tr
		}
		first := c.Probes[0].Deadline
		for _, x := range c.Probes[1:] {
			first = min(first, x.Deadline)
		}
		return Verdict{State: HalfOpen, RetryAfter: time.Duration(first-now) * time.Millisecond}, tr
	}
	return Verdict{Allowed: true, State: Closed}, tr
}

// Record takes one request's outcome at now. While half-open only the
// probe ID of a held slot counts: its success frees the slot toward
// closing, its failure opens the cell again. Any other outcome then (no
// probe ID, a guessed one, one of an earlier period, one whose lease ran
// out) changes nothing.
func (c *Cell) Record(now int64, p Params, success bool, probeID string) Transition {
	switch c.State {
	case Closed:
		if success {
			return Transition{}
		}
		c.Failures = slices.DeleteFunc(c.Failures, func(t int64) bool { return t <= now-ms(p.Window) })
		c.Failures = append(c.Failures, now)
		if uint64(len(c.Failures)) >= p.FailureThreshold {
			c.open(now, p)
			return Transition{From: Closed, To: Open}
		}
	case HalfOpen:
		i := c.slot(probeID)
		if i < 0 || c.Probes[i].Deadline <= now {
			return Transition{From: HalfOpen, To: HalfOpen}
		}
		if !success {
			c.open(now, p)
			return Transition{From: HalfOpen, To: Open}
		}
		c.Probes = slices.Delete(c.Probes, i, i+1)
		c.Successes++
		if c.Successes >= p.CloseAfter {
			*c = Cell{}
			return Transition{From: HalfOpen, To: Closed}
		}
	}
	return Transition{From: c.State, To: c.State}
}

// slot is the index of probeID's slot, -1 for none; an empty ID holds
// none.
func (c *Cell) slot(probeID string) int {
	if probeID == "" {
		return -1
	}
	return slices.IndexFunc(c.Probes, func(x Probe) bool { return x.ID == probeID })
}

// Release frees the half-open slot of probeID, counting nothing; any
// other state, or a probe ID not holding a slot, is left as it is.
func (c *Cell) Release(probeID string) {
	if c.State != HalfOpen {
		return
	}
	if i := c.slot(probeID); i >= 0 {
		c.Probes = slices.Delete(c.Probes, i, i+1)
	}
}

func (c *Cell) open(now int64, p Params) {
	*c = Cell{State: Open, Until: now + ms(p.OpenFor)}
}

// Status describes the cell at now without changing it.
func (c *Cell) Status(now int64, p Params) Status {
	switch {
	case c.State == Open && now < c.Until:
		return Status{State: Open, OpenUntil: time.UnixMilli(c.Until)}
	case c.State == Open:
		return Status{State: HalfOpen}
	case c.State == HalfOpen:
		var live uint64
		for _, x := range c.Probes {
			if x.Deadline > now {
				live++
			}
		}
		return Status{State: HalfOpen, Probes: live, Successes: c.Successes}
	}
	var n uint64
	for _, t := range c.Failures {
		if t > now-ms(p.Window) {
			n++
		}
	}
	return Status{State: Closed, Failures: n}
}

// Expiry is the Unix ms from which the cell is equivalent to a fresh one
// (an open or half-open one: is forgotten), 0 when it is fresh already.
func (c *Cell) Expiry(p Params) int64 {
	if c.State == Closed {
		if len(c.Failures) == 0 {
			return 0
		}
		return slices.Max(c.Failures) + ms(p.Window)
	}
	e := c.Until
	for _, x := range c.Probes {
		e = max(e, x.Deadline)
	}
	return e + ms(Retain)
}
