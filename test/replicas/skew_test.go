package replicas

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestReplicaBehindAtBoundary runs two replicas in process, each with its
// own Redis client, store, limiter and clock, the second 2ms behind the
// first. Replicas on different hosts never agree to the millisecond, and
// on one host a decision can read the clock, wait 2ms for Redis, and run
// after decisions that read it later: the store sees the same sequence of
// nows either way. Just after a bucket boundary the first replica admits
// a full limit; the one behind, still before the boundary, must then admit
// nothing. With skew d a correct cluster can misplace an admission by d,
// so at most the limit fits in any interval of W - 2d; here every
// admission lies within 2ms.
func TestReplicaBehindAtBoundary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server; skipped with -short")
	}
	t.Parallel()
	rdb := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	newReplica := func(clock limit.Clock) *admission.Limiter {
		rs, err := config.Load(path)
		if err != nil {
			t.Fatalf("load rules: %v", err)
		}
		c, err := redisstore.NewClient(rdb.URL())
		if err != nil {
			t.Fatalf("redis client: %v", err)
		}
		store := redisstore.New(c)
		t.Cleanup(func() { _ = store.Close() })
		return admission.NewLimiter(store, clock, rs)
	}
	const w = window / buckets
	t0 := time.Now().Truncate(w) // bucket k starts at t0
	clockA, clockB := storetest.NewFakeClock(t0), storetest.NewFakeClock(t0)
	a, b := newReplica(clockA), newReplica(clockB)

	admit := func(l *admission.Limiter, n int) int {
		req := &limit.Request{Domain: "replicas", Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}}}}}
		got := 0
		for range n {
			d, err := l.Decide(t.Context(), req)
			if err != nil {
				t.Fatalf("decide: %v", err)
			}
			if d.Code == limit.CodeOK {
				got++
			}
		}
		return got
	}

	clockA.Set(t0.Add(time.Millisecond))
	if got := admit(a, limitAmount+50); got != limitAmount {
		t.Fatalf("first burst: admitted %d, want %d", got, limitAmount)
	}
	// Bucket k leaves the count at k+M+1: (M+1)w after t0.
	boundary := t0.Add((buckets + 1) * w)
	clockA.Set(boundary.Add(time.Millisecond))
	if got := admit(a, limitAmount+50); got != limitAmount {
		t.Fatalf("after the first burst left the count: admitted %d, want %d", got, limitAmount)
	}
	clockB.Set(boundary.Add(-time.Millisecond))
	if got := admit(b, 50); got != 0 {
		t.Errorf("SAFETY: the replica 2ms behind admitted %d more right after the other admitted %d: "+
			"%d admissions within 2ms, limit %d per %v", got, limitAmount, limitAmount+got, limitAmount, window)
	}
}
