package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/test/redistest"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// geometryProbe runs apply.lua's own window arithmetic on one fresh
// window: touch at now, one count in now's bucket, then the high-water
// bucket, the reset after and the expiry the script derives from the w
// and M it is given.
var geometryProbe = redis.NewScript(applyLua + `
bind()
now = tonumber(ARGV[1])
local w, m, fixed = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == 'f'
local c = {0, 0}
touch(c, w, m)
c[3] = 1
local cur, top = view(c, w, m)
return {c[2], resetAfter(c, top, cur, w, m, fixed), expiry({type = 'window', work = c, last = {p1 = w, p2 = m}})}
`)

// TestWindowGeometryAgrees checks that the bucket arithmetic apply.lua
// keeps (it must: it runs in Redis) agrees with limit's, which memstore
// and every decorator use: for each window and instant, the bucket index,
// the reset after and the expiry of a window with one count in now's
// bucket.
func TestWindowGeometryAgrees(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client(t)
	ms := t0.UnixMilli()
	sliding := func(window time.Duration, buckets uint16) limit.Charge {
		return limit.Charge{Algorithm: limit.SlidingWindow, Amount: 10, Window: window, Buckets: buckets}
	}
	fixed := func(window time.Duration) limit.Charge {
		return limit.Charge{Algorithm: limit.FixedWindow, Amount: 10, Window: window}
	}
	for _, tt := range []struct {
		name string
		give limit.Charge
		now  int64
	}{
		{name: "default buckets", give: sliding(time.Minute, 0), now: ms},
		{name: "even buckets", give: sliding(time.Minute, 6), now: ms},
		{name: "uneven buckets", give: sliding(time.Minute, 7), now: ms},
		{name: "uneven buckets, on a boundary", give: sliding(time.Minute, 7), now: 8572 * 198_333_333},
		{name: "uneven buckets, just before a boundary", give: sliding(time.Minute, 7), now: 8572*198_333_333 - 1},
		{name: "rounded up twice", give: sliding(10*time.Millisecond, 4), now: ms},
		{name: "more buckets than ms", give: sliding(10*time.Millisecond, 50), now: ms},
		{name: "buckets capped", give: sliding(time.Hour, 60000), now: ms},
		{name: "sub-millisecond window", give: sliding(time.Microsecond, 0), now: ms},
		{name: "the longest window", give: sliding(limit.MaxWindow, limit.MaxBuckets), now: ms},
		{name: "epoch", give: sliding(time.Minute, 7), now: 0},
		{name: "before the epoch", give: sliding(time.Minute, 7), now: -1},
		{name: "before the epoch, on a boundary", give: sliding(time.Minute, 7), now: -8572},
		{name: "year 2200", give: sliding(time.Minute, 7), now: 7_258_118_400_123},
		{name: "fixed", give: fixed(time.Hour), now: ms},
		{name: "fixed, on a boundary", give: fixed(time.Hour), now: 3_600_000 * 472_222},
		{name: "fixed, sub-millisecond", give: fixed(time.Microsecond), now: ms},
		{name: "fixed, before the epoch", give: fixed(time.Minute), now: -59_999},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := tt.give
			w, m := limit.Geometry(&ch)
			var want limit.Counter
			ch.Cost = 1
			if fits, _ := want.Step(&ch, tt.now); !fits {
				t.Fatalf("Counter.Step of 1 on a fresh window does not fit")
			}
			ch.Cost = 0
			_, wantReset := want.Report(&ch, tt.now)
			wantExp, ok := want.Expiry(&ch)
			if !ok {
				t.Fatalf("Counter.Expiry: none")
			}
			if end := limit.BucketEnd(&ch, tt.now); end != (want.High+1)*w {
				t.Fatalf("limit.BucketEnd = %d, want (High+1)*w = %d", end, (want.High+1)*w)
			}
			kind := "s"
			if ch.Algorithm == limit.FixedWindow {
				kind = "f"
			}
			got, err := geometryProbe.Eval(context.Background(), c, nil, tt.now, w, m, kind).Int64Slice()
			if err != nil {
				t.Fatalf("probe: %v", err)
			}
			want3 := []int64{want.High, wantReset, wantExp}
			if len(got) != 3 || got[0] != want3[0] || got[1] != want3[1] || got[2] != want3[2] {
				t.Errorf("w %d, M %d, now %d: Lua (bucket, reset after, expiry) = %v, limit.Counter %v", w, m, tt.now, got, want3)
			}
		})
	}
}
