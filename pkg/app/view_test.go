package app

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestConfigViewTiers(t *testing.T) {
	t.Parallel()
	rs, err := limit.NewRuleSet(
		&limit.Domain{Name: "plans", Tiers: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "free": 1, "trial": 0.5}},
			Descriptors: []*limit.Rule{{Key: "tenant", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Minute}}}},
		&limit.Domain{Name: "plain", Descriptors: []*limit.Rule{{Key: "tenant", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Minute}}}},
	)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(newConfigView("v", "rules", "", rs))
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	const want = `{"domain":"plans","tiers":{"key":"tier","default":"free","plans":{"free":1,"premium":3,"trial":0.5}},"descriptors":`
	if !strings.Contains(got, want) {
		t.Errorf("view = %s\nwant it to contain %s", got, want)
	}
	if strings.Count(got, `"tiers"`) != 1 {
		t.Errorf("view = %s, want tiers on the domain that has them only", got)
	}
}
