package app

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestServeQueueAdapters: over real gRPC, a ShouldRateLimit a limit
// refuses waits its domain's max_wait (1s) unless --queue-adapters leaves
// rls out; then it is answered at once.
func TestServeQueueAdapters(t *testing.T) {
	t.Parallel()
	const maxWait = time.Second
	tests := []struct {
		name  string
		give  []string
		waits bool
	}{
		{name: "default: every adapter waits", waits: true},
		{name: "rls named", give: []string{"--queue-adapters", "rls,ext_authz"}, waits: true},
		{name: "ext_authz only", give: []string{"--queue-adapters", "ext_authz"}},
		{name: "none", give: []string{"--queue-adapters="}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "rules.yaml"), "domain: q\nqueue: {max_wait: 1s, max_length: 10}\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
			r := startReplica(t, ctx, dir, tt.give...)
			req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
			if resp, err := r.client.ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first call = %v, %v; want OK", resp, err)
			}
			start := time.Now()
			resp, err := r.client.ShouldRateLimit(ctx, req)
			took := time.Since(start)
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("second call = %v, %v; want OVER_LIMIT", resp, err)
			}
			// A wait cannot end before max_wait; an answer at once takes
			// far less on any machine.
			if waited := took >= maxWait; waited != tt.waits {
				t.Errorf("answered after %v; want a wait of max_wait %v: %v", took, maxWait, tt.waits)
			}
		})
	}
}

func TestQueueAdaptersFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		want    adapterSet
		wantErr bool
	}{
		{name: "both", give: "ext_authz,rls", want: adapterSet{set: true, extAuthz: true, rls: true}},
		{name: "spaces", give: " rls ", want: adapterSet{set: true, rls: true}},
		{name: "empty", give: "", want: adapterSet{set: true}},
		{name: "unknown", give: "rls,extproc", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got adapterSet
			err := got.Set(tt.give)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set(%q) = %v, want error %v", tt.give, err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("Set(%q) = %+v, want %+v", tt.give, got, tt.want)
			}
		})
	}
	var unset adapterSet
	for _, a := range queueAdapters {
		if !unset.waits(a) {
			t.Errorf("unset: %s does not wait, want every adapter to", a)
		}
	}
}
