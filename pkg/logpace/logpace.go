// Package logpace paces a kind of log line that an outside party can
// cause at will (a refused caller retrying, a forged ticket, a store that
// keeps failing): the first event is logged at once, and after it at most
// one line per interval, which tells how many events it stands for.
package logpace

import "time"

// Pace paces one kind of line. The zero value with Every set is ready;
// it is not safe for concurrent use, so callers hold their own lock.
type Pace struct {
	// Every is the least time between two lines.
	Every time.Duration
	last  time.Time // the last line's time; zero before the first
	n     uint64    // events since the last line
}

// Event counts an event at now and reports whether to log it, with the
// events the line stands for: this one and those held back since the
// last line.
func (p *Pace) Event(now time.Time) (uint64, bool) {
	p.n++
	return p.Due(now)
}

// Due reports, once the last line is Every old, the events counted since
// it, and starts counting again; it is for a caller that flushes what it
// held back on a timer. Without events it reports none.
func (p *Pace) Due(now time.Time) (uint64, bool) {
	if p.n == 0 || (!p.last.IsZero() && now.Sub(p.last) < p.Every) {
		return 0, false
	}
	n := p.n
	p.n, p.last = 0, now
	return n, true
}
