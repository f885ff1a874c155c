package lifecycle

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// TestMemstoreHeapBoundedUnderMillionsOfKeys drives 3,000,000 distinct
// tenants (1,000,000 under the race detector, still ten times the live
// keys) through one memstore, 100 new tenants per (fake) millisecond,
// each charged once on a 1s window (sliding and token bucket in turn),
// so about 100,000 keys are live at any time. Eviction is amortized: each
// insert looks at a few entries of its shard and drops the expired ones
// (no goroutine). The live heap must plateau at the live keys' worth,
// not grow with every tenant ever seen.
func TestMemstoreHeapBoundedUnderMillionsOfKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("charges 3,000,000 keys; skipped with -short")
	}
	// Not parallel: alone, it keeps its CPU from the process tests'
	// latency budgets.
	tenants := 3_000_000
	if raceEnabled {
		tenants = 1_000_000
	}
	const (
		perMilli = 100
		window   = time.Second
		samples  = 12
	)
	warmupEnd := tenants / samples * 2 // the heap has reached the live set
	s := memstore.New()
	clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
	algs := []limit.Algorithm{limit.SlidingWindow, limit.TokenBucket}
	ch := []limit.Charge{{Amount: 10, Window: window, Cost: 1}}
	res := make([]limit.Result, 1)
	now := clock.Now()
	var warm, worst uint64
	var warmLen, worstLen int
	for i := range tenants {
		if i%perMilli == 0 {
			now = clock.Advance(time.Millisecond)
		}
		alg := algs[i%len(algs)]
		ch[0].Algorithm = alg
		ch[0].Key = limit.Key(limit.Requests, alg, window, "heap", []limit.Entry{{Key: "tenant", Value: "tenant-" + strconv.Itoa(i)}})
		if ok, err := s.Apply(context.Background(), now, ch, res); err != nil || !ok {
			t.Fatalf("Apply %d = %v, %v", i, ok, err)
		}
		if (i+1)%(tenants/samples) != 0 {
			continue
		}
		heap := liveHeap()
		n := s.Len()
		t.Logf("%9d tenants: %7d keys held, live heap %6.1f MiB", i+1, n, mib(int64(heap)))
		if i+1 == warmupEnd {
			warm, warmLen = heap, n
		}
		if i+1 > warmupEnd {
			worst, worstLen = max(worst, heap), max(worstLen, n)
		}
	}
	runtime.KeepAlive(s)
	// A sliding window of 1s lives (M+1)w = 1.05s, a token bucket 1s:
	// about 100 tenants/ms x 1,050 ms are live. The store may hold up to
	// twice its live keys (TestEvictionBoundsMemory), plus one per shard.
	live := perMilli * 1050
	t.Logf("after warm-up (%d tenants): heap %.1f MiB, %d keys; worst after: %.1f MiB, %d keys; live keys ~%d",
		warmupEnd, mib(int64(warm)), warmLen, mib(int64(worst)), worstLen, live)
	if worstLen > 2*live+256 {
		t.Errorf("the store held %d keys, want at most 2 x %d live + 256", worstLen, live)
	}
	// Flat: the rest of the run (5x as many tenants again) may not grow
	// the heap by more than a quarter, plus 8 MiB for the map's growth
	// steps. Without eviction it would grow about 6x.
	if limit := warm + warm/4 + 8<<20; worst > limit {
		t.Errorf("live heap grew from %.1f MiB to %.1f MiB after warm-up, want at most %.1f MiB",
			mib(int64(warm)), mib(int64(worst)), mib(int64(limit)))
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
