package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// decodeWindow reads a window's string, the MessagePack array {w, h, c0,
// c1, ...} apply.lua writes, as integers.
func decodeWindow(s string) ([]int64, error) {
	b := []byte(s)
	next := func(n int) ([]byte, error) {
		if len(b) < n {
			return nil, errors.New("truncated")
		}
		v := b[:n]
		b = b[n:]
		return v, nil
	}
	head, err := next(1)
	if err != nil {
		return nil, err
	}
	var n int
	switch h := head[0]; {
	case h&0xf0 == 0x90:
		n = int(h & 0x0f)
	case h == 0xdc:
		v, err := next(2)
		if err != nil {
			return nil, err
		}
		n = int(binary.BigEndian.Uint16(v))
	default:
		return nil, fmt.Errorf("not an array: %#x", h)
	}
	out := make([]int64, n)
	for i := range out {
		t, err := next(1)
		if err != nil {
			return nil, err
		}
		var v []byte
		switch h := t[0]; {
		case h < 0x80:
			out[i] = int64(h)
			continue
		case h >= 0xe0:
			out[i] = int64(int8(h))
			continue
		case h == 0xcc, h == 0xd0:
			v, err = next(1)
		case h == 0xcd, h == 0xd1:
			v, err = next(2)
		case h == 0xce, h == 0xd2:
			v, err = next(4)
		case h == 0xcf, h == 0xd3, h == 0xcb:
			v, err = next(8)
		default:
			return nil, fmt.Errorf("element %d: not a number: %#x", i, h)
		}
		if err != nil {
			return nil, err
		}
		var u uint64
		for _, x := range v {
			u = u<<8 | uint64(x)
		}
		switch t[0] {
		case 0xd0:
			out[i] = int64(int8(u))
		case 0xd1:
			out[i] = int64(int16(u))
		case 0xd2:
			out[i] = int64(int32(u))
		case 0xcb:
			f := math.Float64frombits(u)
			if f != math.Trunc(f) {
				return nil, fmt.Errorf("element %d: %v is not an integer", i, f)
			}
			out[i] = int64(f)
		default:
			out[i] = int64(u)
		}
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("%d bytes after the array", len(b))
	}
	return out, nil
}

// windowState describes what a window key holds: "" when it does not
// exist, else its decoded array, for comparing a key before and after.
func windowState(t testing.TB, c redis.Cmdable, key string) string {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	w, err := decodeWindow(v)
	if err != nil {
		t.Fatalf("GET %s = %q: %v", key, v, err)
	}
	return fmt.Sprint(w)
}

// TestApplyWindowLayout pins the window's string: {w, h, c0, c1, ...}
// with ci the count of bucket h-i and no trailing zeros.
func TestApplyWindowLayout(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	ms := t0.UnixMilli()
	// w = 3000, M = 20.
	ch := limit.Charge{Key: key(limit.SlidingWindow, time.Minute, "layout"), Algorithm: limit.SlidingWindow, Amount: 100, Window: time.Minute}
	with := func(cost int64) limit.Charge { x := ch; x.Cost = cost; return x }
	cur := ms / 3000
	for _, tt := range []struct {
		name string
		at   time.Duration
		give limit.Charge
		want []int64
	}{
		{name: "a check writes the high-water mark", give: with(0), want: []int64{3000, cur}},
		{name: "a charge", give: with(2), want: []int64{3000, cur, 2}},
		{name: "three buckets later", at: 9 * time.Second, give: with(5), want: []int64{3000, cur + 3, 5, 0, 0, 2}},
		{name: "a refund at the first bucket", at: 9 * time.Second, give: func() limit.Charge { x := with(-2); x.At = ms; return x }(), want: []int64{3000, cur + 3, 5}},
		{name: "the newest bucket emptied", at: 9 * time.Second, give: with(-5), want: []int64{3000, cur + 3}},
		{name: "twenty buckets later", at: 69 * time.Second, give: with(1), want: []int64{3000, cur + 23, 1}},
	} {
		apply(t, s, t0.Add(tt.at), tt.give)
		if got := windowState(t, c, ch.Key); got != fmt.Sprint(tt.want) {
			t.Errorf("%s: %s holds %s, want %v", tt.name, ch.Key, got, tt.want)
		}
	}
}

// TestApplyWindowWrongType checks that a window key holding another type
// (the hash layout of versions before the MessagePack string, which the
// script no longer reads, or anything else) is an error, not a fresh
// window, and is left as it was.
func TestApplyWindowWrongType(t *testing.T) {
	t.Parallel()
	s, c := newSingle(t)
	ctx := context.Background()
	cur := t0.UnixMilli() / 3000
	ch := limit.Charge{Key: key(limit.SlidingWindow, time.Minute, "hash"), Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Minute, Cost: 1}
	fields := []any{"w", "3000", "h", strconv.FormatInt(cur, 10), strconv.FormatInt(cur, 10), "2"}
	if err := c.HSet(ctx, ch.Key, fields...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, t0, []limit.Charge{ch}, make([]limit.Result, 1)); err == nil {
		t.Error("Apply on a hash: no error")
	}
	if got, err := c.HGet(ctx, ch.Key, strconv.FormatInt(cur, 10)).Result(); err != nil || got != "2" {
		t.Errorf("after Apply the hash's bucket holds %q, %v; want it untouched", got, err)
	}
}

func TestDecodeWindow(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		give    string
		want    []int64
		wantErr bool
	}{
		{name: "fixints", give: "\x93\x01\x02\x03", want: []int64{1, 2, 3}},
		{name: "wide", give: "\x93\xcd\x0b\xb8\xce\x00\x08\xa5\x8a\xcf\x00\x20\x00\x00\x00\x00\x00\x00", want: []int64{3000, 566666, 1 << 53}},
		{name: "not an array", give: "x", wantErr: true},
		{name: "truncated", give: "\x93\x01\x02", wantErr: true},
		{name: "a string element", give: "\x91\xa1x", wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := decodeWindow(tt.give)
			if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
				t.Fatalf("decodeWindow(%q) = %v, %v; want %v, error %v", tt.give, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
