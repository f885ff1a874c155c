package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const fairTiers = `
tiers: {key: tier, default: free, plans: {free: 1, premium: 4}}
`

func TestParseFairShare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string // the model rule's keys after key and value
		want *limit.FairShare
	}{
		{
			name: "defaults from a sliding window",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 2400}
    fair_share: {key: tenant}`,
			want: &limit.FairShare{Key: "tenant", DefaultWeight: 1, Rate: &limit.FairPolicy{
				Backlog: time.Second, Quantum: 1, Credit: 2, MaxKeys: 256,
			}},
		},
		{
			name: "plan weights, every field, both limits",
			give: `
    rate_limit: {unit: second, requests_per_unit: 600, buckets: 10}
    token_limit: {unit: hour, tokens_per_unit: 1000000, algorithm: token_bucket}
    fair_share: {key: tenant, weights: plan, min_share: 0.05, backlog: 30s, quantum: 2, credit: 50, max_keys: 1024}`,
			want: &limit.FairShare{
				Key: "tenant", Plan: true, DefaultWeight: 1,
				Rate:  &limit.FairPolicy{MinShare: 0.05, Backlog: 30 * time.Second, Quantum: 2, Credit: 50, MaxKeys: 1024},
				Token: &limit.FairPolicy{MinShare: 0.05, Backlog: 30 * time.Second, Quantum: 2, Credit: 50, MaxKeys: 1024},
			},
		},
		{
			name: "weights map; per-limit defaults",
			give: `
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}
    token_limit: {unit: minute, tokens_per_unit: 40000, algorithm: token_bucket}
    fair_share: {key: tenant, weights: {acme: 3, beta: 0.5}, default_weight: 2}`,
			want: &limit.FairShare{
				Key: "tenant", Weights: map[string]float64{"acme": 3, "beta": 0.5}, DefaultWeight: 2,
				Rate:  &limit.FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 5, MaxKeys: 256},
				Token: &limit.FairPolicy{Backlog: time.Second, Quantum: 1, Credit: 33, MaxKeys: 256},
			},
		},
		{
			name: "credit is at least the quantum",
			give: `
    token_limit: {unit: second, tokens_per_unit: 10}
    fair_share: {key: tenant, quantum: 4}`,
			want: &limit.FairShare{Key: "tenant", DefaultWeight: 1, Token: &limit.FairPolicy{
				Backlog: time.Second, Quantum: 4, Credit: 4, MaxKeys: 256,
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("f.yaml", []byte("domain: inference\n"+fairTiers+"descriptors:\n  - key: model\n    value: gpt-4o"+tt.give+"\n"))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tt.want, d.Descriptors[0].Fair); diff != "" {
				t.Errorf("Fair (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseFairShareBad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		give  string
		tiers bool
		want  string
	}{
		{
			name: "key missing, ranges",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share:
      min_share: 1
      backlog: 0s
      quantum: 0.5
      max_keys: 1025`,
			want: `f.yaml:6: descriptors[0].fair_share: key is required: the descriptor entry whose values share the limits
f.yaml:6: descriptors[0].fair_share.min_share: 1 is not in [0,1); it is a fraction of the limit
f.yaml:7: descriptors[0].fair_share.backlog: 0s is less than 1ms; the state counts in milliseconds
f.yaml:8: descriptors[0].fair_share.quantum: 0.5 is not in [1,9007199254740992]
f.yaml:9: descriptors[0].fair_share.max_keys: 1025 is more than 1024`,
		},
		{
			name: "plan without tiers",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share: {key: tenant, weights: plan}`,
			want: `f.yaml:5: descriptors[0].fair_share.weights: plan weighs each member by its plan multiplier, and this file has no tiers`,
		},
		{
			name:  "default_weight beside plan",
			tiers: true,
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share: {key: tenant, weights: plan, default_weight: 2}`,
			want: `f.yaml:6: descriptors[0].fair_share.default_weight: applies only to a weights map; with weights: plan every request has a plan (tiers.default when it names none)`,
		},
		{
			name: "bad weights",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share:
      key: tenant
      weights: {acme: 0, beta: 1001, gamma: x}
      default_weight: -1`,
			want: `f.yaml:7: descriptors[0].fair_share.weights.acme: 0 is not more than 0
f.yaml:7: descriptors[0].fair_share.weights.beta: 1001 is more than 1000
f.yaml:7: descriptors[0].fair_share.weights.gamma: want a number such as 2 or 0.5, got the string "x"
f.yaml:8: descriptors[0].fair_share.default_weight: -1 is not more than 0`,
		},
		{
			name: "weights neither plan nor a mapping",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share: {key: tenant, weights: [a]}`,
			want: `f.yaml:5: descriptors[0].fair_share.weights: want plan or a mapping of values to weights, got a list`,
		},
		{
			name: "credit below quantum",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share: {key: tenant, quantum: 5, credit: 4}`,
			want: `f.yaml:5: descriptors[0].fair_share.credit: 4 is less than quantum 5; a member must be owed at least one quantum`,
		},
		{
			name: "no limit to share",
			give: `
    fair_share: {key: tenant}`,
			want: `f.yaml:4: descriptors[0].fair_share: needs a rate_limit or token_limit to share; max_concurrent is not shared`,
		},
		{
			name: "max_concurrent only",
			give: `
    max_concurrent: {limit: 4}
    fair_share: {key: tenant}`,
			want: `f.yaml:5: descriptors[0].fair_share: needs a rate_limit or token_limit to share; max_concurrent is not shared`,
		},
		{
			name: "unlimited",
			give: `
    rate_limit: {unlimited: true}
    fair_share: {key: tenant}`,
			want: `f.yaml:5: descriptors[0].fair_share: the rule is unlimited (rate_limit.unlimited: true); there is no limit to share`,
		},
		{
			name: "a broken limit is reported once",
			give: `
    rate_limit: {unit: fortnight, requests_per_unit: 60}
    fair_share: {key: tenant}`,
			want: `f.yaml:4: descriptors[0].rate_limit.unit: "fortnight" is not one of second|minute|hour|day|week|month|year`,
		},
		{
			name: "unknown key",
			give: `
    rate_limit: {unit: minute, requests_per_unit: 60}
    fair_share: {key: tenant, weight: plan}`,
			want: `f.yaml:5: descriptors[0].fair_share.weight: unknown key; did you mean weights?`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			head := "domain: inference\n"
			if tt.tiers {
				head += "tiers: {key: tier, default: free, plans: {free: 1}}\n"
			}
			d, err := Parse("f.yaml", []byte(head+"descriptors:\n  - key: model"+tt.give+"\n"))
			if d != nil {
				t.Errorf("Parse returned a domain with the error")
			}
			if err == nil {
				t.Fatalf("Parse error = nil, want:\n%s", tt.want)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("Parse error:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestFairShareDocExample keeps the example in docs/fair-share.md
// loadable and saying what its defaults are.
func TestFairShareDocExample(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/fair-share.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Config\n")
	if i < 0 {
		t.Fatal("docs/fair-share.md has no ## Config section")
	}
	body, ok := strings.CutPrefix(s[i+strings.Index(s[i:], "```yaml\n"):], "```yaml\n")
	end := strings.Index(body, "```")
	if !ok || end < 0 {
		t.Fatal("## Config has no yaml block")
	}
	d, err := Parse("fair-share.md", []byte("domain: inference\n"+body[:end]))
	if err != nil {
		t.Fatalf("the example does not load:\n%v", err)
	}
	want := &limit.FairShare{Key: "tenant", Plan: true, DefaultWeight: 1, Rate: &limit.FairPolicy{
		MinShare: 0.05, Backlog: time.Second, Quantum: 1, Credit: 8, MaxKeys: 256,
	}}
	if diff := cmp.Diff(want, d.Descriptors[0].Fair); diff != "" {
		t.Errorf("Fair (-want +got):\n%s", diff)
	}
}
