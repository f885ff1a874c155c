package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/test/faultproxy"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestWarm: Warm opens the pool's idle connections and loads the code
// (the library, or the script where FUNCTION is refused), so the first
// decision runs it in one call on an open connection.
func TestWarm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		query   string
		wantRun string
		// wantConns is the fewest connections Warm must leave open, and
		// maxConns the most: the pool's idle ones may be dialled beside
		// those Warm opens.
		wantConns, maxConns int
	}{
		{name: "functions", wantRun: "fcall", wantConns: WarmConns, maxConns: WarmConns + DefaultMinIdleConns},
		{name: "scripts", args: []string{"--rename-command", "FUNCTION", ""}, wantRun: "evalsha", wantConns: WarmConns, maxConns: WarmConns + DefaultMinIdleConns},
		{name: "no more than the pool", query: "?pool_size=3", wantRun: "fcall", wantConns: 3, maxConns: 3},
		{name: "without idle connections", query: "?min_idle_conns=0", wantRun: "fcall", wantConns: WarmConns, maxConns: WarmConns},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.WithArgs(tt.args...))
			c, err := NewClient(srv.URL() + tt.query)
			if err != nil {
				t.Fatal(err)
			}
			s := newStore(c)
			t.Cleanup(func() { _ = s.Close() })
			admin := srv.Client(t)
			ctx := context.Background()
			if err := s.Warm(ctx); err != nil {
				t.Fatalf("Warm: %v", err)
			}
			// The admin client's own connection is one of the list.
			if n := strings.Count(admin.ClientList(ctx).Val(), "\n") - 1; n < tt.wantConns || n > tt.maxConns {
				t.Errorf("%d connections open after Warm, want %d to %d", n, tt.wantConns, tt.maxConns)
			}
			before := commandCalls(t, admin, tt.wantRun)
			apply(t, s, t0, limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 10, Window: time.Second, Cost: 1})
			if got := commandCalls(t, admin, tt.wantRun) - before; got != 1 {
				t.Errorf("the first decision after Warm ran %d %s, want 1", got, tt.wantRun)
			}
		})
	}
}

func TestWarmCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	client, err := NewClient("redis+cluster://" + strings.Join(c.Addrs(), ",") + "?min_idle_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(client)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	for _, addr := range c.Addrs() {
		node := redis.NewClient(&redis.Options{Addr: addr})
		libs, err := node.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		_ = node.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(libs) != 1 || !strings.HasPrefix(libs[0].Name, "tollgate_") {
			t.Errorf("node %s: libraries after Warm %+v, want the tollgate library", addr, libs)
		}
	}
}

// TestWarmUnreachable: Warm says why it cannot warm up, never with the
// password, within its context.
func TestWarmUnreachable(t *testing.T) {
	t.Parallel()
	const secret = "Warm-S3cret"
	srv := redistest.Start(t)
	addr := srv.Addr()
	srv.Kill()
	c, err := NewClient("redis://u:" + secret + "@" + addr + "?dial_timeout=200ms")
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(c)
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = s.Warm(ctx)
	if err == nil || !strings.Contains(err.Error(), "warm up redis") || strings.Contains(err.Error(), secret) {
		t.Errorf("Warm = %v, want an error that says what failed, without the password", err)
	}
}

// TestReplicasBeat: each live beat counts once, an expired one is gone,
// and a beat is refused without a name or a ttl.
func TestReplicasBeat(t *testing.T) {
	t.Parallel()
	s, rc := newSingle(t)
	r := NewReplicas(s.c)
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	steps := []struct {
		name    string
		at      time.Duration
		replica string
		ttl     time.Duration
		want    int
	}{
		{name: "first", replica: "a", ttl: 5 * time.Second, want: 1},
		{name: "again counts once", at: time.Second, replica: "a", ttl: 5 * time.Second, want: 1},
		{name: "a second replica", at: time.Second, replica: "b", ttl: 2 * time.Second, want: 2},
		{name: "a third", at: 2 * time.Second, replica: "c", ttl: 5 * time.Second, want: 3},
		{name: "b expired at 3s", at: 3 * time.Second, replica: "c", ttl: 5 * time.Second, want: 2},
	}
	for _, st := range steps {
		got, err := r.Beat(ctx, now.Add(st.at), st.replica, st.ttl)
		if err != nil || got != st.want {
			t.Errorf("%s: Beat = %d, %v; want %d", st.name, got, err, st.want)
		}
	}
	if ttl := rc.PTTL(ctx, replicasKey).Val(); ttl <= 0 {
		t.Errorf("%s PTTL = %v, want it to expire", replicasKey, ttl)
	}
	for _, bad := range []struct {
		replica string
		ttl     time.Duration
	}{{"", time.Second}, {"a", 0}} {
		if _, err := r.Beat(ctx, now, bad.replica, bad.ttl); err == nil {
			t.Errorf("Beat(%q, %v) accepted", bad.replica, bad.ttl)
		}
	}
}

// TestSlowCallsKeepTheirConnections: while Redis answers later than the
// decisions' deadlines, the decisions still fail at their deadline, but
// after the first one their calls read the late replies and keep their
// connections, so the next decisions need not dial.
func TestSlowCallsKeepTheirConnections(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	px := faultproxy.New(t, srv.Addr())
	c, err := NewClient("redis://" + px.Addr() + "?min_idle_conns=0")
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(c)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	ch := limit.Charge{Key: "k", Algorithm: limit.SlidingWindow, Amount: 1000, Window: time.Minute, Cost: 1}
	px.Latency(0, 40*time.Millisecond)
	const calls = 20
	for i := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		start := time.Now()
		_, err := s.Apply(ctx, t0.Add(time.Duration(i)*time.Millisecond), []limit.Charge{ch}, make([]limit.Result, 1))
		cancel()
		if err == nil || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "i/o timeout") {
			t.Fatalf("call %d with replies 40ms late: %v, want its deadline exceeded", i, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("call %d took %v, want about its 10ms deadline", i, took)
		}
	}
	px.Pass()
	ok, res := apply(t, s, t0.Add(time.Second), ch)
	// Every call was sent, and Redis ran it: a late reply is still a
	// charge, which is why the store's failures err on the side of
	// refusing.
	if !ok || res[0].Remaining != 1000-calls-1 {
		t.Errorf("after the slow spell: admitted %v, %d left; want admitted with %d left", ok, res[0].Remaining, 1000-calls-1)
	}
	// The first timed-out call closed its connection; the rest kept theirs.
	if n := px.Conns(); n < WarmConns-2 {
		t.Errorf("%d connections open after %d late replies, want about the %d warmed: timed-out calls closed theirs", n, calls, WarmConns)
	}
}

// TestWarmSlowReplies: Warm waits for replies as long as its context
// allows, not the read timeout of a decision. On a busy machine a PING
// can take longer than DefaultReadTimeout; Warm then failed as a whole,
// started over, and the gRPC port waited, for 15 s in one of about 185
// starts (issue 14 item 9).
func TestWarmSlowReplies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give time.Duration // added to every reply
	}{
		{name: "just over the read timeout", give: DefaultReadTimeout + 50*time.Millisecond},
		{name: "twice the read timeout", give: 2 * DefaultReadTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			px := faultproxy.New(t, srv.Addr())
			// Two connections: each waits for its handshake and PING, in turn.
			c, err := NewClient("redis://" + px.Addr() + "?min_idle_conns=0&pool_size=2")
			if err != nil {
				t.Fatal(err)
			}
			s := newStore(c)
			t.Cleanup(func() { _ = s.Close() })
			px.Latency(0, tt.give)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Warm(ctx); err != nil {
				t.Fatalf("Warm with replies %v late: %v", tt.give, err)
			}
			if n := px.Conns(); n != 2 {
				t.Errorf("%d connections open after Warm, want the pool's 2", n)
			}
		})
	}
}
