package load

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
)

// baseline is one worker's -api redis-baseline: per call it does what
// envoyproxy/ratelimit does per call with its Redis fixed windows, and no
// more. For every descriptor of the call, a key of the domain, the
// descriptor's entries and the start of the current fixed window gets
// INCRBY hits and PEXPIRE window, all of the call's descriptors in one
// pipeline (one round trip). It neither reads the counts nor judges
// them: every call it completes counts as OK. It is the Redis work per
// decision that Tollgate's scripts are measured against (issue 17).
type baseline struct {
	c      *redis.Client
	window time.Duration
	hits   int64
	domain string
	key    strings.Builder
}

// newBaselineClient opens the pool the workers share: one connection per
// worker, so no call waits for a connection. The connections are dialed
// by the first calls: with a warm-up, outside the measured run.
func newBaselineClient(cfg *Config) (*redis.Client, error) {
	opts := &redis.Options{Addr: cfg.RedisURL}
	if strings.Contains(cfg.RedisURL, "://") {
		var err error
		if opts, err = redis.ParseURL(cfg.RedisURL); err != nil {
			return nil, fmt.Errorf("-redis-url: %w", err)
		}
	}
	opts.PoolSize = cfg.Concurrency
	return redis.NewClient(opts), nil
}

func newBaseline(c *redis.Client, cfg *Config) *baseline {
	return &baseline{c: c, window: cfg.Window, hits: int64(max(cfg.Hits, 1)), domain: cfg.Domain}
}

// windowKey is the key of descriptor entries in the window starting at
// start: domain_key1_value1_key2_value2_start, start in Unix seconds (in
// Unix milliseconds for windows under a second).
func (b *baseline) windowKey(entries [][2]string, start time.Time) string {
	b.key.Reset()
	b.key.WriteString(b.domain)
	for _, e := range entries {
		b.key.WriteByte('_')
		b.key.WriteString(e[0])
		b.key.WriteByte('_')
		b.key.WriteString(e[1])
	}
	b.key.WriteByte('_')
	if b.window < time.Second {
		b.key.WriteString(strconv.FormatInt(start.UnixMilli(), 10))
	} else {
		b.key.WriteString(strconv.FormatInt(start.Unix(), 10))
	}
	return b.key.String()
}

// call sends req's descriptors' commands in one pipeline.
func (b *baseline) call(ctx context.Context, req *rlsv3.RateLimitRequest) error {
	start := time.Now().Truncate(b.window)
	pipe := b.c.Pipeline()
	var entries [][2]string
	for _, d := range req.GetDescriptors() {
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, [2]string{e.GetKey(), e.GetValue()})
		}
		key := b.windowKey(entries, start)
		pipe.IncrBy(ctx, key, b.hits)
		pipe.PExpire(ctx, key, b.window)
	}
	_, err := pipe.Exec(ctx)
	return err
}
