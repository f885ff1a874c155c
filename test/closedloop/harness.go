package closedloop

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// UpstreamKind is the upstream's behaviour (upstream.Normal, Fail,
// Vendor429).
type UpstreamKind int

const (
	// UpstreamNormal serves within its capacity.
	UpstreamNormal UpstreamKind = iota
	// UpstreamFail answers FailFraction of requests with FailStatus.
	UpstreamFail
	// UpstreamVendor429 answers 429 above RateLimit requests/s.
	UpstreamVendor429
)

// UpstreamMode mirrors upstream.Mode.
type UpstreamMode struct {
	Kind         UpstreamKind
	FailFraction float64
	FailStatus   int
	RateLimit    float64
}

// UpstreamConfig mirrors the upstream.Config fields the scenarios set.
type UpstreamConfig struct {
	Slots, Queue int
	QueueTimeout time.Duration
	Seed         int64
}

// Upstream is the model upstream as the bench drives it; the real one is
// test/closedloop/upstream's *Server behind a few lines of adapter (its
// Mode and Stats into these types).
type Upstream interface {
	// Start listens on loopback and returns the base URL.
	Start() (string, error)
	Close()
	SetMode(UpstreamMode)
	Stats() UpstreamStats
}

// GatewayMode is how the gateway asks Tollgate.
type GatewayMode string

const (
	// ModeExtAuthz: Check with the body, then ext_proc and the access log.
	ModeExtAuthz GatewayMode = "ext_authz"
	// ModeRateLimit: ShouldRateLimit, with apply_on_stream_done reports.
	ModeRateLimit GatewayMode = "ratelimit"
	// ModeDirect: no Tollgate at all (Direct).
	ModeDirect GatewayMode = "direct"
)

// GatewayConfig is what a gateway needs to be built.
type GatewayConfig struct {
	// Replicas are the tollgate replicas' gRPC addresses.
	Replicas []string
	// Upstream is the model upstream's base URL.
	Upstream string
	Mode     GatewayMode
	// Instances is how many gateway (Envoy) instances share the load.
	Instances int
}

// NewGatewayFunc builds a Gateway; envoysim.New is one behind an adapter.
type NewGatewayFunc func(ctx context.Context, cfg GatewayConfig) (Gateway, error)

// NewDirectGateway is the NewGatewayFunc of Direct; it ignores the
// replicas.
func NewDirectGateway(_ context.Context, cfg GatewayConfig) (Gateway, error) {
	return NewDirect(cfg.Upstream, 0), nil
}

// Tollgate's flags in every scenario, the one place docs/closed-loop.md
// quotes them from: the Helm chart's defaults (which set no pressure
// signal flag), with --store-timeout raised from the default 15ms to
// 50ms only because three replicas, Redis, the upstream and the driver
// share 2 cores here. The issue measured with --pressure-latency-sla
// 400ms; with shedding.control the in-flight count is the load signal,
// and the outcome signals (latency, errors, overload answers) lag it by
// their window: in the first runs a second of overload answers at the
// spike's start held the steps' admit_only premium for their hold after
// the controller had answered, and standard kept 62% of its goodput.
var TollgateFlags = []string{
	"--store-timeout", "50ms",
	"--log-level", "warn",
}

// RootDir is the repository's root, found from this file's directory.
func RootDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ShippedRules is the path of config/inference.yaml.
func ShippedRules() string { return filepath.Join(RootDir(), "config", "inference.yaml") }

// RulesWithout returns rules with the named top-level sections removed
// (each from its key's line to the next top-level line), for the
// comparison runs: "shedding" (and "control", once it exists) off.
func RulesWithout(rules string, sections ...string) string {
	var out []string
	skip := false
	for _, line := range strings.Split(rules, "\n") {
		top := line != "" && line[0] != ' ' && line[0] != '\t' && line[0] != '#'
		if top {
			skip = false
			for _, s := range sections {
				if strings.HasPrefix(line, s+":") {
					skip = true
				}
			}
		}
		if !skip {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// Cluster is one redis-server and the tollgate replicas sharing it, on
// rules and an authz config whose keys map the simulated tenants to
// their tiers.
type Cluster struct {
	Redis *redistest.Server
	Reps  []*tollgatetest.Process
	// Dir holds the generated authz config, keys and ticket key.
	Dir string
	// Client reads the cluster's Redis for the bench itself (RedisSpend):
	// one client for the run, closed when the test ends, not one per read.
	Client *redis.Client
}

// GRPCAddrs are the replicas' gRPC addresses.
func (c *Cluster) GRPCAddrs() []string {
	out := make([]string, len(c.Reps))
	for i, r := range c.Reps {
		out[i] = r.GRPC
	}
	return out
}

// AdminAddrs are the replicas' admin addresses.
func (c *Cluster) AdminAddrs() []string {
	out := make([]string, len(c.Reps))
	for i, r := range c.Reps {
		out[i] = r.Admin
	}
	return out
}

// StartCluster starts redis-server and n replicas of bin on rulesPath,
// each with TollgateFlags plus extra, and an authz config like
// config/authz/authz.yaml whose keys are tenants' (tenant -> tier).
func StartCluster(t testing.TB, bin string, n int, rulesPath string, tenants map[string][]Tenant, extra ...string) *Cluster {
	t.Helper()
	// Redis persists as an operator who wants limits to survive its
	// restart runs it: an append-only file, synced every second. Without
	// it a restarted Redis forgets every window, and a tenant gets its
	// whole limit again on top of what it had before the crash (measured
	// in the redis-killed scenario: 1.11x the limit in a minute).
	c := &Cluster{Redis: redistest.Start(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "everysec")), Dir: t.TempDir()}
	c.Client = redis.NewClient(&redis.Options{Addr: c.Redis.Addr()})
	t.Cleanup(func() { _ = c.Client.Close() })
	authz, err := WriteAuthz(c.Dir, tenants)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ticket := filepath.Join(c.Dir, "ticket.key")
	if err := os.WriteFile(ticket, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		args := append([]string{
			"--redis-url", c.Redis.URL(),
			"--config", rulesPath,
			"--authz-config", authz,
			"--ticket-key-file", ticket,
			// The default replica ID is the hostname, which all share.
			"--replica-id", fmt.Sprintf("r%d", i),
		}, TollgateFlags...)
		c.Reps = append(c.Reps, tollgatetest.Start(t, bin, fmt.Sprintf("replica %d", i), append(args, extra...)...))
	}
	return c
}

// WriteAuthz writes authz.yaml (config/authz/authz.yaml's settings with
// its own keys file) and keys.yaml into dir, and returns authz.yaml's
// path. tenants maps each tier to its tenants.
func WriteAuthz(dir string, tenants map[string][]Tenant) (string, error) {
	src := filepath.Join(RootDir(), "config", "authz", "authz.yaml")
	base, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", src, err)
	}
	var keys strings.Builder
	keys.WriteString("tenants:\n")
	for tier, ts := range tenants {
		for _, tn := range ts {
			fmt.Fprintf(&keys, "  %q: {tier: %s}\n", tn.Name, tier)
		}
	}
	keys.WriteString("keys:\n")
	for _, ts := range tenants {
		for _, tn := range ts {
			fmt.Fprintf(&keys, "  - {key: %q, tenant: %q, name: %q}\n", tn.Key, tn.Name, tn.Name)
		}
	}
	for name, data := range map[string]string{"authz.yaml": string(base), "keys.yaml": keys.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			return "", fmt.Errorf("write %s: %w", name, err)
		}
	}
	return filepath.Join(dir, "authz.yaml"), nil
}

// NewTenants makes n tenants named prefix-0.. with random 32-hex-digit
// keys.
func NewTenants(prefix string, n int) []Tenant {
	out := make([]Tenant, n)
	for i := range out {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		out[i] = Tenant{Name: fmt.Sprintf("%s-%d", prefix, i), Key: "sim-" + hex.EncodeToString(b)}
	}
	return out
}
