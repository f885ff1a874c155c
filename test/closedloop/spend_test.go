package closedloop

import (
	"context"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// TestRedisSpend charges a tenant's gpt-4o token budget through a real
// replica (ShouldRateLimit with hits_addend, which token_limit counts)
// and reads it back with RedisSpend: the key and the counter's layout
// are tollgate's, not a copy that could drift unnoticed.
func TestRedisSpend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and a tollgate process; skipped with -short")
	}
	t.Parallel()
	bin := tollgatetest.Build(t)
	c := StartCluster(t, bin, 1, ShippedRules(), map[string][]Tenant{"free": NewTenants("free", 1)})
	cc, err := grpc.NewClient(c.Reps[0].GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	client := rlsv3.NewRateLimitServiceClient(cc)
	const charged = 777
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "inference", HitsAddend: charged,
			Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: "spender"}, {Key: "model", Value: Model}}}}})
		cancel()
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit = %v, %v", resp, err)
		}
	}
	// A lease may hold more than was spent until it goes back (within
	// --lease-max-life, 1s): poll for the settled figure, bounded.
	deadline := time.Now().Add(10 * time.Second)
	var got int64
	for time.Now().Before(deadline) {
		if got, err = RedisSpend(t.Context(), c, "spender"); err != nil {
			t.Fatal(err)
		}
		if got == 2*charged {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Errorf("RedisSpend = %d, want %d", got, 2*charged)
}
