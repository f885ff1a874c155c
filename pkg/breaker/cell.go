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
	// most FailureThreshold-1 of them; without Params.Rated only.
	Failures []int64
	// Counts holds, with Params.Rated, the failures and successes counted
	// while closed, in RateBuckets buckets across the Window, oldest
	// first: at most RateBuckets of them, whatever the traffic.
	Counts []Bucket
	// Probes holds the half-open slots. A slot is held until its
	// Deadline; only the probe ID of a held slot moves a half-open cell.
	Probes []Probe
}

// Bucket is one slice of a rated Cell's window: the outcomes counted in
// bucket number At (Unix ms / BucketWidth).
type Bucket struct {
	At                  int64
	Failures, Successes uint64
}

// RateBuckets is how many buckets a rated Cell's Window is cut into: a
// failure or success counts while its bucket is one of the last
// RateBuckets, so for between Window - Window/RateBuckets and Window.
const RateBuckets = 10

// BucketWidth is the width in ms of a rated Cell's buckets: Window /
// RateBuckets rounded up, at least 1ms.
func BucketWidth(p Params) int64 {
	return max((ms(p.Window)+RateBuckets-1)/RateBuckets, 1)
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
		if p.Rated() {
			return c.count(now, p, !success, b2u(success))
		}
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

// Count takes a batch of successes at now (Report.Successes): while
// closed and rated they count toward the volume and lower the rate; in
// any other state, or unrated, they change nothing. A batch never opens.
func (c *Cell) Count(now int64, p Params, successes uint64) Transition {
	if c.State != Closed || !p.Rated() || successes == 0 {
		return Transition{From: c.State, To: c.State}
	}
	return c.count(now, p, false, successes)
}

// count adds to the current bucket of a closed rated cell and opens it
// when, within the window, failures >= FailureThreshold, failures /
// (failures + successes) >= FailureRate and failures + successes >=
// MinRequests. Only a failure can open it.
func (c *Cell) count(now int64, p Params, failed bool, successes uint64) Transition {
	w := BucketWidth(p)
	at := now / w
	c.Counts = slices.DeleteFunc(c.Counts, func(b Bucket) bool { return b.At <= at-RateBuckets || b.At > at })
	if n := len(c.Counts); n == 0 || c.Counts[n-1].At != at {
		c.Counts = append(c.Counts, Bucket{At: at})
	}
	cur := &c.Counts[len(c.Counts)-1]
	cur.Successes += successes
	if !failed {
		return Transition{}
	}
	cur.Failures++
	f, s := c.sums()
	if f >= p.FailureThreshold && float64(f) >= p.FailureRate*float64(f+s) && f+s >= p.MinRequests {
		c.open(now, p)
		return Transition{From: Closed, To: Open}
	}
	return Transition{}
}

// sums adds up the cell's buckets.
func (c *Cell) sums() (failures, successes uint64) {
	for _, b := range c.Counts {
		failures += b.Failures
		successes += b.Successes
	}
	return failures, successes
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
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
	if p.Rated() {
		at := now / BucketWidth(p)
		var st Status
		for _, b := range c.Counts {
			if b.At > at-RateBuckets && b.At <= at {
				st.Failures += b.Failures
				st.Volume += b.Failures + b.Successes
			}
		}
		return st
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
		var e int64
		if len(c.Failures) > 0 {
			e = slices.Max(c.Failures) + ms(p.Window)
		}
		for _, b := range c.Counts {
			// A bucket counts until RateBuckets buckets after it begin.
			e = max(e, (b.At+RateBuckets)*BucketWidth(p))
		}
		return e
	}
	e := c.Until
	for _, x := range c.Probes {
		e = max(e, x.Deadline)
	}
	return e + ms(Retain)
}
