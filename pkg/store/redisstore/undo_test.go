package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TestApplyUndoArguments checks that an undo whose per-key value is not
// what a try wrote is an error that writes nothing, and that the value a
// try wrote takes back what it kept (the key is as a denial leaves it),
// for every kind of counter.
func TestApplyUndoArguments(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	ctx := context.Background()
	ms := t0.UnixMilli()
	for _, tt := range []struct {
		name string
		give limit.Charge
	}{
		{name: "window", give: limit.Charge{Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Minute, Cost: 2}},
		{name: "token bucket", give: limit.Charge{Algorithm: limit.TokenBucket, Amount: 10, Window: time.Minute, Cost: 2}},
		{name: "lease", give: limit.Charge{Algorithm: limit.Concurrency, Amount: 2, Window: time.Minute, Cost: 1, Member: "r1"}},
		{name: "mark", give: limit.Charge{Algorithm: limit.Once, Window: time.Minute, Cost: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := tt.give
			ch.Key = key(ch.Algorithm, time.Minute, "undo-"+tt.name)
			dump := func() string {
				t.Helper()
				v, err := c.Dump(ctx, ch.Key).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
				return fmt.Sprintf("%q", v)
			}
			// A check first: a denial, which an undo leaves, still
			// moves a window's high-water mark.
			check := ch
			check.Cost, check.Member = 0, ""
			apply(t, s, t0, check)
			before := dump()
			try, err := newCall("try", ms, []limit.Charge{ch})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := s.run(ctx, try)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := try.decode(rep, []limit.Charge{ch}, make([]limit.Result, 1)); err != nil || !try.admitted {
				t.Fatalf("try: admitted %v, %v", try.admitted, err)
			}
			u, ok, err := try.undoCall(rep)
			if err != nil || !ok {
				t.Fatalf("undoCall: kept %v, %v", ok, err)
			}
			kept := dump()
			if kept == before {
				t.Fatal("the try kept nothing")
			}
			for _, bad := range []string{"x", "\xa1x", "\xc1"} {
				b := *u
				b.args = append(append([]any(nil), u.args[:len(u.args)-1]...), bad)
				if _, err := s.run(ctx, &b); err == nil {
					t.Errorf("undo with %q: no error", bad)
				}
				if got := dump(); got != kept {
					t.Errorf("undo with %q changed the key", bad)
				}
			}
			if _, err := s.run(ctx, u); err != nil {
				t.Fatalf("undo: %v", err)
			}
			if got := dump(); got != before {
				t.Errorf("after the undo the key is %s, want %s as a denial leaves it", got, before)
			}
		})
	}
}
