package fairshare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/lease"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/overlimit"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// benchRules is a model limit no decision reaches (every decision is
// admitted, so the benchmark measures the admitted path), fair-shared by
// tenant with the plan as weight when fair, and a queue when queue (a
// decision that does not wait passes its stage).
func benchRules(fair, queue bool) string {
	var b strings.Builder
	b.WriteString(`domain: fairbench
tiers: {key: tier, default: free, plans: {premium: 4, standard: 2, free: 1}}
`)
	if queue {
		b.WriteString("queue: {max_wait: 1s, max_length: 50}\n")
	}
	b.WriteString(`descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`)
	if fair {
		b.WriteString("    fair_share: {key: tenant, weights: plan, min_share: 0.01}\n")
	}
	return b.String()
}

// BenchmarkFairDecide measures what fair share adds to a whole decision
// (admission.Limiter.Decide) through the store stack serve builds: the
// in-memory store; Redis with the over-limit cache and guard (unleased);
// and Redis behind leases (--lease-min-limit default, 1000: the model
// limit is leased when not fair-shared). plain is the same rule without
// fair_share; fairN takes N tenants in turn, each with state in the fair
// hash; +queue adds the admission queue's stage. On Redis it reports the
// Redis time (INFO commandstats usec of the script calls) and the script
// calls per decision.
func BenchmarkFairDecide(b *testing.B) {
	shapes := []struct {
		name    string
		members int // 0: not fair-shared
		queue   bool
	}{
		{"plain", 0, false},
		{"plain+queue", 0, true},
		{"fair4", 4, false},
		{"fair64", 64, false},
		{"fair64+queue", 64, true},
	}
	for _, store := range []string{"mem", "redis", "redis-leased"} {
		var srv *redistest.Server
		if store != "mem" {
			srv = redistest.Start(b)
		}
		for _, sh := range shapes {
			b.Run(store+"/"+sh.name, func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "rules.yaml")
				if err := os.WriteFile(path, []byte(benchRules(sh.members > 0, sh.queue)), 0o600); err != nil {
					b.Fatal(err)
				}
				rs, err := config.Load(path)
				if err != nil {
					b.Fatal(err)
				}
				var st limit.Store
				var admin *redis.Client
				switch store {
				case "mem":
					st = memstore.New()
				default:
					admin = srv.Client(b)
					if err := admin.FlushAll(context.Background()).Err(); err != nil {
						b.Fatal(err)
					}
					c, err := redisstore.NewClient(srv.URL())
					if err != nil {
						b.Fatal(err)
					}
					raw := redisstore.New(c)
					b.Cleanup(func() { _ = raw.Close() })
					st = overlimit.New(storeguard.New(raw, storeguard.Options{}), overlimit.Options{})
					if store == "redis-leased" {
						ls := lease.New(st, lease.Options{})
						ctx, cancel := context.WithCancel(context.Background())
						done := make(chan struct{})
						go func() { defer close(done); ls.Run(ctx) }()
						b.Cleanup(func() { cancel(); <-done })
						st = ls
					}
				}
				var opts []admission.Option
				if sh.queue {
					opts = append(opts, admission.WithQueue(admission.NewQueue(nil)))
				}
				l := admission.NewLimiter(st, nil, rs, opts...)
				plans := []string{"premium", "standard", "free"}
				reqs := make([]*limit.Request, max(1, sh.members))
				for i := range reqs {
					reqs[i] = &limit.Request{Domain: "fairbench", Descriptors: []limit.Descriptor{
						{Entries: []limit.Entry{{Key: "tier", Value: plans[i%3]}, {Key: "model", Value: "gpt-4o"}}},
						{Entries: []limit.Entry{{Key: "tenant", Value: "t" + strconv.Itoa(i)}}},
					}}
				}
				ctx := context.Background()
				decide := func(r *limit.Request) {
					d, err := l.Decide(ctx, r)
					if err != nil || d.Code != limit.CodeOK {
						b.Fatalf("Decide = %+v, %v", d, err)
					}
				}
				for _, r := range reqs { // every member gets state; the script is loaded
					decide(r)
				}
				var calls, usec int64
				if admin != nil {
					calls, usec = scriptStats(b, admin)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					decide(reqs[i%len(reqs)])
					i++
				}
				if admin != nil {
					calls2, usec2 := scriptStats(b, admin)
					b.ReportMetric(float64(usec2-usec)/float64(i), "redis-µs/op")
					b.ReportMetric(float64(calls2-calls)/float64(i), "redis-calls/op")
				}
			})
		}
	}
}

// scriptStats sums INFO commandstats' calls and usec over the commands
// that can run the store's script.
func scriptStats(tb testing.TB, c *redis.Client) (calls, usec int64) {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || (name != "fcall" && name != "evalsha" && name != "eval") {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("commandstats line %q: %v", line, fmt.Errorf("parse %s: %w", k, err))
			}
			if k == "calls" {
				calls += n
			} else {
				usec += n
			}
		}
	}
	return calls, usec
}
