package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds how long a new cluster may take to agree on its
// slots and report cluster_state:ok.
const clusterTimeout = 20 * time.Second

// Cluster is a Redis Cluster of masters only, owned by a test.
type Cluster struct {
	servers []*Server
}

// StartCluster starts masters redis-server processes in cluster mode, splits
// the 16384 slots evenly between them, joins them and waits until every
// node reports cluster_state:ok. Every process is killed when the test ends.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: StartCluster: %d masters, want at least 1", masters)
	}
	c := &Cluster{servers: make([]*Server, masters)}
	for i := range c.servers {
		s, err := start(t, config{cluster: true})
		if err != nil {
			t.Fatalf("redistest: cluster node %d: %v", i, err)
		}
		c.servers[i] = s
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.form(ctx); err != nil {
		t.Fatalf("redistest: form a cluster of %d masters: %v", masters, err)
	}
	return c
}

// Wait waits, bounded, until every node serves all slots again, as after
// a node's Restart.
func (c *Cluster) Wait(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	if err := c.waitReady(ctx, clients); err != nil {
		t.Fatalf("redistest: cluster: %v", err)
	}
}

func (c *Cluster) clients() []*redis.Client {
	clients := make([]*redis.Client, len(c.servers))
	for i, s := range c.servers {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, PoolSize: 1})
	}
	return clients
}

func closeAll(clients []*redis.Client) {
	for _, c := range clients {
		_ = c.Close()
	}
}

// form assigns the slots, introduces the nodes to the first one and waits
// for the cluster to agree. It does what redis-cli --cluster create does,
// without its interactive prompts and fixed one-second sleeps.
func (c *Cluster) form(ctx context.Context) error {
	n := len(c.servers)
	clients := c.clients()
	defer closeAll(clients)
	for i, cl := range clients {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("node %s: add slots %d-%d: %w", c.servers[i].addr, lo, hi, err)
		}
		// Distinct epochs spare the cluster its collision resolution.
		if err := cl.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return fmt.Errorf("node %s: set config epoch: %w", c.servers[i].addr, err)
		}
	}
	for _, s := range c.servers[1:] {
		host, port, _ := net.SplitHostPort(s.addr)
		if err := clients[0].Do(ctx, "cluster", "meet", host, port, s.busPort).Err(); err != nil {
			return fmt.Errorf("meet %s: %w", s.addr, err)
		}
	}
	return c.waitReady(ctx, clients)
}

func (c *Cluster) waitReady(ctx context.Context, clients []*redis.Client) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.ready(ctx, clients)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", clusterTimeout, err)
		case <-tick.C:
		}
	}
}

// ready checks that every node knows every other one and serves all slots.
func (c *Cluster) ready(ctx context.Context, clients []*redis.Client) error {
	for i, cl := range clients {
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("node %s: cluster info: %w", c.servers[i].addr, err)
		}
		for _, want := range []string{
			"cluster_state:ok",
			"cluster_slots_ok:16384",
			"cluster_known_nodes:" + strconv.Itoa(len(clients)),
		} {
			if !strings.Contains(info, want+"\r\n") {
				return fmt.Errorf("node %s: no %s yet", c.servers[i].addr, want)
			}
		}
		// CLUSTER SLOTS is what clients route by: every node must list
		// every master's range before a client is handed the cluster.
		slots, err := cl.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("node %s: cluster slots: %w", c.servers[i].addr, err)
		}
		if len(slots) != len(clients) {
			return fmt.Errorf("node %s: %d slot ranges, want %d", c.servers[i].addr, len(slots), len(clients))
		}
	}
	return nil
}

// Addrs lists the masters' host:port addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.servers))
	for i, s := range c.servers {
		out[i] = s.addr
	}
	return out
}

// Servers returns the nodes, for fault tests that kill or restart one.
func (c *Cluster) Servers() []*Server { return c.servers }

// Client returns a go-redis cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}
