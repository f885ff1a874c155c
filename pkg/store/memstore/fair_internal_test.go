package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TestFairStateExpires: the fair state lives Backlog + the window after
// the last decision that recorded into it, and is then fresh: its virtual
// Clock starts over. storetest checks it lives at least that long; this
// checks memory is given back.
func TestFairStateExpires(t *testing.T) {
	t.Parallel()
	p := &limit.FairPolicy{Backlog: 2 * time.Minute, Quantum: 1, Credit: 10}
	ch := limit.Charge{Key: "tg:{fair}:c", Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Minute, Cost: 1,
		Fair: limit.FairCharge{Policy: p, Member: limit.FairMember("a"), Weight: 1}}
	const ttl = 3 * 60_000 // Backlog + Window, ms
	tests := []struct {
		name      string
		give      int64 // ms after the first decision
		wantClock float64
	}{
		{name: "just before", give: ttl - 1, wantClock: 2},
		{name: "at the TTL", give: ttl, wantClock: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := New()
			t0 := time.UnixMilli(1_700_000_000_000)
			for _, at := range []time.Time{t0, t0.Add(time.Duration(tc.give) * time.Millisecond)} {
				if ok, err := s.Apply(context.Background(), at, []limit.Charge{ch}, make([]limit.Result, 1)); err != nil || !ok {
					t.Fatalf("Apply at %v = %v, %v", at, ok, err)
				}
			}
			e := s.shards[s.shardOf(limit.FairStateKey(ch.Key))].m[limit.FairStateKey(ch.Key)]
			if e == nil || e.fair == nil {
				t.Fatal("no fair state stored")
			}
			if e.fair.Clock != tc.wantClock {
				t.Errorf("Clock = %v, want %v", e.fair.Clock, tc.wantClock)
			}
			if want := t0.UnixMilli() + tc.give + ttl; e.expires != want {
				t.Errorf("expires = %d, want %d", e.expires, want)
			}
		})
	}
}
