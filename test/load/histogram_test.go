package load

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBucketsCoverEveryValue(t *testing.T) {
	t.Parallel()
	check := func(v uint64) {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d, out of [0, %d)", v, i, numBuckets)
		}
		lo, w := bucketRange(i)
		if v < lo || v >= lo+w {
			t.Fatalf("value %d in bucket %d = [%d, %d)", v, i, lo, lo+w)
		}
		if lo >= subCount && float64(w)/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d = [%d, %d) is wider than 1/%d of its floor", i, lo, lo+w, subCount)
		}
	}
	for e := 0; e < maxBits; e++ {
		p := uint64(1) << e
		for _, v := range []uint64{p - 1, p, p + 1, p + p/2} {
			check(v)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		check(rng.Uint64N(maxValue))
	}
	if lo, w := bucketRange(numBuckets - 1); lo+w-1 != maxValue {
		t.Fatalf("last bucket ends at %d, want %d", lo+w-1, uint64(maxValue))
	}
}

func TestHistogramQuantiles(t *testing.T) {
	t.Parallel()
	uniform := func() []time.Duration { // 1µs .. 100ms in 1µs steps, shuffled
		var v []time.Duration
		for i := 1; i <= 100000; i++ {
			v = append(v, time.Duration(i)*time.Microsecond)
		}
		rand.New(rand.NewPCG(3, 4)).Shuffle(len(v), func(i, j int) { v[i], v[j] = v[j], v[i] })
		return v
	}
	tail := func() []time.Duration { // 990 at 1ms, 9 at 100ms, 1 at 2s
		var v []time.Duration
		for range 990 {
			v = append(v, time.Millisecond)
		}
		for range 9 {
			v = append(v, 100*time.Millisecond)
		}
		return append(v, 2*time.Second)
	}
	small := func() []time.Duration { // 1..100ns: exact buckets
		var v []time.Duration
		for i := 100; i >= 1; i-- {
			v = append(v, time.Duration(i))
		}
		return v
	}
	tests := []struct {
		name string
		give []time.Duration
		q    float64
		want time.Duration
	}{
		{name: "uniform p50", give: uniform(), q: 0.50, want: 50 * time.Millisecond},
		{name: "uniform p90", give: uniform(), q: 0.90, want: 90 * time.Millisecond},
		{name: "uniform p99", give: uniform(), q: 0.99, want: 99 * time.Millisecond},
		{name: "uniform p999", give: uniform(), q: 0.999, want: 99900 * time.Microsecond},
		{name: "uniform p0", give: uniform(), q: 0, want: time.Microsecond},
		{name: "uniform max", give: uniform(), q: 1, want: 100 * time.Millisecond},
		{name: "tail p50", give: tail(), q: 0.50, want: time.Millisecond},
		{name: "tail p99", give: tail(), q: 0.99, want: time.Millisecond},
		{name: "tail p999", give: tail(), q: 0.999, want: 100 * time.Millisecond},
		{name: "tail max", give: tail(), q: 1, want: 2 * time.Second},
		{name: "small p50", give: small(), q: 0.50, want: 50},
		{name: "small p90", give: small(), q: 0.90, want: 90},
		{name: "small p999", give: small(), q: 0.999, want: 100},
		{name: "one sample", give: []time.Duration{7 * time.Millisecond}, q: 0.5, want: 7 * time.Millisecond},
		{name: "empty", give: nil, q: 0.99, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := new(Histogram)
			for _, v := range tt.give {
				h.Record(v)
			}
			got := h.Quantile(tt.q)
			// Within the bucket error: 1/256 of the value, plus 1ns of rounding.
			tol := tt.want/256 + 1
			if got < tt.want-tol || got > tt.want+tol {
				t.Errorf("Quantile(%v) = %v, want %v ± %v", tt.q, got, tt.want, tol)
			}
		})
	}
}

func TestHistogramMergeEqualsOne(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	var parts [4]Histogram
	all := new(Histogram)
	for i := range 20000 {
		v := time.Duration(rng.ExpFloat64() * float64(300*time.Microsecond))
		parts[i%len(parts)].Record(v)
		all.Record(v)
	}
	merged := new(Histogram)
	merged.Merge(new(Histogram)) // empty parts change nothing
	for i := range parts {
		merged.Merge(&parts[i])
	}
	if merged.counts != all.counts || merged.Count() != all.Count() || merged.Min() != all.Min() || merged.Max() != all.Max() {
		t.Fatalf("merged histogram differs: n %d/%d min %v/%v max %v/%v",
			merged.Count(), all.Count(), merged.Min(), all.Min(), merged.Max(), all.Max())
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		if a, b := merged.Quantile(q), all.Quantile(q); a != b {
			t.Errorf("Quantile(%v): merged %v, one %v", q, a, b)
		}
	}
}

func TestHistogramClampsHugeAndNegative(t *testing.T) {
	t.Parallel()
	h := new(Histogram)
	h.Record(-time.Second)
	h.Record(100 * time.Hour)
	if h.Min() != 0 || h.Max() != 100*time.Hour {
		t.Fatalf("min %v max %v, want 0 and 100h", h.Min(), h.Max())
	}
	if got := h.Quantile(1); got != 100*time.Hour {
		t.Fatalf("Quantile(1) = %v, want the exact max", got)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	h := new(Histogram)
	d := 137 * time.Microsecond
	for b.Loop() {
		h.Record(d)
		d += 17
	}
}
