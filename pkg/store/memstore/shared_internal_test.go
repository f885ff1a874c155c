package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"
)

var sharedT0 = time.UnixMilli(1_700_000_000_000)

// TestSharedMemoryBounded: state that has expired is dropped, in scopes
// (and cells) no call names any more too, by the sweep of the writes on
// one live scope. Each write visits two others and at most one of those
// is live, so n writes drop at least n expired scopes.
func TestSharedMemoryBounded(t *testing.T) {
	t.Parallel()
	const n = 1000
	ctx := context.Background()
	later := sharedT0.Add(time.Minute)
	f, m, c := NewFlights(), NewMeters(), NewCells()
	for i := range n {
		s := fmt.Sprint("s", i)
		if _, err := f.Begin(ctx, sharedT0, s, []string{"a", "b"}, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := m.Add(ctx, sharedT0, s, time.Second, time.Second, map[string]int64{"a": 1}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Swap(ctx, sharedT0, s, 0, []byte("v"), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if s, fl := f.scopesHeld(); s != n || fl != 2*n {
		t.Fatalf("before: Flights hold %d scopes, %d flights; want %d, %d", s, fl, n, 2*n)
	}
	for i := range n {
		id := fmt.Sprint("x", i)
		if _, err := f.Begin(ctx, later, "live", []string{id}, time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := f.End(ctx, later, "live", []string{id}); err != nil {
			t.Fatal(err)
		}
		if err := m.Add(ctx, later, "live", time.Second, time.Second, map[string]int64{"a": 1}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Swap(ctx, later, "live", uint64(i), []byte("v"), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if s, fl := f.scopesHeld(); s != 0 || fl != 0 {
		t.Errorf("after: Flights hold %d scopes, %d flights; want none", s, fl)
	}
	if s, b := m.held(); s != 1 || b != 1 {
		t.Errorf("after: Meters hold %d scopes, %d buckets; want 1, 1", s, b)
	}
	if got := c.held(); got != 1 {
		t.Errorf("after: Cells hold %d; want 1", got)
	}
}

// TestFlightsTrimOnWrite: a write drops every expired flight of its scope.
func TestFlightsTrimOnWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := NewFlights()
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	if _, err := f.Begin(ctx, sharedT0, "m", ids, time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Begin(ctx, sharedT0.Add(time.Second), "m", []string{"new"}, time.Second); err != nil || n != 1 {
		t.Fatalf("Begin after expiry = %d, %v; want 1", n, err)
	}
	if s, fl := f.scopesHeld(); s != 1 || fl != 1 {
		t.Errorf("Flights hold %d scopes, %d flights; want 1, 1", s, fl)
	}
}
