package storetest

import (
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// FakeClock is a settable clock (implements limit.Clock): Now, Set,
// Advance. Safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

var _ limit.Clock = (*FakeClock)(nil)

// NewFakeClock returns a FakeClock that reads t until it is moved.
func NewFakeClock(t time.Time) *FakeClock { return &FakeClock{now: t} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, backwards too.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock by d and returns the new time.
func (c *FakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
