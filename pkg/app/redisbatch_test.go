package app

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestRedisBatchFlag: --redis-batch and --redis-batch-wait reach the Redis store, and values
// it cannot mean are refused.
func TestRedisBatchFlag(t *testing.T) {
	t.Parallel()
	const url = "redis://127.0.0.1:1" // NewClient connects to nothing
	tests := []struct {
		name    string
		give    []string
		want    int
		wait    time.Duration
		opt     bool
		wantErr bool
	}{
		{name: "default", give: []string{"--redis-url", url}, want: DefaultRedisBatch},
		{name: "off", give: []string{"--redis-url", url, "--redis-batch", "0"}},
		{name: "on", give: []string{"--redis-url", url, "--redis-batch", "8"}, want: 8},
		{name: "1 is off", give: []string{"--redis-url", url, "--redis-batch", "1"}},
		{name: "negative", give: []string{"--redis-url", url, "--redis-batch", "-1"}, wantErr: true},
		{name: "too large", give: []string{"--redis-url", url, "--redis-batch", "1001"}, wantErr: true},
		{name: "without Redis", give: []string{"--redis-batch", "8"}, wantErr: true},
		{name: "off without Redis", give: []string{"--redis-batch", "0"}},
		{name: "not a number", give: []string{"--redis-url", url, "--redis-batch", "many"}, wantErr: true},
		{name: "wait", give: []string{"--redis-url", url, "--redis-batch-wait", "500us"}, want: DefaultRedisBatch, wait: 500 * time.Microsecond},
		{name: "wait at its bound", give: []string{"--redis-url", url, "--redis-batch-wait", "1.5ms"}, want: DefaultRedisBatch, wait: 1500 * time.Microsecond},
		{name: "wait too long", give: []string{"--redis-url", url, "--redis-batch-wait", "2ms"}, wantErr: true},
		{name: "wait negative", give: []string{"--redis-url", url, "--redis-batch-wait", "-1ms"}, wantErr: true},
		{name: "wait unbatched", give: []string{"--redis-url", url, "--redis-batch", "0", "--redis-batch-wait", "1ms"}, wantErr: true},
		{name: "wait without Redis", give: []string{"--redis-batch-wait", "1ms"}, wantErr: true},
		{name: "optimistic", give: []string{"--redis-url", url, "--redis-optimistic-fixed"}, want: DefaultRedisBatch, opt: true},
		{name: "optimistic unbatched", give: []string{"--redis-url", url, "--redis-batch", "0", "--redis-optimistic-fixed"}, opt: true},
		{name: "optimistic without Redis", give: []string{"--redis-optimistic-fixed"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := &App{Stdout: io.Discard, Stderr: io.Discard, LookupEnv: env(nil)}
			f, err := a.parseServeFlags(tt.give)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseServeFlags(%q) = %v, want error %v", tt.give, err, tt.wantErr)
			}
			if err != nil || f.redisURL == "" {
				return
			}
			st, _, closeStore, err := openStore(f.redisURL, f.redis.storeOptions(), f.redis.options()...)
			if err != nil {
				t.Fatal(err)
			}
			defer closeStore()
			if got := st.(*redisstore.Store).Batch(); got != tt.want {
				t.Errorf("store batches %d calls, want %d", got, tt.want)
			}
			if got := st.(*redisstore.Store).BatchWait(); got != tt.wait {
				t.Errorf("store gathers a batch for %v, want %v", got, tt.wait)
			}
			if got := st.(*redisstore.Store).OptimisticFixed(); got != tt.opt {
				t.Errorf("store runs fixed windows optimistically: %v, want %v", got, tt.opt)
			}
		})
	}
}

// TestServeRedisBatch: a replica that batches its Redis calls still
// admits exactly a limit's worth of concurrent decisions. The store
// timeout is long so that a loaded machine does not fail decisions.
func TestServeRedisBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), "domain: b\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	r := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--redis-batch", "8", "--lease-fraction", "0", "--store-timeout", "2s", "--store-failure", "deny")
	req := &rlsv3.RateLimitRequest{Domain: "b", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			resp, err := r.client.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Errorf("ShouldRateLimit: %v", err)
				return
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if got := ok.Load(); got != 5 {
		t.Errorf("%d of 40 concurrent decisions admitted on a limit of 5\n%s", got, r.stderr)
	}
}
