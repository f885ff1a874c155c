package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// RunMeters runs the limit.Meters conformance suite.
func RunMeters(t *testing.T, newMeters func(testing.TB) limit.Meters) {
	runSuite(t, newMeters, 10, []suiteCase[limit.Meters]{
		{name: "WholeAndPartial", run: testMetersSum},
		{name: "Keep", run: testMetersKeep},
		{name: "ZeroCounts", run: testMetersZero},
		{name: "WidthsAndScopes", run: testMetersApart},
		{name: "Bad", run: testMetersBad},
		{name: "Concurrent", run: testMetersConcurrent},
	})
}

type meters struct {
	sharedEnv
	m limit.Meters
}

func (x meters) add(ms int64, scope string, bucket, keep time.Duration, counts map[string]int64) {
	x.tb.Helper()
	if err := x.m.Add(context.Background(), x.at(ms), x.scope(scope), bucket, keep, counts); err != nil {
		x.tb.Fatalf("Add(%d, %q, %v, %v, %v): %v", ms, scope, bucket, keep, counts, err)
	}
}

// sumCase is one Sum and the sums it must return.
type sumCase struct {
	name    string
	at      int64
	scope   string
	bucket  time.Duration
	n       int
	partial bool
	want    map[string]int64
}

func (x meters) check(t *testing.T, cases []sumCase) {
	t.Helper()
	for _, c := range cases {
		got, err := x.m.Sum(context.Background(), x.at(c.at), x.scope(c.scope), c.bucket, c.n, c.partial)
		if err != nil {
			t.Fatalf("%s: Sum: %v", c.name, err)
		}
		if diff := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: Sum(%d, %q, %v, %d, %v) (-want +got):\n%s", c.name, c.at, c.scope, c.bucket, c.n, c.partial, diff)
		}
	}
}

type sums = map[string]int64

func testMetersSum(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	const s, keep = time.Second, time.Minute
	x.add(100, "m", s, keep, sums{"a": 1, "b": 2})
	x.add(999, "m", s, keep, sums{"a": 3})
	x.add(1000, "m", s, keep, sums{"a": 10})
	x.add(2500, "m", s, keep, sums{"c": 5, "a": 100})
	x.check(t, []sumCase{
		{name: "two whole", at: 2500, scope: "m", bucket: s, n: 2, want: sums{"a": 14, "b": 2}},
		{name: "two whole and the partial", at: 2500, scope: "m", bucket: s, n: 2, partial: true, want: sums{"a": 114, "b": 2, "c": 5}},
		{name: "one whole", at: 2999, scope: "m", bucket: s, n: 1, want: sums{"a": 10}},
		{name: "only the partial", at: 2000, scope: "m", bucket: s, n: 0, partial: true, want: sums{"a": 100, "c": 5}},
		{name: "nothing", at: 2500, scope: "m", bucket: s, n: 0, want: sums{}},
		{name: "at a boundary the partial is empty", at: 3000, scope: "m", bucket: s, n: 3, partial: true, want: sums{"a": 114, "b": 2, "c": 5}},
		{name: "older buckets than asked are left out", at: 3000, scope: "m", bucket: s, n: 1, want: sums{"a": 100, "c": 5}},
		{name: "a reader behind", at: 1500, scope: "m", bucket: s, n: 1, partial: true, want: sums{"a": 14, "b": 2}},
		{name: "a reader far ahead", at: 100_000, scope: "m", bucket: s, n: 10, want: sums{}},
	})
}

// testMetersKeep: a bucket is summed until its end plus the longest keep
// any Add gave it, and not from then on.
func testMetersKeep(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	const s = time.Second
	x.add(0, "m", s, 2*s, sums{"a": 1})
	x.add(1000, "m", s, 2*s, sums{"a": 2})
	x.add(1500, "m", s, 4*s, sums{"a": 4}) // the second bucket now ends at 6000
	x.add(1800, "m", s, s, sums{"a": 16})  // and a shorter keep does not shorten it
	x.add(2000, "m", s, 1500*time.Millisecond+time.Microsecond, sums{"a": 8})
	x.check(t, []sumCase{
		{name: "all kept", at: 2999, scope: "m", bucket: s, n: 5, partial: true, want: sums{"a": 31}},
		{name: "first bucket gone at end+keep", at: 3000, scope: "m", bucket: s, n: 5, partial: true, want: sums{"a": 30}},
		// The third bucket ends at 3000 and is kept 1501ms, rounded up.
		{name: "sub-ms keep rounds up", at: 4500, scope: "m", bucket: s, n: 5, want: sums{"a": 30}},
		{name: "third gone", at: 4501, scope: "m", bucket: s, n: 5, want: sums{"a": 22}},
		{name: "longest keep holds", at: 5999, scope: "m", bucket: s, n: 6, want: sums{"a": 22}},
		{name: "all gone", at: 6000, scope: "m", bucket: s, n: 6, want: sums{}},
		{name: "a reader behind sees them again", at: 2999, scope: "m", bucket: s, n: 5, partial: true, want: sums{"a": 31}},
	})
	// A write far ahead may drop what only a reader behind would see;
	// readers are within a second of each other, so only its own buckets
	// are checked.
	x.add(100_000, "m", s, 0, sums{"b": 1})
	x.check(t, []sumCase{
		{name: "keep 0: the partial only", at: 100_999, scope: "m", bucket: s, n: 0, partial: true, want: sums{"b": 1}},
		{name: "keep 0: gone once whole", at: 101_000, scope: "m", bucket: s, n: 1, want: sums{}},
	})
}

func testMetersZero(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	x.add(0, "m", time.Second, time.Minute, sums{"z": 0, "a": 1})
	x.add(0, "m", time.Second, time.Minute, sums{"y": 0})
	x.add(0, "m", time.Second, time.Minute, nil)
	x.check(t, []sumCase{
		{name: "names with no counts are absent", at: 0, scope: "m", bucket: time.Second, n: 0, partial: true, want: sums{"a": 1}},
	})
}

func testMetersApart(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	x.add(500, "m", time.Second, time.Minute, sums{"a": 1})
	x.add(500, "m", 10*time.Second, time.Minute, sums{"a": 2})
	x.add(500, "m}:1000:0", time.Second, time.Minute, sums{"a": 4})
	x.add(500, "{m}", time.Second, time.Minute, sums{"a": 8})
	x.add(500, "m:1000", time.Second, time.Minute, sums{"a": 16})
	x.check(t, []sumCase{
		{name: "1s", at: 500, scope: "m", bucket: time.Second, partial: true, want: sums{"a": 1}},
		{name: "10s", at: 500, scope: "m", bucket: 10 * time.Second, partial: true, want: sums{"a": 2}},
		{name: "brace", at: 500, scope: "m}:1000:0", bucket: time.Second, partial: true, want: sums{"a": 4}},
		{name: "tag", at: 500, scope: "{m}", bucket: time.Second, partial: true, want: sums{"a": 8}},
		{name: "colon", at: 500, scope: "m:1000", bucket: time.Second, partial: true, want: sums{"a": 16}},
		{name: "other width", at: 500, scope: "m", bucket: 2 * time.Second, partial: true, want: sums{}},
	})
}

func testMetersBad(t *testing.T, m limit.Meters, e sharedEnv) {
	ctx := context.Background()
	now := e.at(0)
	good := e.scope("g")
	long := strings.Repeat("x", limit.MaxScopeBytes+1)
	manyNames := sums{}
	for i := range limit.MaxMeterNames + 1 {
		manyNames[fmt.Sprint("n", i)] = 1
	}
	adds := []struct {
		name   string
		scope  string
		bucket time.Duration
		keep   time.Duration
		counts sums
	}{
		{name: "EmptyScope", scope: "", bucket: time.Second, counts: sums{"a": 1}},
		{name: "LongScope", scope: long, bucket: time.Second, counts: sums{"a": 1}},
		{name: "ZeroBucket", scope: good, bucket: 0, counts: sums{"a": 1}},
		{name: "NegativeBucket", scope: good, bucket: -time.Second, counts: sums{"a": 1}},
		{name: "SubMillisecondBucket", scope: good, bucket: 1500 * time.Microsecond, counts: sums{"a": 1}},
		{name: "NegativeKeep", scope: good, bucket: time.Second, keep: -1, counts: sums{"a": 1}},
		{name: "EmptyName", scope: good, bucket: time.Second, counts: sums{"a": 1, "": 1}},
		{name: "LongName", scope: good, bucket: time.Second, counts: sums{"a": 1, strings.Repeat("n", limit.MaxMeterNameBytes+1): 1}},
		{name: "NegativeCount", scope: good, bucket: time.Second, counts: sums{"a": 1, "b": -1}},
		{name: "TooManyNames", scope: good, bucket: time.Second, counts: manyNames},
	}
	for _, tt := range adds {
		if err := m.Add(ctx, now, tt.scope, tt.bucket, tt.keep, tt.counts); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Add %s: error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	reads := []struct {
		name   string
		scope  string
		bucket time.Duration
		n      int
	}{
		{name: "EmptyScope", scope: "", bucket: time.Second, n: 1},
		{name: "LongScope", scope: long, bucket: time.Second, n: 1},
		{name: "ZeroBucket", scope: good, bucket: 0, n: 1},
		{name: "NegativeN", scope: good, bucket: time.Second, n: -1},
		{name: "TooManyBuckets", scope: good, bucket: time.Second, n: limit.MaxMeterBuckets + 1},
	}
	for _, tt := range reads {
		if _, err := m.Sum(ctx, now, tt.scope, tt.bucket, tt.n, true); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Sum %s: error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	x := meters{e, m}
	x.check(t, []sumCase{{name: "rejected adds changed nothing", at: 0, scope: "g", bucket: time.Second, n: 1, partial: true, want: sums{}}})
	// The caps themselves are allowed.
	delete(manyNames, "n0")
	delete(manyNames, "n1")
	manyNames[strings.Repeat("n", limit.MaxMeterNameBytes)] = 1
	x.add(0, "g", time.Second, time.Minute, manyNames)
	if got, err := m.Sum(ctx, now, good, time.Second, limit.MaxMeterBuckets, true); err != nil || len(got) != limit.MaxMeterNames {
		t.Errorf("Sum at the caps = %d names, %v; want %d", len(got), err, limit.MaxMeterNames)
	}
}

func testMetersConcurrent(t *testing.T, m limit.Meters, e sharedEnv) {
	x := meters{e, m}
	const workers, adds = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*adds)
	for w := range workers {
		wg.Go(func() {
			for i := range adds {
				// Two buckets, 1000 and 1999 land in the same one.
				at := int64(1000 + 999*(i%2))
				if err := m.Add(context.Background(), e.at(at), e.scope("m"), time.Second, time.Minute, sums{"a": 1, fmt.Sprint("w", w): int64(i)}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := sums{"a": workers * adds}
	for w := range workers {
		want[fmt.Sprint("w", w)] = adds * (adds - 1) / 2
	}
	x.check(t, []sumCase{{name: "exact", at: 2000, scope: "m", bucket: time.Second, n: 1, want: want}})
}
