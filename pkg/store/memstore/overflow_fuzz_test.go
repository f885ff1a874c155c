package memstore_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// FuzzApplyFullRange charges one counter with costs and limits drawn from
// the whole int64 and uint64 range: no input panics, every answer stays in
// range, and usage reports (positive Force charges at one instant) never
// give room back, which a wrapped sum would.
func FuzzApplyFullRange(f *testing.F) {
	f.Add(uint8(0), uint64(10), int64(time.Hour), uint16(0), int64(limit.MaxCount), uint8(4), int64(0))
	// Four reports of 2^62 sum to 2^64: a uint64 usage wraps to 0.
	f.Add(uint8(0), uint64(10), int64(time.Hour), uint16(0), int64(1<<62), uint8(3), int64(0))
	// A sliding window of MaxWindow resets after more than MaxWindow.
	f.Add(uint8(0), uint64(3), int64(math.MaxInt64), uint16(0), int64(1), uint8(0), int64(0))
	f.Add(uint8(1), uint64(10), int64(math.MaxInt64), uint16(0), int64(math.MaxInt64), uint8(3), int64(math.MinInt64))
	f.Add(uint8(2), uint64(1), int64(math.MaxInt64), uint16(0), int64(math.MaxInt64), uint8(3), int64(-1))
	f.Add(uint8(2), uint64(math.MaxUint64), int64(1), uint16(math.MaxUint16), int64(1), uint8(1), int64(0))
	f.Fuzz(func(t *testing.T, alg uint8, amount uint64, window int64, buckets uint16, report int64, n uint8, last int64) {
		algs := []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket}
		ch := limit.Charge{
			Key:       "k",
			Algorithm: algs[int(alg)%len(algs)],
			// The Limiter never sends more: config and scale cap amounts.
			Amount:  min(amount, limit.MaxCount),
			Window:  time.Duration(max(window, 1)),
			Buckets: buckets,
			Force:   true,
			Cost:    max(report, 1),
		}
		s := memstore.New()
		now := time.UnixMilli(1_800_000_000_000)
		res := make([]limit.Result, 1)
		prev := uint64(math.MaxUint64)
		for i := range int(n%16) + 1 {
			if _, err := s.Apply(context.Background(), now, []limit.Charge{ch}, res); err != nil {
				t.Fatalf("report %d: %v", i, err)
			}
			checkRange(t, ch, res[0])
			if res[0].Remaining > prev {
				t.Fatalf("report %d of %d gave room back: remaining %d after %d", i, ch.Cost, res[0].Remaining, prev)
			}
			prev = res[0].Remaining
		}
		final := ch
		final.Cost, final.Force = last, false
		if _, err := s.Apply(context.Background(), now.Add(time.Duration(uint32(last))*time.Millisecond), []limit.Charge{final}, res); err != nil {
			t.Fatalf("last charge: %v", err)
		}
		checkRange(t, final, res[0])
	})
}

func checkRange(tb testing.TB, ch limit.Charge, r limit.Result) {
	tb.Helper()
	if r.Remaining > ch.Amount {
		tb.Fatalf("%v amount %d: remaining %d", ch.Algorithm, ch.Amount, r.Remaining)
	}
	for _, d := range []time.Duration{r.ResetAfter, r.RetryAfter} {
		if d < 0 || d > limit.MaxWindow {
			tb.Fatalf("%v amount %d window %v cost %d: %+v has a time outside [0, MaxWindow]", ch.Algorithm, ch.Amount, ch.Window, ch.Cost, r)
		}
	}
}
