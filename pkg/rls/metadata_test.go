package rls

import (
	"context"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// TestRuleMetadata: the response's dynamic metadata carries, under
// "metadata", the rules' metadata merged as envoyproxy/ratelimit merges it:
// from the descriptors not over their limits, in order, the first value
// of a key winning and mappings merging deeper down; never from an
// unlimited, displaced or overridden descriptor.
func TestRuleMetadata(t *testing.T) {
	t.Parallel()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "m", Descriptors: []*limit.Rule{
		{Key: "a", RateLimit: &limit.Limit{Amount: 10, Unit: limit.Minute}, Metadata: map[string]any{
			"name": "svc-a", "quota": map[string]any{"tier": "gold", "n": 1.0}, "list": []any{"x", true}}},
		{Key: "b", RateLimit: &limit.Limit{Amount: 10, Unit: limit.Minute}, Metadata: map[string]any{
			"name": "svc-b", "quota": map[string]any{"tier": "silver", "extra": nil}, "b": "only-b"}},
		{Key: "one", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Minute}, Metadata: map[string]any{"one": "yes"}},
		{Key: "free", Unlimited: true, Metadata: map[string]any{"free": "yes"}},
		{Key: "old", RateLimit: &limit.Limit{Name: "old", Amount: 10, Unit: limit.Minute}, Metadata: map[string]any{"old": "yes"}},
		{Key: "new", RateLimit: &limit.Limit{Amount: 10, Unit: limit.Minute}, Replaces: []string{"old"}},
		{Key: "plain", RateLimit: &limit.Limit{Amount: 10, Unit: limit.Minute}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(admission.NewLimiter(memstore.New(), nil, rs), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ask := func(ds ...*commonrl.RateLimitDescriptor) map[string]any {
		t.Helper()
		resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "m", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		if f := resp.GetDynamicMetadata().GetFields()[MetadataField]; f != nil {
			return f.GetStructValue().AsMap()
		}
		return nil
	}
	overridden := desc("a", "1")
	overridden.Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2}

	for _, tt := range []struct {
		name string
		give []*commonrl.RateLimitDescriptor
		want map[string]any
	}{
		{"one rule", []*commonrl.RateLimitDescriptor{desc("a", "1")},
			map[string]any{"name": "svc-a", "quota": map[string]any{"tier": "gold", "n": 1.0}, "list": []any{"x", true}}},
		{"first wins, mappings merge", []*commonrl.RateLimitDescriptor{desc("a", "1"), desc("b", "1")},
			map[string]any{"name": "svc-a", "quota": map[string]any{"tier": "gold", "n": 1.0, "extra": nil}, "list": []any{"x", true}, "b": "only-b"}},
		{"the other order", []*commonrl.RateLimitDescriptor{desc("b", "1"), desc("a", "1")},
			map[string]any{"name": "svc-b", "quota": map[string]any{"tier": "silver", "n": 1.0, "extra": nil}, "list": []any{"x", true}, "b": "only-b"}},
		{"no metadata", []*commonrl.RateLimitDescriptor{desc("plain", "1")}, nil},
		{"no rule", []*commonrl.RateLimitDescriptor{desc("nothing", "1")}, nil},
		{"unlimited", []*commonrl.RateLimitDescriptor{desc("free", "1")}, nil},
		{"replaced", []*commonrl.RateLimitDescriptor{desc("old", "1"), desc("new", "1")}, nil},
		{"overridden", []*commonrl.RateLimitDescriptor{overridden}, nil},
		{"within its limit", []*commonrl.RateLimitDescriptor{desc("one", "x")}, map[string]any{"one": "yes"}},
		{"over its limit, beside one within", []*commonrl.RateLimitDescriptor{desc("one", "x"), desc("b", "2")},
			map[string]any{"name": "svc-b", "quota": map[string]any{"tier": "silver", "extra": nil}, "b": "only-b"}},
	} {
		if diff := cmp.Diff(tt.want, ask(tt.give...)); diff != "" {
			t.Errorf("%s: metadata (-want +got):\n%s", tt.name, diff)
		}
	}
	// Merging never writes a rule's own metadata.
	if q := rs.Domain("m").Descriptors[0].Metadata["quota"].(map[string]any); len(q) != 2 {
		t.Errorf("rule a's quota became %v", q)
	}
}
