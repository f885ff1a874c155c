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

// Cluster is a Redis Cluster owned by a test: masters, and replicas when
// started WithReplicas.
type Cluster struct {
	servers  []*Server // the masters, as started
	replicas []*Server // replicas[i*n+j] is master i's j-th of n
	// perMaster is the number of replicas of each master.
	perMaster int
}

// StartCluster starts masters redis-server processes in cluster mode, splits
// the 16384 slots evenly between them, joins them and waits until every
// node reports cluster_state:ok. Every process is killed when the test ends.
// opts apply to every node: WithReplicas(n) gives each master n replicas,
// WithTLS runs the clients' port, replication and the bus over TLS, and
// WithArgs("--cluster-node-timeout", "1000") speeds failure detection up
// (the default here is 2000ms).
func StartCluster(t testing.TB, masters int, opts ...Option) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: StartCluster: %d masters, want at least 1", masters)
	}
	cfg := config{}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.cluster = true
	c := &Cluster{servers: make([]*Server, masters), replicas: make([]*Server, masters*cfg.replicas), perMaster: cfg.replicas}
	for i, all := 0, c.all(); i < len(all); i++ {
		s, err := start(t, cfg)
		if err != nil {
			t.Fatalf("redistest: cluster node %d: %v", i, err)
		}
		if i < masters {
			c.servers[i] = s
		} else {
			c.replicas[i-masters] = s
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.form(ctx); err != nil {
		t.Fatalf("redistest: form a cluster of %d masters and %d replicas: %v", masters, len(c.replicas), err)
	}
	return c
}

// all lists the masters as started, then the replicas.
func (c *Cluster) all() []*Server {
	return append(append([]*Server(nil), c.servers...), c.replicas...)
}

// Replicas returns the replicas as started: the j-th of master i's n is
// at i*n+j. After a failover a replica may be a master, and a master a
// replica.
func (c *Cluster) Replicas() []*Server { return c.replicas }

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

// clients are one client per node, masters first, then replicas.
func (c *Cluster) clients() []*redis.Client {
	all := c.all()
	clients := make([]*redis.Client, len(all))
	for i, s := range all {
		o := s.options()
		o.MaxRetries, o.PoolSize = -1, 1
		clients[i] = redis.NewClient(o)
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
	all := c.all()
	for i, cl := range clients[:n] {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("node %s: add slots %d-%d: %w", c.servers[i].addr, lo, hi, err)
		}
		// Distinct epochs spare the cluster its collision resolution.
		if err := cl.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return fmt.Errorf("node %s: set config epoch: %w", c.servers[i].addr, err)
		}
	}
	for _, s := range all[1:] {
		host, port, _ := net.SplitHostPort(s.addr)
		if err := clients[0].Do(ctx, "cluster", "meet", host, port, s.busPort).Err(); err != nil {
			return fmt.Errorf("meet %s: %w", s.addr, err)
		}
	}
	if len(c.replicas) == 0 {
		return c.waitReady(ctx, clients)
	}
	// A replica can follow a master only once it knows it.
	ids := make([]string, n)
	for i, cl := range clients[:n] {
		id, err := cl.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			return fmt.Errorf("node %s: cluster myid: %w", all[i].addr, err)
		}
		ids[i] = id
	}
	for j, s := range c.replicas {
		cl, master := clients[n+j], ids[j/c.perMaster]
		err := retry(ctx, func() error { return cl.Do(ctx, "cluster", "replicate", master).Err() })
		if err != nil {
			return fmt.Errorf("replica %s: cluster replicate %s: %w", s.addr, master, err)
		}
	}
	return c.waitReady(ctx, clients)
}

// retry calls f every 20ms until it succeeds or ctx ends.
func retry(ctx context.Context, f func() error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
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

// ready checks that every node knows every other one and serves all
// slots, and that every replica is in sync with its master.
func (c *Cluster) ready(ctx context.Context, clients []*redis.Client) error {
	all := c.all()
	for i, cl := range clients {
		if all[i].down() {
			continue
		}
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("node %s: cluster info: %w", all[i].addr, err)
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
			return fmt.Errorf("node %s: cluster slots: %w", all[i].addr, err)
		}
		if len(slots) != len(c.servers) {
			return fmt.Errorf("node %s: %d slot ranges, want %d", all[i].addr, len(slots), len(c.servers))
		}
		for _, r := range slots {
			if len(r.Nodes) != 1+c.perMaster {
				return fmt.Errorf("node %s: slots %d-%d have %d nodes, want %d", all[i].addr, r.Start, r.End, len(r.Nodes), 1+c.perMaster)
			}
		}
		if i >= len(c.servers) {
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("node %s: info replication: %w", all[i].addr, err)
			}
			if !strings.Contains(repl, "master_link_status:up\r\n") {
				return fmt.Errorf("replica %s: not in sync yet", all[i].addr)
			}
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
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), TLSConfig: c.servers[0].options().TLSConfig})
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}
