package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// FuzzFlightsModel runs a byte string as a schedule of Begin, End and
// Count calls on two scopes, with time moving forward, against a model
// that keeps every flight and scans them all: the store's trimming, its
// earliest-expiry shortcut and its sweep of the other scope must never
// change an answer.
func FuzzFlightsModel(f *testing.F) {
	f.Add([]byte{0, 0x0f, 0x10, 1, 0x05, 0x20, 2, 0, 0x80})
	f.Add([]byte{0, 0xff, 0x01, 3, 0x01, 0x01, 1, 0xff, 0xf0, 0, 0x02, 0x00, 2, 0, 0x11})
	f.Add([]byte{0, 0x01, 0x00, 0, 0x01, 0x0f, 0, 0x02, 0xf0, 2, 0, 0x0f})
	f.Fuzz(func(t *testing.T, ops []byte) {
		ctx := context.Background()
		s := NewFlights()
		model := map[string]map[string]int64{"a": {}, "b": {}}
		now := time.UnixMilli(1_700_000_000_000)
		live := func(scope string, ms int64) int64 {
			var n int64
			for _, exp := range model[scope] {
				if exp > ms {
					n++
				}
			}
			return n
		}
		for i := 0; i+2 < len(ops) && i < 3*500; i += 3 {
			kind, set, arg := ops[i], ops[i+1], ops[i+2]
			scope := "a"
			if kind&4 != 0 {
				scope = "b"
			}
			var ids []string
			for j := range 8 {
				if set&(1<<j) != 0 {
					ids = append(ids, fmt.Sprint("id", j))
				}
			}
			// The low nibble moves time by up to 1.5s, the high one is the
			// lease in 100ms steps.
			now = now.Add(time.Duration(arg&0x0f) * 100 * time.Millisecond)
			ms := now.UnixMilli()
			lease := time.Duration(arg>>4+1) * 100 * time.Millisecond
			var got, want int64
			var err error
			switch kind % 3 {
			case 0:
				got, err = s.Begin(ctx, now, scope, ids, lease)
				if len(ids) > 0 {
					for _, id := range ids {
						model[scope][id] = ms + lease.Milliseconds()
					}
				}
				want = live(scope, ms)
			case 1:
				got, err = s.End(ctx, now, scope, ids)
				for _, id := range ids {
					delete(model[scope], id)
				}
				want = live(scope, ms)
			default:
				var n []int64
				n, err = s.Count(ctx, now, []string{"a", "b"})
				if err == nil {
					if wa, wb := live("a", ms), live("b", ms); n[0] != wa || n[1] != wb {
						t.Fatalf("op %d: Count = %v, want [%d %d]", i/3, n, wa, wb)
					}
				}
				continue
			}
			if err != nil {
				t.Fatalf("op %d: %v", i/3, err)
			}
			if got != want {
				t.Fatalf("op %d: kind %d scope %s ids %v at +%dms: got %d, want %d", i/3, kind%3, scope, ids, ms-1_700_000_000_000, got, want)
			}
		}
	})
}
