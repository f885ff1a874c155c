package breaker

import (
	"slices"
	"strconv"
	"strings"
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
	// Opened is when the cell last opened; it starts the probe IDs of the
	// half-open period that follows.
	Opened int64
	// Seq numbers the period's probes.
	Seq uint64
	// Successes counts the period's probe successes.
	Successes uint64
	// Failures holds the times of the failures counted while closed, at
	// most FailureThreshold-1 of them.
	Failures []int64
	// Probes holds the half-open slots.
	Probes []Probe
}

// Probe is one half-open slot.
type Probe struct {
	ID       string
	Deadline int64
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// Allow decides one request at now.
func (c *Cell) Allow(now int64, p Params) (Verdict, Transition) {
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
			c.Seq++
			id := strconv.FormatInt(c.Opened, 10) + "." + strconv.FormatUint(c.Seq, 10)
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

// Record takes one request's outcome at now.
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
		opened, _, ok := strings.Cut(probeID, ".")
		if !ok || opened != strconv.FormatInt(c.Opened, 10) {
			return Transition{From: HalfOpen, To: HalfOpen}
		}
		if !success {
			c.open(now, p)
			return Transition{From: HalfOpen, To: Open}
		}
		i := slices.IndexFunc(c.Probes, func(x Probe) bool { return x.ID == probeID })
		if i < 0 {
			return Transition{From: HalfOpen, To: HalfOpen}
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

// Release frees the half-open slot of probeID, counting nothing; any
// other state, or a probe ID not holding a slot, is left as it is.
func (c *Cell) Release(probeID string) {
	if c.State != HalfOpen {
		return
	}
	if i := slices.IndexFunc(c.Probes, func(x Probe) bool { return x.ID == probeID }); i >= 0 {
		c.Probes = slices.Delete(c.Probes, i, i+1)
	}
}

func (c *Cell) open(now int64, p Params) {
	*c = Cell{State: Open, Until: now + ms(p.OpenFor), Opened: now}
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
