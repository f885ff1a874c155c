package redistest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		give       []Option
		wantScheme string
	}{
		{name: "tcp", wantScheme: "redis://127.0.0.1:"},
		{name: "unix socket", give: []Option{WithUnixSocket()}, wantScheme: "unix:///"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := Start(t, tt.give...)
			if !strings.HasPrefix(s.URL(), tt.wantScheme) {
				t.Errorf("URL() = %q, want prefix %q", s.URL(), tt.wantScheme)
			}
			c := s.Client(t)
			ctx := context.Background()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			// Persistence is off: a crash must not bring data back.
			cfg, err := c.ConfigGet(ctx, "save").Result()
			if err != nil {
				t.Fatalf("CONFIG GET save: %v", err)
			}
			if cfg["save"] != "" {
				t.Errorf("save = %q, want empty", cfg["save"])
			}

			s.Kill()
			ctx2, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if err := c.Ping(ctx2).Err(); err == nil {
				t.Fatal("PING after Kill succeeded")
			}

			s.Restart()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING after Restart: %v", err)
			}
			if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
				t.Errorf("EXISTS k after Restart = %d, %v; want 0 (nothing persisted)", n, err)
			}
		})
	}
}

func TestStartDistinctPorts(t *testing.T) {
	t.Parallel()
	a, b := Start(t), Start(t)
	if a.Addr() == b.Addr() {
		t.Fatalf("two servers share %s", a.Addr())
	}
}

func TestStartWithoutRedisServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := start(t, config{})
	if err == nil || !strings.Contains(err.Error(), "redis-server is not on PATH") {
		t.Fatalf("start() error = %v, want one naming the missing redis-server", err)
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	if got := len(c.Addrs()); got != 3 {
		t.Fatalf("Addrs() has %d entries, want 3", got)
	}
	cl := c.Client(t)
	ctx := context.Background()
	// Keys spread over the slots land on every master.
	for i := range 64 {
		k := fmt.Sprintf("key-%d", i)
		if err := cl.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	perNode := 0
	for _, s := range c.Servers() {
		n, err := s.Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", s.Addr(), err)
		}
		if n > 0 {
			perNode++
		}
	}
	if perNode != 3 {
		t.Errorf("keys landed on %d masters, want 3", perNode)
	}
}

func TestStartSentinel(t *testing.T) {
	t.Parallel()
	master := Start(t)
	s := StartSentinel(t, master, "mymaster")
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = sc.Close() })
	addr, err := sc.GetMasterAddrByName(context.Background(), "mymaster").Result()
	if err != nil {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
	}
	if got := net.JoinHostPort(addr[0], addr[1]); got != master.Addr() {
		t.Errorf("sentinel reports master %s, want %s", got, master.Addr())
	}
}

func TestClusterRestartNode(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a cluster node: about 4 s")
	}
	t.Parallel()
	c := StartCluster(t, 3)
	cl := c.Client(t)
	ctx := context.Background()
	node := c.Servers()[1]
	node.Kill()
	node.Restart()
	c.Wait(t)
	// Every slot is served again: keys on all masters can be written.
	for i := range 32 {
		if err := cl.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET after a node restarted: %v", err)
		}
	}
}

func TestStartWithArgs(t *testing.T) {
	t.Parallel()
	c := Start(t, WithArgs("--maxmemory", "1mb")).Client(t)
	cfg, err := c.ConfigGet(context.Background(), "maxmemory").Result()
	if err != nil {
		t.Fatal(err)
	}
	if cfg["maxmemory"] != "1048576" {
		t.Errorf("maxmemory = %q, want 1048576", cfg["maxmemory"])
	}
}

func TestStartTLS(t *testing.T) {
	t.Parallel()
	certs := NewCerts(t)
	s := Start(t, WithTLS(certs, ClientCertRequired))
	if !strings.HasPrefix(s.URL(), "rediss://127.0.0.1:") {
		t.Errorf("URL() = %q, want rediss://127.0.0.1:port", s.URL())
	}
	ctx := context.Background()
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS with the client certificate: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Error("PING without TLS succeeded on a TLS-only server")
	}
}

func TestStartReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a replica to sync: about 5 s")
	}
	t.Parallel()
	master := Start(t)
	replica := Start(t, WithReplicaOf(master))
	ctx := context.Background()
	if err := master.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rc := replica.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := rc.Get(ctx, "k").Result()
		if err == nil && v == "v" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET k on the replica = %q, %v; want the master's v", v, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartClusterWithReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node cluster: about 11 s")
	}
	t.Parallel()
	c := StartCluster(t, 3, WithReplicas(1))
	if got := len(c.Replicas()); got != 3 {
		t.Fatalf("Replicas() has %d entries, want 3", got)
	}
	slots, err := c.Client(t).ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range slots {
		if len(r.Nodes) != 2 {
			t.Errorf("slots %d-%d have %d nodes, want a master and a replica", r.Start, r.End, len(r.Nodes))
		}
	}
}
