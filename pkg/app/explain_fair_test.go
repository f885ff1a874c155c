package app

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestExplainFairShare(t *testing.T) {
	t.Parallel()
	rules := rulesFile(t, `domain: d
descriptors:
  - key: model
    value: m
    rate_limit: {unit: second, requests_per_unit: 100}
    fair_share: {key: tenant, weights: {acme: 3}, default_weight: 0.5, max_keys: 8}
`)
	policy := func(f *fairExplain) *fairExplain {
		f.Key, f.Backlog, f.Quantum, f.Credit, f.MaxKeys = "tenant", "1s", 1, 5, 8
		return f
	}
	tests := []struct {
		name string
		give []string
		want *fairExplain
	}{
		{name: "a listed value", give: []string{"--descriptor", "model=m", "--descriptor", "tenant=acme"},
			want: policy(&fairExplain{Value: "acme", Member: limit.FairMember("acme"), Weight: 3, WeightFrom: "weights"})},
		{name: "a value not listed", give: []string{"--descriptor", "model=m", "--descriptor", "tenant=zed"},
			want: policy(&fairExplain{Value: "zed", Member: limit.FairMember("zed"), Weight: 0.5, WeightFrom: "default_weight"})},
		{name: "no fairness key: the overflow member", give: []string{"--descriptor", "model=m"},
			want: policy(&fairExplain{Member: limit.FairOverflowKey, Weight: 0.5, WeightFrom: "default_weight"})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := explainJSON(t, append([]string{"--config", rules, "--domain", "d"}, tt.give...)...)
			if len(got.Descriptors) == 0 || len(got.Descriptors[0].Limits) != 1 {
				t.Fatalf("descriptors %+v, want the model's one limit first", got.Descriptors)
			}
			if diff := cmp.Diff(tt.want, got.Descriptors[0].Limits[0].Fair); diff != "" {
				t.Errorf("fair_share (-want +got):\n%s", diff)
			}
		})
	}
}
