package logpace

import (
	"testing"
	"time"
)

func TestPace(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_800_000_000_000)
	p := Pace{Every: 10 * time.Second}
	type step struct {
		at    time.Duration
		event bool // else Due
		n     uint64
		ok    bool
	}
	for i, s := range []step{
		{at: 0, event: false},                                // nothing yet
		{at: 0, event: true, n: 1, ok: true},                 // the first event at once
		{at: time.Second, event: true},                       // held
		{at: 2 * time.Second, event: true},                   // held
		{at: 9 * time.Second, event: false},                  // not due yet
		{at: 10 * time.Second, event: false, n: 2, ok: true}, // flushed by Due
		{at: 11 * time.Second, event: true},                  // held: 1s after the flush
		{at: 20 * time.Second, event: true, n: 2, ok: true},
		{at: 40 * time.Second, event: false}, // nothing held
		{at: 41 * time.Second, event: true, n: 1, ok: true},
	} {
		now := t0.Add(s.at)
		var n uint64
		var ok bool
		if s.event {
			n, ok = p.Event(now)
		} else {
			n, ok = p.Due(now)
		}
		if n != s.n || ok != s.ok {
			t.Errorf("step %d at %v: %d, %v; want %d, %v", i, s.at, n, ok, s.n, s.ok)
		}
	}
}
