package memstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(testing.TB) limit.Store { return memstore.New() })
}

func key(i int) string {
	return limit.Key(limit.Requests, limit.SlidingWindow, time.Second, "mem", []limit.Entry{{Key: "tenant", Value: strconv.Itoa(i)}})
}

// TestEvictionBoundsMemory charges 200k distinct keys, one per fake
// millisecond, with limits whose state lives about a second: the store
// holds about the keys of the last second, not all of them.
func TestEvictionBoundsMemory(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
	algs := []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket, limit.Concurrency, limit.Once}
	res := make([]limit.Result, 1)
	expires := make([]int64, 0, 200_000) // from the contract's TTLs
	worst := 0.0
	for i := 0; i < 200_000; i++ {
		c := limit.Charge{Key: key(i), Algorithm: algs[i%len(algs)], Amount: 5, Window: time.Second, Cost: 1, Member: "m"}
		now := clock.Advance(time.Millisecond)
		if ok, err := s.Apply(context.Background(), now, []limit.Charge{c}, res); err != nil || !ok {
			t.Fatalf("Apply %d = %v, %v", i, ok, err)
		}
		ms := now.UnixMilli()
		switch c.Algorithm {
		case limit.SlidingWindow: // w = 50ms, M = 20
			expires = append(expires, (ms/50+21)*50)
		case limit.FixedWindow:
			expires = append(expires, (ms/1000+1)*1000)
		case limit.TokenBucket: // T = 200ms
			expires = append(expires, ms+200)
		case limit.Concurrency, limit.Once: // the lease's or mark's deadline
			expires = append(expires, ms+1000)
		}
		if i%1000 != 499 { // mid-second: not when every fixed window just ended
			continue
		}
		live := 0
		for _, e := range expires[max(0, len(expires)-2000):] {
			if e > ms {
				live++
			}
		}
		// An expired entry waits for the next insert into its shard (one
		// of 256), so a store holds its live keys, plus some.
		n := s.Len()
		if n > 2*live+256 {
			t.Fatalf("after %d keys: Len = %d for %d live keys", i+1, n, live)
		}
		worst = max(worst, float64(n)/float64(live))
	}
	t.Logf("Len was at most %.2f times the live keys", worst)
}

func TestLenAndDrop(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	now := time.UnixMilli(1_700_000_000_000)
	res := make([]limit.Result, 1)
	apply := func(c limit.Charge) {
		t.Helper()
		if _, err := s.Apply(context.Background(), now, []limit.Charge{c}, res); err != nil {
			t.Fatal(err)
		}
	}
	c := limit.Charge{Key: key(1), Algorithm: limit.TokenBucket, Amount: 5, Window: time.Second}
	apply(c) // a check keeps nothing
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after a check = %d, want 0", n)
	}
	c.Cost = 2
	apply(c)
	if n := s.Len(); n != 1 {
		t.Fatalf("Len after a charge = %d, want 1", n)
	}
	c.Cost = -5
	apply(c) // a full refund leaves a fresh counter, which is not kept
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after a full refund = %d, want 0", n)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestApplyErrors(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	now := time.Now()
	c := []limit.Charge{{Key: key(1), Amount: 1, Window: time.Second, Cost: 1}}
	if _, err := s.Apply(context.Background(), now, c, nil); err == nil {
		t.Error("Apply with a short result slice: no error")
	}
	bad := []limit.Charge{{Key: key(1), Algorithm: 9, Amount: 1, Window: time.Second, Cost: 1}}
	if _, err := s.Apply(context.Background(), now, bad, make([]limit.Result, 1)); err == nil {
		t.Error("Apply with an unknown algorithm: no error")
	}
	anon := []limit.Charge{{Key: key(1), Algorithm: limit.Concurrency, Amount: 1, Window: time.Second, Cost: 1}}
	if _, err := s.Apply(context.Background(), now, anon, make([]limit.Result, 1)); err == nil {
		t.Error("Apply with a lease for no member: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Apply(ctx, now, c, make([]limit.Result, 1)); err == nil {
		t.Error("Apply with a cancelled context: no error")
	}
}

func BenchmarkApply(b *testing.B) {
	now := time.UnixMilli(1_700_000_000_000)
	for _, bc := range []struct {
		name string
		alg  limit.Algorithm
		keys int
	}{
		{"sliding/one-key", limit.SlidingWindow, 1},
		{"sliding/64k-keys", limit.SlidingWindow, 1 << 16},
		{"fixed/one-key", limit.FixedWindow, 1},
		{"token/one-key", limit.TokenBucket, 1},
		{"token/64k-keys", limit.TokenBucket, 1 << 16},
	} {
		keys := make([]string, bc.keys)
		for i := range keys {
			keys[i] = key(i)
		}
		charge := limit.Charge{Algorithm: bc.alg, Amount: 1 << 40, Window: time.Minute, Cost: 1}
		b.Run(bc.name, func(b *testing.B) {
			s := memstore.New()
			ch := []limit.Charge{charge}
			res := make([]limit.Result, 1)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ch[0].Key = keys[i%len(keys)]
				i++
				if _, err := s.Apply(context.Background(), now.Add(time.Duration(i)*time.Microsecond), ch, res); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			s := memstore.New()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ch := []limit.Charge{charge}
				res := make([]limit.Result, 1)
				i := 0
				for pb.Next() {
					ch[0].Key = keys[i%len(keys)]
					i += 7919
					if _, err := s.Apply(context.Background(), now, ch, res); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	// A typical decision: a request limit and a token budget on two keys.
	b.Run("two-charges", func(b *testing.B) {
		s := memstore.New()
		ch := []limit.Charge{
			{Key: key(1), Algorithm: limit.SlidingWindow, Amount: 1 << 40, Window: time.Minute, Cost: 1},
			{Key: key(2), Algorithm: limit.TokenBucket, Amount: 1 << 40, Window: time.Hour, Cost: 100},
		}
		res := make([]limit.Result, 2)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Apply(context.Background(), now, ch, res); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestFairConformance(t *testing.T) {
	t.Parallel()
	storetest.RunFair(t, func(testing.TB) limit.Store { return memstore.New() })
}

// BenchmarkApplyFair is one sliding-window charge on a fair-shared limit
// whose state holds n members with demand, each asking in turn.
func BenchmarkApplyFair(b *testing.B) {
	now := time.UnixMilli(1_700_000_000_000)
	p := &limit.FairPolicy{Backlog: time.Minute, Quantum: 1, Credit: 10}
	for _, n := range []int{4, 64} {
		b.Run(strconv.Itoa(n)+"-members", func(b *testing.B) {
			s := memstore.New()
			members := make([]string, n)
			for i := range members {
				members[i] = limit.FairMember(strconv.Itoa(i))
			}
			ch := []limit.Charge{{Key: key(1), Algorithm: limit.SlidingWindow, Amount: 1 << 40, Window: time.Minute, Cost: 1}}
			res := make([]limit.Result, 1)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ch[0].Fair = limit.FairCharge{Policy: p, Member: members[i%n], Weight: 1}
				i++
				if _, err := s.Apply(context.Background(), now.Add(time.Duration(i)*time.Microsecond), ch, res); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
