package redisstore

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

func benchKey(kind limit.Kind, alg limit.Algorithm, window time.Duration, entries ...string) string {
	var es []limit.Entry
	for i := 0; i+1 < len(entries); i += 2 {
		es = append(es, limit.Entry{Key: entries[i], Value: entries[i+1]})
	}
	return limit.Key(kind, alg, window, "test", es)
}

// BenchmarkApplyCost measures the Redis CPU of the decisions the service
// makes most: redis-µs/op is INFO commandstats' usec of the script calls
// per decision (the script alone, but wall time: it grows when the core is
// taken away mid-call), redis-cpu-µs/op the CPU time Redis's main thread
// used per decision (the script and the command's I/O):
//
//   - sliding: one request limit on a counter whose 21 buckets all count
//   - sliding-new: one request limit on a counter no decision touched yet
//   - req+tokens: a request limit and a token budget of one descriptor
//   - refund-at: a reconciliation: a refund into the bucket of its
//     reservation, behind a Once mark
//
// each run as a function (fcall) and as a script (evalsha).
//
// Compare variants in alternating runs: the numbers move with the load
// of the machine.
func BenchmarkApplyCost(b *testing.B) {
	const window = time.Minute
	w := window.Milliseconds() / limit.DefaultBuckets
	req := limit.Charge{Key: benchKey(limit.Requests, limit.SlidingWindow, window, "tenant", "bench"), Algorithm: limit.SlidingWindow, Amount: 1 << 40, Window: window, Cost: 1}
	tok := limit.Charge{Key: benchKey(limit.Tokens, limit.SlidingWindow, window, "tenant", "bench"), Algorithm: limit.SlidingWindow, Amount: 1 << 40, Window: window, Cost: 100}
	for _, bc := range []struct {
		name string
		warm []limit.Charge
		// next returns decision i at now.
		next func(i int, now time.Time) []limit.Charge
	}{
		{
			name: "sliding",
			warm: []limit.Charge{req},
			next: func(int, time.Time) []limit.Charge { return []limit.Charge{req} },
		},
		{
			name: "sliding-new",
			next: func(i int, _ time.Time) []limit.Charge {
				c := req
				c.Key = benchKey(limit.Requests, limit.SlidingWindow, window, "tenant", strconv.Itoa(i))
				return []limit.Charge{c}
			},
		},
		{
			name: "req+tokens",
			warm: []limit.Charge{req, tok},
			next: func(int, time.Time) []limit.Charge { return []limit.Charge{req, tok} },
		},
		{
			name: "refund-at",
			// Every bucket holds far more than the refunds take back.
			warm: []limit.Charge{func() limit.Charge { c := tok; c.Cost = 1 << 30; return c }()},
			next: func(i int, now time.Time) []limit.Charge {
				refund := tok
				refund.Cost, refund.At = -20, now.Add(-10*time.Second).UnixMilli()
				mark := limit.Charge{Key: benchKey(limit.Requests, limit.Once, time.Hour, "tenant", "bench", "id", strconv.Itoa(i)), Algorithm: limit.Once, Window: time.Hour, Cost: 1}
				return []limit.Charge{refund, mark}
			},
		},
	} {
		for _, code := range []string{"fcall", "evalsha"} {
			b.Run(bc.name+"/"+code, func(b *testing.B) {
				srv := redistest.Start(b)
				c, err := NewClient(srv.URL())
				if err != nil {
					b.Fatal(err)
				}
				s := newStore(c)
				b.Cleanup(func() { _ = s.Close() })
				// As on a server without functions.
				s.apply.useScripts.Store(code == "evalsha")
				admin := srv.Client(b)
				ctx := context.Background()
				now := t0
				// One charge in every bucket of the window, and the script
				// loaded.
				res := make([]limit.Result, 2)
				for range limit.DefaultBuckets + 1 {
					if _, err := s.Apply(ctx, now, bc.warm, res[:len(bc.warm)]); err != nil {
						b.Fatal(err)
					}
					now = now.Add(time.Duration(w) * time.Millisecond)
				}
				cs := bc.next(-1, now)
				if _, err := s.Apply(ctx, now, cs, res[:len(cs)]); err != nil {
					b.Fatal(err)
				}
				calls, usec := scriptStats(b, admin)
				cpu := mainThreadCPU(b, admin)
				b.ReportAllocs()
				b.ResetTimer()
				i := 0
				for b.Loop() {
					now = now.Add(time.Millisecond)
					cs = bc.next(i, now)
					if _, err := s.Apply(ctx, now, cs, res[:len(cs)]); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.StopTimer()
				calls2, usec2 := scriptStats(b, admin)
				cpu2 := mainThreadCPU(b, admin)
				if calls2-calls != int64(i) {
					b.Fatalf("%d script calls for %d decisions", calls2-calls, i)
				}
				b.ReportMetric(float64(usec2-usec)/float64(i), "redis-µs/op")
				b.ReportMetric((cpu2-cpu)/float64(i), "redis-cpu-µs/op")
			})
		}
	}
}

// BenchmarkKeyMemory measures the Redis memory a sliding window counter
// (default precision) takes: b.N distinct keys, each charged once (new)
// or in every bucket of its window (full), reported as used_memory's
// growth per key (B/key). Run it with -benchtime=1000000x for a figure
// that includes the key space's hash tables at scale.
func BenchmarkKeyMemory(b *testing.B) {
	for _, bc := range []struct {
		name    string
		buckets int
	}{
		{"new", 1},
		{"full", limit.DefaultBuckets + 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := redistest.Start(b)
			// Parallel writers on a loaded machine: a slow reply is no
			// failure here.
			c, err := NewClient(srv.URL() + "?read_timeout=10s")
			if err != nil {
				b.Fatal(err)
			}
			s := newStore(c)
			b.Cleanup(func() { _ = s.Close() })
			admin := srv.Client(b)
			ctx := context.Background()
			// Hours-long windows: no key expires while the benchmark runs.
			const window = 20 * time.Hour
			w := window / limit.DefaultBuckets
			ch := limit.Charge{Algorithm: limit.SlidingWindow, Amount: 1 << 40, Window: window, Cost: 1}
			if _, err := s.Apply(ctx, t0, []limit.Charge{ch}, make([]limit.Result, 1)); err != nil { // loads the script
				b.Fatal(err)
			}
			before := usedMemory(b, admin)
			b.ResetTimer()
			var next atomic.Int64
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				res := make([]limit.Result, 1)
				cs := []limit.Charge{ch}
				for pb.Next() {
					i := next.Add(1)
					cs[0].Key = benchKey(limit.Requests, limit.SlidingWindow, window, "tenant", "t"+strconv.FormatInt(i, 10))
					for k := range bc.buckets {
						if _, err := s.Apply(ctx, t0.Add(time.Duration(k)*w), cs, res); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
			b.StopTimer()
			n, err := admin.DBSize(ctx).Result()
			if err != nil {
				b.Fatal(err)
			}
			if n != next.Load()+1 {
				b.Fatalf("DBSIZE %d, want %d", n, next.Load()+1)
			}
			b.ReportMetric(float64(usedMemory(b, admin)-before)/float64(next.Load()), "B/key")
		})
	}
}

// mainThreadCPU is the CPU time (µs) Redis's main thread has used: the
// script calls and the reading and writing of the commands around them,
// apart from the time other processes took the core.
func mainThreadCPU(t testing.TB, c *redis.Client) float64 {
	t.Helper()
	return cpuMicros(t, c, "used_cpu_sys_main_thread", "used_cpu_user_main_thread")
}

// cpuMicros is the sum of INFO cpu's fields names, in µs of CPU time.
func cpuMicros(t testing.TB, c *redis.Client, names ...string) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for line := range strings.SplitSeq(info, "\r\n") {
		name, v, _ := strings.Cut(line, ":")
		if !slices.Contains(names, name) {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("INFO cpu line %q: %v", line, err)
		}
		sum += f
	}
	return sum * 1e6
}

func usedMemory(t testing.TB, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}
