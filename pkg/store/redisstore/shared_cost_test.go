package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

// BenchmarkSharedCost measures what the control loop's shared state costs
// per call on one Redis: ns/op is the caller's latency (loopback, one
// goroutine), round-trips/op the commands and pipelines sent (the
// first call, which loads the script, left out), redis-cpu-µs/op the CPU time
// Redis's main thread used (see mainThreadCPU). The flights cases hold
// 200 other flights in their scope, about the upstream's 32 slots and
// 128 queue places plus some, so trimming and counting work on a
// realistic set:
//
//   - flights-N: Begin of N IDs, then End of the same N (an op is both)
//   - count-4: Count over 4 scopes
//   - meters-add: Add of 4 names
//   - meters-sum-10: Sum over 10 whole buckets and the partial one
//   - cell-cas: Load, then Swap on the version read
func BenchmarkSharedCost(b *testing.B) {
	srv := redistest.Start(b)
	admin := srv.Client(b)
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	// Each sub-benchmark's calls go through a client of their own, counted
	// by its own hook.
	var rt *roundTrips
	client := func() redis.UniversalClient {
		c, err := NewClient(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		rt = new(roundTrips)
		c.AddHook(rt)
		return c
	}
	f := NewFlights(client())
	var m *Meters
	var c *Cells
	others := make([]string, 200)
	for i := range others {
		others[i] = fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
	}
	for _, scope := range []string{"m1", "m2", "m3", "m4"} {
		if _, err := f.Begin(ctx, now, scope, others, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	ids := func(i, n int) []string {
		out := make([]string, n)
		for j := range out {
			out[j] = fmt.Sprintf("%08x-1111-4000-8000-%012x", i, j)
		}
		return out
	}
	counts := map[string]int64{"admitted": 3, "shed": 1, "ok": 2, "overload": 1}
	for _, bc := range []struct {
		name string
		op   func(i int) error
		// setup gives the case its client.
		setup func(redis.UniversalClient)
	}{
		{name: "flights-1", setup: func(c redis.UniversalClient) { f = NewFlights(c) }, op: func(i int) error { return beginEnd(ctx, f, now, ids(i, 1)) }},
		{name: "flights-64", setup: func(c redis.UniversalClient) { f = NewFlights(c) }, op: func(i int) error { return beginEnd(ctx, f, now, ids(i, 64)) }},
		{name: "count-4", setup: func(c redis.UniversalClient) { f = NewFlights(c) }, op: func(int) error {
			_, err := f.Count(ctx, now, []string{"m1", "m2", "m3", "m4"})
			return err
		}},
		{name: "meters-add", setup: func(c redis.UniversalClient) { m = NewMeters(c) }, op: func(i int) error {
			return m.Add(ctx, now.Add(time.Duration(i)*time.Millisecond), "m1", time.Second, time.Minute, counts)
		}},
		{name: "meters-sum-10", setup: func(c redis.UniversalClient) { m = NewMeters(c) }, op: func(i int) error {
			_, err := m.Sum(ctx, now.Add(10*time.Second), "m1", time.Second, 10, true)
			return err
		}},
		{name: "cell-cas", setup: func(x redis.UniversalClient) { c = NewCells(x) }, op: func(int) error {
			_, v, err := c.Load(ctx, now, "shed/m1")
			if err != nil {
				return err
			}
			_, _, err = c.Swap(ctx, now, "shed/m1", v, []byte(`{"free":0.35,"standard":0}`), time.Minute)
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bc.setup(client())
			if err := bc.op(-1); err != nil { // loads the script
				b.Fatal(err)
			}
			rt.n.Store(0)
			cpu0 := mainThreadCPU(b, admin)
			b.ResetTimer()
			for i := range b.N {
				if err := bc.op(i); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric((mainThreadCPU(b, admin)-cpu0)/float64(b.N), "redis-cpu-µs/op")
			b.ReportMetric(float64(rt.n.Load())/float64(b.N), "round-trips/op")
		})
	}
}

func beginEnd(ctx context.Context, f *Flights, now time.Time, ids []string) error {
	if _, err := f.Begin(ctx, now, "m1", ids, time.Minute); err != nil {
		return err
	}
	_, err := f.End(ctx, now, "m1", ids)
	return err
}
