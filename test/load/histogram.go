package load

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-linear, as HdrHistogram is: values below 2^subBits
// nanoseconds have a bucket each; above, every power of two is split into
// 2^subBits equal buckets, so a bucket's width is at most 1/128 of its
// lower bound. Reporting the bucket's midpoint bounds the relative error
// by 1/256 (0.4%). Values at or above maxValue (about 18 minutes) share
// the last bucket; the exact maximum is kept on the side.
const (
	subBits    = 7
	subCount   = 1 << subBits
	maxBits    = 40
	maxValue   = 1<<maxBits - 1
	numBuckets = (maxBits - subBits + 1) << subBits
)

// Histogram records latencies in fixed buckets. It is not safe for
// concurrent use: each worker owns one, and Merge adds them at the end.
type Histogram struct {
	counts   [numBuckets]uint64
	n        uint64
	sum      float64
	min, max time.Duration
}

func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	if v > maxValue {
		v = maxValue
	}
	shift := bits.Len64(v) - subBits - 1
	return (shift+1)<<subBits + int(v>>uint(shift)) - subCount
}

// bucketRange returns the values [lo, lo+width) that bucket i holds.
func bucketRange(i int) (lo, width uint64) {
	if i < subCount {
		return uint64(i), 1
	}
	shift := uint(i>>subBits - 1)
	return uint64(i&(subCount-1)+subCount) << shift, 1 << shift
}

// Record adds one latency; negative values count as 0.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.n++
	h.sum += float64(d)
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Max is the exact largest sample.
func (h *Histogram) Max() time.Duration { return h.max }

// Min is the exact smallest sample.
func (h *Histogram) Min() time.Duration { return h.min }

// Mean is the exact mean.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the q-quantile (0 <= q <= 1) by the nearest-rank
// definition: the smallest sample such that at least q of the samples are
// at or below it, within the bucket error, and clamped to [Min, Max].
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	if rank >= h.n {
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, w := bucketRange(i)
			v := time.Duration(lo + w/2)
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}
