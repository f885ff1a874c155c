package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// newOptimistic starts a redis-server and returns a Store on it with
// WithOptimisticFixed, batching as testBatch says, and a plain client.
func newOptimistic(t testing.TB) (*Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return optimisticOn(t, srv), srv.Client(t)
}

// optimisticOn returns a Store with WithOptimisticFixed on srv: one
// replica.
func optimisticOn(t testing.TB, srv *redistest.Server) *Store {
	t.Helper()
	c, err := NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts := []StoreOption{WithOptimisticFixed(true)}
	if testBatch > 1 {
		opts = append(opts, WithBatch(testBatch))
	}
	s := New(c, opts...)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	return s
}

// TestConformanceOptimistic: one decision at a time, the optimistic path
// answers every conformance script and property as the counts script.
func TestConformanceOptimistic(t *testing.T) {
	t.Parallel()
	s, _ := newOptimistic(t)
	storetest.Run(t, func(testing.TB) limit.Store { return s })
}

// fixedCharge is a fixed window of amount a minute on tenant's key.
func fixedCharge(tenant string, amount uint64, cost int64) limit.Charge {
	return limit.Charge{Key: key(limit.FixedWindow, time.Minute, tenant), Algorithm: limit.FixedWindow, Amount: amount, Window: time.Minute, Cost: cost}
}

// TestOptimisticSameAsScript runs one random sequence of fixed-window
// decisions (acquisitions that fit and that do not, of one to three
// charges, now and then a check or a refund, which the script runs) on an
// optimistic store and on one that runs the counts script, and wants the
// same answers, and at the end the same counts in Redis, every key with
// an expiry.
func TestOptimisticSameAsScript(t *testing.T) {
	t.Parallel()
	opt, oc := newOptimistic(t)
	script, sc := newSingle(t)
	r := rand.New(rand.NewPCG(17, uint64(testBatch)))
	tenants := []string{"a", "b", "c", "d"}
	amounts := map[string]uint64{"a": 5, "b": 9, "c": 3, "d": 20}
	now := t0
	for step := range 600 {
		now = now.Add(time.Duration(r.IntN(400)) * time.Millisecond)
		n := 1 + r.IntN(3)
		var cs []limit.Charge
		for _, i := range r.Perm(len(tenants))[:n] {
			tn := tenants[i]
			cost := 1 + r.Int64N(int64(amounts[tn])+1)
			if r.IntN(10) == 0 {
				cost = -r.Int64N(3) // a check or a refund: the script's
			}
			cs = append(cs, fixedCharge(tn, amounts[tn], cost))
		}
		okO, resO := apply(t, opt, now, cs...)
		okS, resS := apply(t, script, now, cs...)
		if okO != okS || !slices.Equal(resO, resS) {
			t.Fatalf("step %d at %v, costs %v: optimistic %v %+v, script %v %+v", step, now.Sub(t0), costs(cs), okO, resO, okS, resS)
		}
	}
	want, got := countKeys(t, sc), countKeys(t, oc)
	if len(want) == 0 {
		t.Fatal("the script left no count key")
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: optimistic store left %q, script %q", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok && v != "0" {
			t.Errorf("%s: optimistic store left %q, script nothing", k, v)
		}
	}
}

func costs(cs []limit.Charge) []int64 {
	out := make([]int64, len(cs))
	for i := range cs {
		out[i] = cs[i].Cost
	}
	return out
}

// countKeys is every key's value, failing the test for a key without an
// expiry.
func countKeys(t *testing.T, c *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		v, err := c.Get(ctx, k).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("%s expires in %v, want a time", k, ttl)
		}
		out[k] = v
	}
	return out
}

// TestOptimisticCommands: an admitted decision is three plain commands a
// charge and no script; a denied one takes its charges back; a check
// runs the script.
func TestOptimisticCommands(t *testing.T) {
	t.Parallel()
	s, c := newOptimistic(t)
	ctx := context.Background()
	a, b := fixedCharge("cmd-a", 2, 1), fixedCharge("cmd-b", 1, 1)
	if ok, _ := apply(t, s, t0, a, b); !ok {
		t.Fatal("the first decision was denied")
	}
	if n := commandCalls(t, c, "fcall"); n != 0 {
		t.Errorf("an admitted decision ran %d FCALLs, want none", n)
	}
	if n := commandCalls(t, c, "incrby"); n != 2 {
		t.Errorf("an admitted decision of 2 charges ran %d INCRBYs, want 2", n)
	}
	// b is full: the decision is denied, and a's charge taken back.
	if ok, res := apply(t, s, t0, a, b); ok || !res[0].Fits || res[1].Fits {
		t.Fatalf("the second decision: %v %+v, want denied by its second charge", ok, res)
	}
	if n := commandCalls(t, c, "incrby"); n != 6 {
		t.Errorf("after a denial, %d INCRBYs in all, want 6 (2 + 2 charges + 2 taken back)", n)
	}
	ka, _ := limit.CountKey(&a, t0.UnixMilli())
	if v := c.Get(ctx, ka).Val(); v != "1" {
		t.Errorf("a's count after the denial is %q, want 1", v)
	}
	check := fixedCharge("cmd-a", 2, 0)
	if ok, _ := apply(t, s, t0, check); !ok {
		t.Error("a check with room was denied")
	}
	if n := commandCalls(t, c, "fcall"); n != 1 {
		t.Errorf("a check ran %d FCALLs, want 1 (the script)", n)
	}
}

// TestOptimisticNextWindow: a decision that finds the next window started
// by a clock ahead counts there, as the script does: it takes back its
// INCRBY and runs the script.
func TestOptimisticNextWindow(t *testing.T) {
	t.Parallel()
	opt, oc := newOptimistic(t)
	script, _ := newSingle(t)
	ch := fixedCharge("next", 3, 1)
	ahead := t0.Truncate(time.Minute).Add(time.Minute + time.Second)
	behind := ahead.Add(-3 * time.Second)
	for _, s := range []*Store{opt, script} {
		apply(t, s, ahead, ch)
	}
	okO, resO := apply(t, opt, behind, ch)
	okS, resS := apply(t, script, behind, ch)
	if okO != okS || resO[0] != resS[0] {
		t.Fatalf("behind the next window: optimistic %v %+v, script %v %+v", okO, resO, okS, resS)
	}
	if resO[0].ResetAfter <= time.Minute || resO[0].Remaining != 1 {
		t.Errorf("the decision behind counted %+v, want the next window's (remaining 1, reset after more than a minute)", resO[0])
	}
	next, _ := limit.CountKey(&ch, ahead.UnixMilli())
	cur, _ := limit.CountKey(&ch, behind.UnixMilli())
	ctx := context.Background()
	if v := oc.Get(ctx, next).Val(); v != "2" {
		t.Errorf("the next window's count is %q, want 2", v)
	}
	if v, err := oc.Get(ctx, cur).Result(); err != redis.Nil && v != "0" {
		t.Errorf("the window behind holds %q, %v; want nothing or 0", v, err)
	}
}

// TestOptimisticBadKey: a charge on a key that holds no count fails the
// decision, as the script's does, and the decision's other charges are
// taken back.
func TestOptimisticBadKey(t *testing.T) {
	t.Parallel()
	s, c := newOptimistic(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name  string
		setup func(k string) error
	}{
		{"a list", func(k string) error { return c.RPush(ctx, k, "x").Err() }},
		{"not an integer", func(k string) error { return c.Set(ctx, k, "1.5", 0).Err() }},
		{"below zero", func(k string) error { return c.Set(ctx, k, "-1", 0).Err() }},
		{"above the largest count", func(k string) error { return c.Set(ctx, k, fmt.Sprint(int64(limit.MaxCount)+1), 0).Err() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			good, bad := fixedCharge("good-"+tt.name, 5, 1), fixedCharge("bad-"+tt.name, 5, 1)
			kb, _ := limit.CountKey(&bad, t0.UnixMilli())
			if err := tt.setup(kb); err != nil {
				t.Fatal(err)
			}
			_, err := s.Apply(ctx, t0, []limit.Charge{good, bad}, make([]limit.Result, 2))
			if err == nil || !strings.Contains(err.Error(), "holds no count") {
				t.Fatalf("Apply = %v, want an error that a key holds no count", err)
			}
			kg, _ := limit.CountKey(&good, t0.UnixMilli())
			if v, err := c.Get(ctx, kg).Result(); err != redis.Nil && v != "0" {
				t.Errorf("the good charge's count after the failure is %q, %v; want nothing or 0", v, err)
			}
		})
	}
}

// TestOptimisticReplicas: replicas deciding concurrently on one Redis
// never admit more than a limit. Decisions of one charge of cost 1 admit
// it exactly: one is refused only when the limit's worth of others is
// counted. Decisions of two charges each keep all or nothing: what stays
// counted in Redis is exactly what was admitted.
func TestOptimisticReplicas(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	stores := []*Store{optimisticOn(t, srv), optimisticOn(t, srv), optimisticOn(t, srv)}
	c := srv.Client(t)
	ctx := context.Background()
	const limitA, limitB, limitC = 40, 25, 30
	a, b, cc := fixedCharge("rep-a", limitA, 1), fixedCharge("rep-b", limitB, 1), fixedCharge("rep-c", limitC, 1)
	var admittedA, admittedB, admittedC atomic.Int64
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			s := stores[g%len(stores)]
			for i := range 12 {
				var cs []limit.Charge
				switch (g + i) % 3 {
				case 0:
					cs = []limit.Charge{a}
				case 1:
					cs = []limit.Charge{b, cc}
				default:
					big := cc
					big.Cost = 3
					cs = []limit.Charge{big, b}
				}
				res := make([]limit.Result, len(cs))
				ok, err := s.Apply(ctx, t0, cs, res)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				for _, ch := range cs {
					switch ch.Key {
					case a.Key:
						admittedA.Add(ch.Cost)
					case b.Key:
						admittedB.Add(ch.Cost)
					default:
						admittedC.Add(ch.Cost)
					}
				}
			}
		})
	}
	wg.Wait()
	if got := admittedA.Load(); got != limitA {
		t.Errorf("one-charge decisions admitted %d, want exactly the limit %d (96 tried)", got, limitA)
	}
	for _, x := range []struct {
		ch       limit.Charge
		admitted int64
		limit    int64
	}{{b, admittedB.Load(), limitB}, {cc, admittedC.Load(), limitC}} {
		k, _ := limit.CountKey(&x.ch, t0.UnixMilli())
		n, err := c.Get(ctx, k).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if x.admitted > x.limit || n != x.admitted {
			t.Errorf("%s: admitted %d, Redis counts %d; want at most %d admitted, all of it counted and nothing else", k, x.admitted, n, x.limit)
		}
	}
}

// afterPipeline is a go-redis hook that calls itself with each
// pipeline's commands once Redis has answered them, before the store
// reads them.
type afterPipeline func(cmds []redis.Cmder)

func (afterPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (afterPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h afterPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h(cmds)
		return err
	}
}

// hookedOptimistic is an unbatched optimistic store on a redis-server of
// its own whose client runs h, and that server.
func hookedOptimistic(t *testing.T, h afterPipeline) (*Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	c, err := NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	c.AddHook(h)
	s := New(c, WithOptimisticFixed(true))
	t.Cleanup(func() { _ = s.Close() })
	return s, srv
}

// TestOptimisticTakeBackOutlivesDeadline: a denied decision whose context
// ends after its INCRBY was answered still has its charge taken back.
func TestOptimisticTakeBackOutlivesDeadline(t *testing.T) {
	t.Parallel()
	// Once a pipeline that charged (SET NX) is answered, cancel: the
	// decision's deadline comes between its INCRBY and its take-back.
	var cancel atomic.Pointer[context.CancelFunc]
	s, srv := hookedOptimistic(t, func(cmds []redis.Cmder) {
		for _, c := range cmds {
			if f := cancel.Load(); f != nil && c.Name() == "set" && slices.Contains(c.Args(), any("nx")) {
				(*f)()
			}
		}
	})
	rc := srv.Client(t)
	ch := fixedCharge("deadline", 1, 1)
	if ok, _ := apply(t, s, t0, ch); !ok {
		t.Fatal("the first decision was denied")
	}
	ctx, stop := context.WithCancel(context.Background())
	cancel.Store(&stop)
	ok, _ := s.Apply(ctx, t0, []limit.Charge{ch}, make([]limit.Result, 1))
	if ok {
		t.Fatal("a decision past the limit was admitted")
	}
	if ctx.Err() == nil {
		t.Fatal("the hook did not end the decision's context: the test tests nothing")
	}
	k, _ := limit.CountKey(&ch, t0.UnixMilli())
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := rc.Get(context.Background(), k).Result()
		if err == nil && v == "1" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the count is %q, %v, 5s after the denial; want 1, the charge taken back", v, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOptimisticLostReply: a decision whose replies did not all come
// fails, and what its INCRBYs charged is taken back.
func TestOptimisticLostReply(t *testing.T) {
	t.Parallel()
	// The first GET of each pipeline fails as a broken connection would,
	// after Redis ran everything.
	s, srv := hookedOptimistic(t, func(cmds []redis.Cmder) {
		for _, c := range cmds {
			if c.Name() == "get" {
				c.SetErr(errors.New("injected: connection reset"))
				return
			}
		}
	})
	a, b := fixedCharge("lost-a", 5, 2), fixedCharge("lost-b", 5, 3)
	if _, err := s.Apply(context.Background(), t0, []limit.Charge{a, b}, make([]limit.Result, 2)); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Apply = %v, want the lost reply's error", err)
	}
	rc := srv.Client(t)
	for _, ch := range []limit.Charge{a, b} {
		k, _ := limit.CountKey(&ch, t0.UnixMilli())
		if v := rc.Get(context.Background(), k).Val(); v != "0" {
			t.Errorf("%s holds %q after the failed decision, want 0: its charge taken back", k, v)
		}
	}
}
