package overlimit_test

import (
	"context"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/overlimit"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// scriptCalls returns the EVALSHA and EVAL calls Redis has served.
func scriptCalls(tb testing.TB, srv *redistest.Server) int64 {
	tb.Helper()
	info, err := srv.Client(tb).Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, m := range regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

// TestRedisRoundTrips hammers a key over its limit for a second of real
// time and counts the script calls Redis served: about one per RetryAfter,
// not one per decision.
func TestRedisRoundTrips(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs for a second of real time")
	}
	srv := redistest.Start(t)
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	rs := redisstore.New(client)
	t.Cleanup(func() { _ = rs.Close() })
	in := &counting{inner: rs}
	s := overlimit.New(in, overlimit.Options{})
	// 5 per 100 ms, fixed: the key is over its limit for most of each window.
	c := limit.Charge{
		Key:       limit.Key(limit.Requests, limit.FixedWindow, 100*time.Millisecond, "overlimit", []limit.Entry{{Key: "k", Value: "hot"}}),
		Algorithm: limit.FixedWindow, Amount: 5, Window: 100 * time.Millisecond, Cost: 1,
	}
	ctx := context.Background()
	before := scriptCalls(t, srv)
	const workers = 8
	var mu sync.Mutex
	var decisions, admitted int64
	end := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var n, ok int64
			res := make([]limit.Result, 1)
			for time.Now().Before(end) {
				a, err := s.Apply(ctx, time.Now(), []limit.Charge{c}, res)
				if err != nil {
					t.Errorf("Apply: %v", err)
					return
				}
				n++
				if a {
					ok++
				}
			}
			mu.Lock()
			decisions, admitted = decisions+n, admitted+ok
			mu.Unlock()
		})
	}
	wg.Wait()
	calls := scriptCalls(t, srv) - before
	local := int64(s.LocalDenials())
	t.Logf("%d decisions in 1s, %d admitted, %d answered locally, %d inner calls, %d script calls in Redis commandstats (%.5f per decision)",
		decisions, admitted, local, in.calls.Load(), calls, float64(calls)/float64(decisions))
	// 10 windows of 100 ms; 5 admissions each, then the first denial of
	// each window per worker racing it. Allow a generous margin.
	if max := int64(12 * (5 + workers) * 2); calls > max {
		t.Errorf("%d script calls, want at most %d", calls, max)
	}
	if admitted > 11*5 {
		t.Errorf("%d admitted in about 10 windows of 5", admitted)
	}
	if in.calls.Load()+local != decisions {
		t.Errorf("inner calls %d + local %d != decisions %d", in.calls.Load(), local, decisions)
	}
}
