package rls

import (
	"context"
	"fmt"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// benchRules is a high sliding-window limit, so the benchmark measures the
// admitted path (the costly one: a store write) rather than denials.
const benchRules = `
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

func benchService(b *testing.B, store limit.Store) *Service {
	b.Helper()
	d, err := config.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(admission.NewLimiter(store, nil, rs), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchRequests(n int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, n)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonrl.RateLimitDescriptor{{
			Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: fmt.Sprintf("tenant-%d", i)}},
		}}}
	}
	return reqs
}

// BenchmarkShouldRateLimit is the whole decision behind the gRPC handler:
// proto in, rule match, key, store, statuses, headers and metrics out.
func BenchmarkShouldRateLimit(b *testing.B) {
	stores := []struct {
		name string
		make func(b *testing.B) limit.Store
	}{
		{"memstore", func(*testing.B) limit.Store { return memstore.New() }},
		{"redis", func(b *testing.B) limit.Store { return testutil.RedisStore(b) }},
	}
	for _, st := range stores {
		for _, tenants := range []int{1, 10000} {
			b.Run(fmt.Sprintf("%s/tenants=%d", st.name, tenants), func(b *testing.B) {
				svc := benchService(b, st.make(b))
				reqs := benchRequests(tenants)
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						resp, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)])
						if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
							b.Errorf("ShouldRateLimit: %v %v", resp.GetOverallCode(), err)
							return
						}
						i++
					}
				})
			})
		}
	}
}
