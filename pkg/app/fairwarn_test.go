package app

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

func TestFairWarnings(t *testing.T) {
	t.Parallel()
	const tiers = "tiers: {key: tier, default: free, plans: {free: 1, premium: 4}}\n"
	warn := func(rule, kinds string) string {
		return `rules.yaml: warning: domain "d": rule ` + rule + `: its ` + kinds + ` is one counter every request of the descriptor shares (no entry on its path has a value of its own), ` +
			`and the plan multiplier scales it per request, so up to x4 of it can be admitted in all; add fair_share to share it by plan instead (docs/fair-share.md)`
	}
	tests := []struct {
		name string
		give string
		want []string
	}{
		{
			name: "an exact value under an exact value, both limits",
			give: tiers + `descriptors:
  - key: route
    value: chat
    descriptors:
      - key: model
        value: gpt-4o
        rate_limit: {unit: minute, requests_per_unit: 10}
        token_limit: {unit: minute, tokens_per_unit: 1000}
`,
			want: []string{warn("route_chat.model_gpt-4o", "rate_limit and token_limit")},
		},
		{
			name: "a share_threshold wildcard",
			give: tiers + `descriptors:
  - {key: model, value: gpt-*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 10}}
`,
			want: []string{warn("model_gpt-*", "rate_limit")},
		},
		{
			name: "fair-shared: no warning",
			give: tiers + `descriptors:
  - {key: model, value: gpt-4o, rate_limit: {unit: minute, requests_per_unit: 10}, fair_share: {key: tenant, weights: plan}}
`,
		},
		{
			name: "a per-value entry on the path: a counter per value, no warning",
			give: tiers + `descriptors:
  - key: tenant
    descriptors:
      - {key: model, value: gpt-4o, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: model, value: gpt-*, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: user, rate_limit: {unit: minute, requests_per_unit: 10}}
`,
		},
		{
			name: "no tiers: nothing scales",
			give: `descriptors:
  - {key: model, value: gpt-4o, rate_limit: {unit: minute, requests_per_unit: 10}}
`,
		},
		{
			name: "no plan above 1: nothing scales up",
			give: "tiers: {key: tier, default: free, plans: {free: 1, trial: 0.5}}\n" + `descriptors:
  - {key: model, value: gpt-4o, rate_limit: {unit: minute, requests_per_unit: 10}}
`,
		},
		{
			name: "a fair_share backlog past 5s, on a per-tenant rule too",
			give: tiers + `descriptors:
  - {key: model, value: gpt-4o, rate_limit: {unit: minute, requests_per_unit: 10}, fair_share: {key: tenant, weights: plan, backlog: 1m}}
  - key: region
    descriptors:
      - {key: model, value: gpt-4o, token_limit: {unit: hour, tokens_per_unit: 1000}, fair_share: {key: tenant, backlog: 6s}}
  - {key: model, value: gpt-4o-mini, rate_limit: {unit: minute, requests_per_unit: 10}, fair_share: {key: tenant, backlog: 5s}}
`,
			want: []string{
				`rules.yaml: warning: domain "d": rule model_gpt-4o: its rate_limit's fair_share backlog is 1m0s: a member denied stays owed room that long, and with many members that ask less often, the room held for them goes unused (in docs/fair-share.md, "Defaults", 5s did not, and 1m wasted most of the limit after a spike)`,
				`rules.yaml: warning: domain "d": rule region.model_gpt-4o: its token_limit's fair_share backlog is 6s: a member denied stays owed room that long, and with many members that ask less often, the room held for them goes unused (in docs/fair-share.md, "Defaults", 5s did not, and 1m wasted most of the limit after a spike)`,
			},
		},
		{
			name: "unlimited counts nothing",
			give: tiers + `descriptors:
  - {key: model, value: gpt-4o, rate_limit: {unlimited: true}}
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := rulesFile(t, "domain: d\n"+tt.give)
			rs, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			got := fairWarnings(rs)
			for i := range got {
				got[i] = strings.TrimPrefix(got[i], filepath.Dir(path)+string(filepath.Separator))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestShippedRulesNoFairWarning: the shipped rules share their one global
// limit fairly, so validate passes them without a warning.
func TestShippedRulesNoFairWarning(t *testing.T) {
	t.Parallel()
	rs, err := config.Load("../../config")
	if err != nil {
		t.Fatal(err)
	}
	if w := fairWarnings(rs); len(w) != 0 {
		t.Errorf("warnings on the shipped rules: %q", w)
	}
}
