package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// BenchmarkMemoryPerKey measures what one live counter costs the store:
// the live heap after a GC, before and after one charge on each of
// 1,000,000 tenants' keys, divided by the keys. B/key is HeapAlloc (the
// objects: entry, bucket slice, key string, map slot), inuse-B/key is
// HeapInuse (the spans holding them, so size-class rounding and free
// slots too). The keys are built inside the measurement, by limit.Key as
// a decision builds them, because the store keeps the string it is given.
// The window is an hour, so nothing expires and every key is live.
func BenchmarkMemoryPerKey(b *testing.B) {
	const keys = 1_000_000
	now := time.UnixMilli(1_700_000_000_000)
	for _, bc := range []struct {
		name string
		alg  limit.Algorithm
	}{
		{"sliding", limit.SlidingWindow},
		{"token", limit.TokenBucket},
	} {
		b.Run(bc.name+"/1M-tenants", func(b *testing.B) {
			var alloc, inuse uint64
			runs := 0
			for b.Loop() {
				b.StopTimer()
				s := memstore.New()
				before := liveHeap()
				b.StartTimer()
				ch := []limit.Charge{{Algorithm: bc.alg, Amount: 1_000_000_000, Window: time.Hour, Cost: 1}}
				res := make([]limit.Result, 1)
				for i := range keys {
					ch[0].Key = limit.Key(limit.Requests, bc.alg, time.Hour, "bench", []limit.Entry{{Key: "tenant", Value: "tenant-" + strconv.Itoa(i)}})
					if _, err := s.Apply(context.Background(), now, ch, res); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				after := liveHeap()
				if n := s.Len(); n != keys {
					b.Fatalf("store holds %d keys, want %d", n, keys)
				}
				runtime.KeepAlive(s)
				alloc += after.HeapAlloc - before.HeapAlloc
				inuse += after.HeapInuse - before.HeapInuse
				runs++
				b.StartTimer()
			}
			b.ReportMetric(float64(alloc)/float64(runs)/keys, "B/key")
			b.ReportMetric(float64(inuse)/float64(runs)/keys, "inuse-B/key")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(runs)/keys, "ns/key")
		})
	}
}

// liveHeap returns the memory statistics right after a collection.
func liveHeap() runtime.MemStats {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
