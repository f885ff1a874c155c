package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// badFixture is one fixture under testdata/bad and the whole error text
// Load gives for it: file, line, path and message of every problem.
type badFixture struct {
	name string
	give string // a file or directory directly under testdata/bad
	want string
}

// badFixtures lists every fixture under testdata/bad, one per failure
// mode; TestLoadBadFixturesCovered keeps it in step with the disk.
func badFixtures() []badFixture {
	return []badFixture{
		{
			name: "unknown key in a descriptor",
			give: "unknown_key.yaml",
			want: `testdata/bad/unknown_key.yaml:4: descriptors[0].rate_limt: unknown key; did you mean rate_limit?`,
		},
		{
			name: "unknown key in a rate_limit",
			give: "unknown_limit_key.yaml",
			want: `testdata/bad/unknown_limit_key.yaml:6: descriptors[0].rate_limit.request_per_unit: unknown key; did you mean requests_per_unit?`,
		},
		{
			name: "unknown top-level key",
			give: "unknown_top_key.yaml",
			want: `testdata/bad/unknown_top_key.yaml:1: domian: unknown key; did you mean domain?
testdata/bad/unknown_top_key.yaml:1: domain is required`,
		},
		{
			name: "replaces beside rate_limit instead of inside it",
			give: "replaces_misplaced.yaml",
			want: `testdata/bad/replaces_misplaced.yaml:5: descriptors[0].replaces: unknown key here; replaces goes inside rate_limit, as in envoyproxy/ratelimit`,
		},
		{
			name: "string for a number",
			give: "string_amount.yaml",
			want: `testdata/bad/string_amount.yaml:6: descriptors[0].rate_limit.requests_per_unit: want a whole number, got the string "100"`,
		},
		{
			name: "negative number",
			give: "negative_amount.yaml",
			want: `testdata/bad/negative_amount.yaml:6: descriptors[0].rate_limit.requests_per_unit: -5 is negative`,
		},
		{
			name: "fraction",
			give: "fraction_amount.yaml",
			want: `testdata/bad/fraction_amount.yaml:6: descriptors[0].token_limit.tokens_per_unit: want a whole number, got 1.5`,
		},
		{
			name: "unknown unit",
			give: "bad_unit.yaml",
			want: `testdata/bad/bad_unit.yaml:12: descriptors[1].rate_limit.unit: "dya" is not one of second|minute|hour|day|week|month|year`,
		},
		{
			name: "unknown algorithm, in the file and in a limit",
			give: "bad_algorithm.yaml",
			want: `testdata/bad/bad_algorithm.yaml:2: algorithm: "leaky_bucket" is not one of sliding_window|fixed_window|token_bucket
testdata/bad/bad_algorithm.yaml:8: descriptors[0].rate_limit.algorithm: "gcra" is not one of sliding_window|fixed_window|token_bucket`,
		},
		{
			name: "burst without token_bucket",
			give: "burst_without_token_bucket.yaml",
			want: `testdata/bad/burst_without_token_bucket.yaml:7: descriptors[0].rate_limit.burst: applies only to algorithm token_bucket, and this limit is sliding_window`,
		},
		{
			name: "buckets out of range or without sliding_window",
			give: "buckets_out_of_range.yaml",
			want: `testdata/bad/buckets_out_of_range.yaml:7: descriptors[0].rate_limit.buckets: 601 is more than 600
testdata/bad/buckets_out_of_range.yaml:13: descriptors[1].rate_limit.buckets: applies only to algorithm sliding_window, and this limit is fixed_window`,
		},
		{
			name: "rate_limit with neither unit nor unlimited",
			give: "no_unit.yaml",
			want: `testdata/bad/no_unit.yaml:5: descriptors[0].rate_limit: unit is required (or unlimited: true)`,
		},
		{
			name: "unlimited with a unit and an amount",
			give: "unlimited_with_unit.yaml",
			want: `testdata/bad/unlimited_with_unit.yaml:6: descriptors[0].rate_limit.unit: must not be set when unlimited is true
testdata/bad/unlimited_with_unit.yaml:7: descriptors[0].rate_limit.requests_per_unit: must not be set when unlimited is true`,
		},
		{
			name: "unlimited with a token_limit",
			give: "unlimited_with_token_limit.yaml",
			want: `testdata/bad/unlimited_with_token_limit.yaml:7: descriptors[0].token_limit: the rule is unlimited (rate_limit.unlimited: true) and counts nothing, so a token_limit would be ignored`,
		},
		{
			name: "token_bucket with nothing to refill",
			give: "token_bucket_zero.yaml",
			want: `testdata/bad/token_bucket_zero.yaml:6: descriptors[0].rate_limit.requests_per_unit: a token_bucket needs at least 1`,
		},
		{
			name: "window longer than a time.Duration",
			give: "window_too_long.yaml",
			want: `testdata/bad/window_too_long.yaml:6: descriptors[0].rate_limit.unit_multiplier: 300 years is longer than the longest window, 292 years`,
		},
		{
			name: "duplicate sibling key and value",
			give: "duplicate_rule.yaml",
			want: `testdata/bad/duplicate_rule.yaml:8: descriptors[2]: a rule for key "user" with value "alice" is already defined at line 3
testdata/bad/duplicate_rule.yaml:11: descriptors[3]: a rule for key "user" with no value is already defined at line 6`,
		},
		{
			name: "empty and missing key",
			give: "empty_key.yaml",
			want: `testdata/bad/empty_key.yaml:3: descriptors[0].key: is empty
testdata/bad/empty_key.yaml:5: descriptors[1]: key is required`,
		},
		{
			name: "repeated YAML mapping key",
			give: "repeated_yaml_key.yaml",
			want: `testdata/bad/repeated_yaml_key.yaml:7: descriptors[0].rate_limit.unit: key repeated (first at line 5)`,
		},
		{
			name: "replaces naming itself, empty or without a name",
			give: "replaces_bad.yaml",
			want: `testdata/bad/replaces_bad.yaml:9: descriptors[0].rate_limit.replaces[0].name: "per_user" is this limit's own name; a limit cannot replace itself
testdata/bad/replaces_bad.yaml:10: descriptors[0].rate_limit.replaces[1].name: is empty
testdata/bad/replaces_bad.yaml:11: descriptors[0].rate_limit.replaces[2]: name is required`,
		},
		{
			name: "max_concurrent without a limit, with bad leases",
			give: "max_concurrent_bad.yaml",
			want: `testdata/bad/max_concurrent_bad.yaml:5: descriptors[0].max_concurrent: limit is required
testdata/bad/max_concurrent_bad.yaml:5: descriptors[0].max_concurrent.lease: "forever" is not a duration such as 30s or 10m
testdata/bad/max_concurrent_bad.yaml:7: descriptors[1].max_concurrent.limit: 0 is less than 1
testdata/bad/max_concurrent_bad.yaml:7: descriptors[1].max_concurrent.lease: 100ms is outside 1s..24h`,
		},
		{
			name: "share_threshold without a wildcard",
			give: "share_threshold_without_wildcard.yaml",
			want: `testdata/bad/share_threshold_without_wildcard.yaml:5: descriptors[0].share_threshold: applies only to a wildcard value (one holding a *)`,
		},
		{
			name: "not a boolean",
			give: "bad_bool.yaml",
			want: `testdata/bad/bad_bool.yaml:4: descriptors[0].shadow_mode: want true or false, got the string "maybe"`,
		},
		{
			name: "descriptors not a list",
			give: "descriptors_not_list.yaml",
			want: `testdata/bad/descriptors_not_list.yaml:3: descriptors: want a list of descriptors, got a mapping`,
		},
		{
			name: "empty file",
			give: "empty.yaml",
			want: `testdata/bad/empty.yaml:1: file is empty; a rule file needs at least a domain`,
		},
		{
			name: "only comments",
			give: "only_comments.yaml",
			want: `testdata/bad/only_comments.yaml:1: file is empty; a rule file needs at least a domain`,
		},
		{
			name: "no domain",
			give: "no_domain.yaml",
			want: `testdata/bad/no_domain.yaml:1: domain is required`,
		},
		{
			name: "invalid YAML",
			give: "invalid_yaml.yaml",
			want: `testdata/bad/invalid_yaml.yaml:3: invalid YAML: did not find expected ',' or '}'`,
		},
		{
			name: "two documents",
			give: "two_documents.yaml",
			want: `testdata/bad/two_documents.yaml:2: a second YAML document; a rule file holds one document (one domain)`,
		},
		{
			name: "top level is a list",
			give: "top_level_list.yaml",
			want: `testdata/bad/top_level_list.yaml:1: want a mapping with keys domain|algorithm|descriptors|tiers|shedding|breakers|store_failure|retry_budget|queue, got a list`,
		},
		{
			name: "tiers without key, default or plans",
			give: "tiers_missing.yaml",
			want: `testdata/bad/tiers_missing.yaml:2: tiers: key is required
testdata/bad/tiers_missing.yaml:2: tiers: plans is required
testdata/bad/tiers_missing.yaml:2: tiers: default is required`,
		},
		{
			name: "tiers default not a plan",
			give: "tiers_default_not_plan.yaml",
			want: `testdata/bad/tiers_default_not_plan.yaml:4: tiers.default: "gold" is not one of the plans (premium|standard|free)`,
		},
		{
			name: "tiers multipliers out of range, not numbers, repeated",
			give: "tiers_bad_multiplier.yaml",
			want: `testdata/bad/tiers_bad_multiplier.yaml:6: tiers.plans.premium: 1001 is more than 1000
testdata/bad/tiers_bad_multiplier.yaml:7: tiers.plans.standard: want a number such as 2 or 0.5, got the string "three"
testdata/bad/tiers_bad_multiplier.yaml:8: tiers.plans.free: 0 is not more than 0
testdata/bad/tiers_bad_multiplier.yaml:9: tiers.plans.trial: -0.5 is not more than 0
testdata/bad/tiers_bad_multiplier.yaml:10: tiers.plans.broken: want a finite number, got .nan
testdata/bad/tiers_bad_multiplier.yaml:11: tiers.plans.premium: plan repeated (first at line 6)`,
		},
		{
			name: "tiers unknown key",
			give: "tiers_unknown_key.yaml",
			want: `testdata/bad/tiers_unknown_key.yaml:3: tiers.keys: unknown key; did you mean key?
testdata/bad/tiers_unknown_key.yaml:3: tiers: key is required`,
		},
		{
			name: "tiers plans not a mapping",
			give: "tiers_plans_not_mapping.yaml",
			want: `testdata/bad/tiers_plans_not_mapping.yaml:5: tiers.plans: want a mapping of plan names to multipliers, got a list`,
		},
		{
			name: "a rule on the tier key, declared before tiers",
			give: "tiers_rule_uses_key.yaml",
			want: `testdata/bad/tiers_rule_uses_key.yaml:6: descriptors[0].descriptors[0].key: tier is the tiers.key; tier entries are read for the plan multiplier and removed before matching
testdata/bad/tiers_rule_uses_key.yaml:11: descriptors[2].key: tier is the tiers.key; tier entries are read for the plan multiplier and removed before matching`,
		},
		{
			name: "the same domain in two files",
			give: "dupdomain",
			want: `testdata/bad/dupdomain/b.yaml:2: domain: "edge" is already the domain of testdata/bad/dupdomain/a.yaml; a domain lives in one file`,
		},
		{
			name: "shedding not ascending",
			give: "shedding_not_ascending.yaml",
			want: `testdata/bad/shedding_not_ascending.yaml:6: shedding.steps[1].above: 0.7 is not above steps[0].above 0.8`,
		},
		{
			name: "shedding unknown step key",
			give: "shedding_unknown_step_key.yaml",
			want: `testdata/bad/shedding_unknown_step_key.yaml:5: shedding.steps[0].limit_facter: unknown key; did you mean limit_factor?`,
		},
		{
			name: "shedding bad scope",
			give: "shedding_bad_scope.yaml",
			want: `testdata/bad/shedding_bad_scope.yaml:3: shedding.scope: "tenant" is not one of global|model`,
		},
		{
			name: "shedding bad hold",
			give: "shedding_bad_hold.yaml",
			want: `testdata/bad/shedding_bad_hold.yaml:3: shedding.hold: "soon" is not a duration such as 30s or 10m`,
		},
		{
			name: "shedding bad burst floor",
			give: "shedding_bad_burst_floor.yaml",
			want: `testdata/bad/shedding_bad_burst_floor.yaml:3: shedding.burst_floor: 10µs is not at least 1ms`,
		},
		{
			name: "shedding factor range",
			give: "shedding_factor_range.yaml",
			want: `testdata/bad/shedding_factor_range.yaml:5: shedding.steps[0].limit_factor: 1.5 is not in (0,1] (0: unchanged)`,
		},
		{
			name: "shedding duplicate tier",
			give: "shedding_duplicate_tier.yaml",
			want: `testdata/bad/shedding_duplicate_tier.yaml:7: shedding.steps[0].admit_only[1]: tier "premium" listed twice`,
		},
		{
			name: "shedding not number",
			give: "shedding_not_number.yaml",
			want: `testdata/bad/shedding_not_number.yaml:4: shedding.steps[0].above: want a number such as 0.7, got the string "high"`,
		},
		{
			name: "store_failure not a policy, in the file, a rule and a child",
			give: "store_failure_bad.yaml",
			want: `testdata/bad/store_failure_bad.yaml:2: store_failure: "open" is not one of allow|deny|local
testdata/bad/store_failure_bad.yaml:5: descriptors[0].store_failure: "Deny" is not one of allow|deny|local
testdata/bad/store_failure_bad.yaml:9: descriptors[0].descriptors[0].store_failure: want a string, got a list`,
		},
		{
			name: "breaker no threshold",
			give: "breaker_no_threshold.yaml",
			want: `testdata/bad/breaker_no_threshold.yaml:3: breakers[0].failure_threshold: failure_threshold must be at least 1`,
		},
		{
			name: "breaker duplicate key",
			give: "breaker_duplicate_key.yaml",
			want: `testdata/bad/breaker_duplicate_key.yaml:7: breakers[1].key: "model" has a breaker already (line 3); one breaker per key`,
		},
		{
			name: "breaker bad window",
			give: "breaker_bad_window.yaml",
			want: `testdata/bad/breaker_bad_window.yaml:5: breakers[0].window: window must be at least 1ms, not 0s`,
		},
		{
			name: "breaker bad failure rate",
			give: "breaker_bad_failure_rate.yaml",
			want: `testdata/bad/breaker_bad_failure_rate.yaml:5: breakers[0].failure_rate: failure_rate must be in (0,1], not 1.5`,
		},
		{
			name: "breaker zero failure rate",
			give: "breaker_zero_failure_rate.yaml",
			want: `testdata/bad/breaker_zero_failure_rate.yaml:5: breakers[0].failure_rate: failure_rate must be in (0,1], not 0`,
		},
		{
			name: "breaker zero min requests",
			give: "breaker_zero_min_requests.yaml",
			want: `testdata/bad/breaker_zero_min_requests.yaml:5: breakers[0].min_requests: 0 is less than 1`,
		},
		{
			name: "breaker bad cache",
			give: "breaker_bad_cache.yaml",
			want: `testdata/bad/breaker_bad_cache.yaml:7: breakers[0].cache: cache must be between 1ms and 10s, not 20s`,
		},
		{
			name: "breaker tier key",
			give: "breaker_tier_key.yaml",
			want: `testdata/bad/breaker_tier_key.yaml:7: breakers[0].key: tier is the tiers.key; tier entries are removed before matching`,
		},
		{
			name: "control unknown key",
			give: "control_unknown_key.yaml",
			want: `testdata/bad/control_unknown_key.yaml:7: shedding.control.dwel: unknown key; did you mean dwell?`,
		},
		{
			name: "control out of range",
			give: "control_ranges.yaml",
			want: `testdata/bad/control_ranges.yaml:6: shedding.control.target: 5 is not in (0,4]
testdata/bad/control_ranges.yaml:7: shedding.control.sheddable[1]: tier "free" listed twice
testdata/bad/control_ranges.yaml:8: shedding.control.quantum: 0.9 is not in [0.01,0.5]
testdata/bad/control_ranges.yaml:9: shedding.control.window: 100ms is not between 2 and 200 intervals of 250ms`,
		},
		{
			name: "control without sheddable",
			give: "control_no_sheddable.yaml",
			want: `testdata/bad/control_no_sheddable.yaml:5: shedding.control: sheddable is required: the tiers the controller may shed, lowest first`,
		},
		{
			name: "control without tiers",
			give: "control_no_tiers.yaml",
			want: `testdata/bad/control_no_tiers.yaml:4: shedding.control: the controller sheds tiers: the file needs tiers`,
		},
		{
			name: "control sheds an unknown tier",
			give: "control_unknown_tier.yaml",
			want: `testdata/bad/control_unknown_tier.yaml:6: shedding.control.sheddable[0]: "bronze" is not a plan of tiers`,
		},
		{
			name: "control capacity zero",
			give: "control_capacity_zero.yaml",
			want: `testdata/bad/control_capacity_zero.yaml:5: shedding.control.capacity.gpt-4o: 0 is less than 1`,
		},
		{
			name: "breakers not list",
			give: "breakers_not_list.yaml",
			want: `testdata/bad/breakers_not_list.yaml:3: breakers: want a list of breakers, got a mapping`,
		},
	}
}

// TestLoadBad loads one fixture per failure mode and checks the whole
// error text: file, line, path and message.
func TestLoadBad(t *testing.T) {
	t.Parallel()
	for _, tt := range badFixtures() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantLoadErrors(t, filepath.Join("testdata", "bad", tt.give), tt.want)
		})
	}
}

// wantLoadErrors loads the fixture at path and wants no rules and an
// Errors whose whole text (file, line, path and message) is want.
func wantLoadErrors(t testing.TB, path, want string) {
	t.Helper()
	rs, err := Load(path)
	if rs != nil {
		t.Errorf("Load returned rules with the error")
	}
	var probs Errors
	if !errors.As(err, &probs) {
		t.Fatalf("Load error = %v (%T), want Errors", err, err)
	}
	if got := err.Error(); got != want {
		t.Errorf("Load error:\n%s\nwant:\n%s", got, want)
	}
}

// TestLoadBadFixturesCovered keeps badFixtures in step with the fixtures
// on disk: every file and directory under testdata/bad has exactly one
// entry, so TestLoadBad asserts its exact error, and every entry names a
// fixture that exists. A fixture added without its expected error, or
// one renamed or deleted, fails here.
func TestLoadBadFixturesCovered(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(filepath.Join("testdata", "bad"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 30 {
		t.Errorf("%d fixtures in testdata/bad, want one per failure mode (30 or more)", len(entries))
	}
	rows := map[string]int{} // fixture -> entries of badFixtures naming it
	for _, f := range badFixtures() {
		rows[f.give]++
	}
	for _, e := range entries {
		switch n := rows[e.Name()]; n {
		case 1:
		case 0:
			t.Errorf("testdata/bad/%s has no entry in badFixtures: add its exact expected error", e.Name())
		default:
			t.Errorf("testdata/bad/%s has %d entries in badFixtures, want 1", e.Name(), n)
		}
		delete(rows, e.Name())
	}
	for give := range rows {
		t.Errorf("badFixtures names %s, which is not in testdata/bad", give)
	}
}

// TestParseGenerated covers failure modes whose fixtures are too large or
// too regular to keep as files.
func TestParseGenerated(t *testing.T) {
	t.Parallel()
	deepPath := "descriptors" + strings.Repeat("[0].descriptors", limit.MaxEntries)
	tests := []struct {
		name string
		give []byte
		want string
	}{
		{
			name: "file over 4 MiB",
			give: append([]byte("domain: big\n#"), make([]byte, maxFileBytes)...),
			want: "big.yaml: file is larger than 4 MiB, the most a rule file may hold",
		},
		{
			name: "nested deeper than a descriptor can be",
			give: []byte("domain: deep\ndescriptors:" + strings.Repeat(" [{key: k, descriptors:", limit.MaxEntries+1) +
				" []" + strings.Repeat("}]", limit.MaxEntries+1) + "\n"),
			want: "big.yaml:2: " + deepPath + ": nested deeper than 32 levels; a request descriptor has at most 32 entries, so these rules could never match",
		},
		{
			name: "too many problems",
			give: func() []byte {
				b := []byte("domain: many\ndescriptors:\n")
				for i := range 60 {
					b = fmt.Appendf(b, "  - {key: k%d, rate_limit: {unit: dya, requests_per_unit: 1}}\n", i)
				}
				return b
			}(),
			want: strings.Join(func() []string {
				var lines []string
				for i := range maxProblems {
					lines = append(lines, fmt.Sprintf("big.yaml:%d: descriptors[%d].rate_limit.unit: \"dya\" is not one of second|minute|hour|day|week|month|year", i+3, i))
				}
				return append(lines, "big.yaml: stopped after the first 50 problems")
			}(), "\n"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("big.yaml", tt.give)
			if d != nil {
				t.Errorf("Parse returned a domain with the error")
			}
			if err == nil || err.Error() != tt.want {
				t.Errorf("Parse error:\n%v\nwant:\n%s", err, tt.want)
			}
		})
	}
}

// TestParseAliasBomb parses a small file whose aliases expand to 2^22
// rules: each level lists two distinct rules that both hold the level
// below. The walk must stop early rather than build them.
func TestParseAliasBomb(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n")
	b.WriteString("  - {key: d0, descriptors: &l0 [{key: k, value: a}, {key: k, value: b}]}\n")
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&b, "  - {key: d%d, descriptors: &l%d [{key: k, value: a, descriptors: *l%d}, {key: k, value: b, descriptors: *l%d}]}\n", i, i, i-1, i-1)
	}
	_, err := Parse("bomb.yaml", []byte(b.String()))
	var probs Errors
	if !errors.As(err, &probs) || len(probs) != 1 {
		t.Fatalf("Parse error = %v, want one problem", err)
	}
	want := fmt.Sprintf("aliases expand the file too far; stopped after %d YAML nodes", b.Len()+extraVisits-1)
	if p := probs[0]; p.Msg != want || p.Line == 0 || p.File != "bomb.yaml" {
		t.Errorf("problem = %+v, want %q with a line", p, want)
	}
}

// TestVisitsPerByte checks the assumption behind the walk's budget: a
// file without aliases, however dense, visits fewer nodes than half its
// bytes, so it never runs out.
func TestVisitsPerByte(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give func(i int) string // the i'th line of a descriptors list
	}{
		{name: "flow key only", give: func(i int) string { return fmt.Sprintf("- {key: %x}\n", i) }},
		{name: "block key only", give: func(i int) string { return fmt.Sprintf("- key: %x\n", i) }},
		{name: "key and value", give: func(i int) string { return fmt.Sprintf("- {key: k, value: %x}\n", i) }},
		{name: "limits", give: func(i int) string {
			return fmt.Sprintf("- {key: %x, rate_limit: {unit: second, requests_per_unit: 1}, token_limit: {unit: second, tokens_per_unit: 1}}\n", i)
		}},
		{name: "long replaces", give: func(i int) string {
			if i == 0 {
				return "- key: k\n  rate_limit:\n    unit: second\n    requests_per_unit: 1\n    replaces:\n"
			}
			return fmt.Sprintf("    - {name: %x}\n", i)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			b.WriteString("domain: d\ndescriptors:\n")
			for i := 0; b.Len() < 64<<10; i++ {
				b.WriteString(tt.give(i))
			}
			w := &walker{file: "t.yaml"}
			root := w.document([]byte(b.String()), ruleFileDoc)
			w.budget = 1 << 30 // measure the visits, never stop on them
			if root != nil {
				w.domain(root)
			}
			if len(w.problems) > 0 {
				t.Fatalf("walk found problems: %v", w.problems[0])
			}
			t.Logf("%d visits for %d bytes", w.visits, b.Len())
			if ratio := float64(w.visits) / float64(b.Len()); ratio >= 0.5 {
				t.Errorf("%d visits for %d bytes (%.2f per byte), want under 0.5", w.visits, b.Len(), ratio)
			}
		})
	}
}

// TestParseLimits checks how each rule file key maps onto limit.Rule.
func TestParseLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want *limit.Rule // the first top-level rule, children left out
	}{
		{
			name: "defaults",
			give: "{key: k, rate_limit: {unit: minute, requests_per_unit: 10}}",
			want: &limit.Rule{Key: "k", RateLimit: &limit.Limit{Kind: limit.Requests, Algorithm: limit.SlidingWindow,
				Amount: 10, Unit: limit.Minute, Multiplier: 1, Buckets: limit.DefaultBuckets}},
		},
		{
			name: "zero denies everything, as in envoyproxy/ratelimit",
			give: "{key: k, value: v, rate_limit: {unit: second, requests_per_unit: 0}}",
			want: &limit.Rule{Key: "k", Value: "v", RateLimit: &limit.Limit{Kind: limit.Requests, Algorithm: limit.SlidingWindow,
				Unit: limit.Second, Multiplier: 1, Buckets: limit.DefaultBuckets}},
		},
		{
			name: "upper-case unit and algorithm",
			give: "{key: k, rate_limit: {unit: HOUR, requests_per_unit: 10, algorithm: FIXED_WINDOW}}",
			want: &limit.Rule{Key: "k", RateLimit: &limit.Limit{Kind: limit.Requests, Algorithm: limit.FixedWindow,
				Amount: 10, Unit: limit.Hour, Multiplier: 1}},
		},
		{
			name: "token bucket burst defaults to the amount",
			give: "{key: k, rate_limit: {unit: second, requests_per_unit: 7, algorithm: token_bucket}}",
			want: &limit.Rule{Key: "k", RateLimit: &limit.Limit{Kind: limit.Requests, Algorithm: limit.TokenBucket,
				Amount: 7, Unit: limit.Second, Multiplier: 1, Burst: 7}},
		},
		{
			name: "token limit with every extension",
			give: "{key: k, token_limit: {name: t, unit: week, unit_multiplier: 2, tokens_per_unit: 1000, algorithm: token_bucket, burst: 50}}",
			want: &limit.Rule{Key: "k", TokenLimit: &limit.Limit{Name: "t", Kind: limit.Tokens, Algorithm: limit.TokenBucket,
				Amount: 1000, Unit: limit.Week, Multiplier: 2, Burst: 50}},
		},
		{
			name: "sliding window precision",
			give: "{key: k, rate_limit: {unit: day, requests_per_unit: 1, buckets: 600}}",
			want: &limit.Rule{Key: "k", RateLimit: &limit.Limit{Kind: limit.Requests, Algorithm: limit.SlidingWindow,
				Amount: 1, Unit: limit.Day, Multiplier: 1, Buckets: 600}},
		},
		{
			name: "unlimited",
			give: "{key: k, rate_limit: {unlimited: true, name: ignored}}",
			want: &limit.Rule{Key: "k", Unlimited: true},
		},
		{
			name: "replaces, shadow and detailed metrics",
			give: "{key: k, shadow_mode: yes, detailed_metric: on, rate_limit: {name: a, unit: month, requests_per_unit: 3, replaces: [{name: b}, {name: c}]}}",
			want: &limit.Rule{Key: "k", Shadow: true, DetailedMetric: true, Replaces: []string{"b", "c"},
				RateLimit: &limit.Limit{Name: "a", Kind: limit.Requests, Algorithm: limit.SlidingWindow,
					Amount: 3, Unit: limit.Month, Multiplier: 1, Buckets: limit.DefaultBuckets}},
		},
		{
			name: "empty documents after the first",
			give: "{key: k}\n---\n# nothing\n---\n",
			want: &limit.Rule{Key: "k"},
		},
		{
			name: "max_concurrent with the default lease",
			give: "{key: k, max_concurrent: {limit: 4}}",
			want: &limit.Rule{Key: "k", MaxConcurrent: 4, Lease: 10 * time.Minute},
		},
		{
			name: "max_concurrent with a lease",
			give: "{key: k, max_concurrent: {limit: 4, lease: 90s}}",
			want: &limit.Rule{Key: "k", MaxConcurrent: 4, Lease: 90 * time.Second},
		},
		{
			name: "quota_mode changes nothing yet; value_to_metric and share_threshold",
			give: "{key: k, value: p*, quota_mode: true, value_to_metric: true, share_threshold: true}",
			want: &limit.Rule{Key: "k", Value: "p*", ShareThreshold: true, ValueToMetric: true},
		},
		{
			name: "scalars read as written, nulls as absent",
			give: "{key: 404, value: 1.50, shadow_mode: ~, descriptors: ~, rate_limit: {unit: year, requests_per_unit: 0x10, name: ~}}",
			want: &limit.Rule{Key: "404", Value: "1.50", RateLimit: &limit.Limit{Kind: limit.Requests, Algorithm: limit.SlidingWindow,
				Amount: 16, Unit: limit.Year, Multiplier: 1, Buckets: limit.DefaultBuckets}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("t.yaml", []byte("domain: d\ndescriptors:\n  - "+tt.give+"\n"))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := d.Descriptors[0]
			got.Children = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("rule = %s\nwant   %s", ruleString(got), ruleString(tt.want))
			}
		})
	}
}

func TestParseTiers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want *limit.Tiers
	}{
		{name: "none", give: "", want: nil},
		{
			name: "plans with a fraction and a hex integer",
			give: "tiers: {key: tier, default: free, plans: {premium: 3, standard: 2, free: 1, trial: 0.5, bulk: 0x10}}\n",
			want: &limit.Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"premium": 3, "standard": 2, "free": 1, "trial": 0.5, "bulk": 16}},
		},
		{
			name: "the most a plan may multiply by",
			give: "tiers: {key: plan, default: x, plans: {x: 1000}}\n",
			want: &limit.Tiers{Key: "plan", Default: "x", Plans: map[string]float64{"x": 1000}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("t.yaml", []byte("domain: d\n"+tt.give+"descriptors:\n  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 1}}\n"))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(d.Tiers, tt.want) {
				t.Errorf("Tiers = %+v, want %+v", d.Tiers, tt.want)
			}
			if _, err := limit.NewRuleSet(d); err != nil {
				t.Errorf("NewRuleSet: %v", err)
			}
		})
	}
}

// TestParseOverload: the fields of issue 13's overload control, read
// where a rules file puts them.
func TestParseOverload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		give         string
		wantShedding *limit.Shedding
		wantBreakers []limit.BreakerConfig
	}{
		{
			name: "failure rate and min requests",
			give: "breakers: [{key: model, failure_threshold: 5, failure_rate: 0.5, min_requests: 10, window: 10s, open_for: 1s, half_open_probes: 1}]\n",
			wantBreakers: []limit.BreakerConfig{{Key: "model", FailureThreshold: 5, FailureRate: 0.5, MinRequests: 10,
				Window: 10 * time.Second, OpenFor: time.Second, HalfOpenProbes: 1}},
		},
		{
			name:         "burst floor",
			give:         "shedding: {burst_floor: 500ms, steps: [{above: 0.8, burst: false}]}\n",
			wantShedding: &limit.Shedding{BurstFloor: 500 * time.Millisecond, Steps: []limit.ShedStep{{Above: 0.8, NoBurst: true}}},
		},
		{
			name:         "no burst floor",
			give:         "shedding: {steps: [{above: 0.8, burst: false}]}\n",
			wantShedding: &limit.Shedding{Steps: []limit.ShedStep{{Above: 0.8, NoBurst: true}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("t.yaml", []byte("domain: d\n"+tt.give+"descriptors:\n  - {key: model, rate_limit: {unit: minute, requests_per_unit: 1}}\n"))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(d.Shedding, tt.wantShedding) {
				t.Errorf("Shedding = %+v, want %+v", d.Shedding, tt.wantShedding)
			}
			if !reflect.DeepEqual(d.Breakers, tt.wantBreakers) {
				t.Errorf("Breakers = %+v, want %+v", d.Breakers, tt.wantBreakers)
			}
			if _, err := limit.NewRuleSet(d); err != nil {
				t.Errorf("NewRuleSet: %v", err)
			}
		})
	}
}

// TestLoadOverload: the sized example of docs/breaker.md loads whole.
func TestLoadOverload(t *testing.T) {
	t.Parallel()
	rs, err := Load(filepath.Join("testdata", "good", "overload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d := rs.Domain("inference")
	if d == nil || d.Shedding == nil || len(d.Breakers) != 1 {
		t.Fatalf("domain = %+v", d)
	}
	want := limit.BreakerConfig{Key: "model", FailureThreshold: 5, FailureRate: 0.5, MinRequests: 10, Window: 10 * time.Second,
		OpenFor: time.Second, HalfOpenProbes: 1, CloseAfter: 1, ProbeLease: 5 * time.Second, Cache: 100 * time.Millisecond}
	if d.Breakers[0] != want {
		t.Errorf("breaker = %+v, want %+v", d.Breakers[0], want)
	}
	if d.Shedding.BurstFloor != time.Second {
		t.Errorf("burst_floor = %v, want 1s", d.Shedding.BurstFloor)
	}
}

func TestParseAliases(t *testing.T) {
	t.Parallel()
	give := `domain: d
descriptors:
  - key: a
    rate_limit: &std {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: *std
`
	d, err := Parse("t.yaml", []byte(give))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if a, b := d.Descriptors[0].RateLimit, d.Descriptors[1].RateLimit; !reflect.DeepEqual(a, b) || a == b {
		t.Errorf("aliased limits = %+v and %+v, want equal values in distinct Limits", a, b)
	}
}

func TestParseFileAlgorithm(t *testing.T) {
	t.Parallel()
	rs, err := Load(filepath.Join("testdata", "good", "extended.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	d := rs.Domain("inference")
	tests := []struct {
		name string
		give []limit.Entry
		want string
	}{
		{
			name: "a limit's algorithm beats the file's",
			give: []limit.Entry{{Key: "tenant", Value: "acme"}},
			want: "requests 600/1m0s sliding_window buckets=60",
		},
		{
			name: "the file's algorithm is the default",
			give: []limit.Entry{{Key: "tenant", Value: "acme"}, {Key: "model", Value: "gpt-4o"}},
			want: "requests 100/1m0s fixed_window; tokens 500000/1h0m0s fixed_window name=tenant_tokens",
		},
		{
			name: "token bucket with a burst",
			give: []limit.Entry{{Key: "model", Value: "gpt-4o"}},
			want: "requests 10000/1m0s token_bucket burst=500",
		},
		{
			name: "unit multiplier",
			give: []limit.Entry{{Key: "batch", Value: "nightly"}},
			want: "tokens 9000000/168h0m0s token_bucket burst=9000000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ruleString(d.Match(tt.give)); got != tt.want {
				t.Errorf("Match = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestLoadStoreFailure checks that store_failure is inherited down the
// rule tree from the nearest rule that sets it, then from the file.
func TestLoadStoreFailure(t *testing.T) {
	t.Parallel()
	rs, err := Load(filepath.Join("testdata", "good", "store-failure.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	d := rs.Domain("degraded")
	if d.StoreFailure != limit.FailureLocal {
		t.Errorf("domain store_failure = %v, want local", d.StoreFailure)
	}
	tests := []struct {
		name string
		give []limit.Entry
		want limit.StoreFailure
	}{
		{name: "the rule's own", give: []limit.Entry{{Key: "tenant", Value: "a"}}, want: limit.FailureDeny},
		{name: "inherited from the parent rule", give: []limit.Entry{{Key: "tenant", Value: "a"}, {Key: "model", Value: "m"}}, want: limit.FailureDeny},
		{name: "the nearest wins", give: []limit.Entry{{Key: "tenant", Value: "a"}, {Key: "user", Value: "u"}}, want: limit.FailureAllow},
		{name: "the file's", give: []limit.Entry{{Key: "path", Value: "/"}}, want: limit.FailureLocal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := d.Match(tt.give).StoreFailure; got != tt.want {
				t.Errorf("store_failure = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLoadEnvoyStyle loads a file in envoyproxy/ratelimit's format and
// checks that it matches as it does there.
func TestLoadEnvoyStyle(t *testing.T) {
	t.Parallel()
	rs, err := Load(filepath.Join("testdata", "good", "envoy-style.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	d := rs.Domain("messaging")
	if d == nil || d.Source != filepath.Join("testdata", "good", "envoy-style.yaml") {
		t.Fatalf("domain messaging = %+v, want it with its Source", d)
	}
	e := func(kv ...string) []limit.Entry {
		var out []limit.Entry
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, limit.Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name string
		give []limit.Entry
		want string
	}{
		{name: "nested, upper-case unit", give: e("message_type", "marketing", "to_number", "1"), want: "requests 5/24h0m0s sliding_window buckets=20"},
		{name: "a level with no limit", give: e("message_type", "marketing"), want: "none"},
		{name: "deeper than the rules", give: e("message_type", "marketing", "to_number", "1", "x", "y"), want: "none"},
		{name: "key only, mixed-case unit", give: e("to_number", "1"), want: "requests 100/24h0m0s sliding_window buckets=20 name=per_number"},
		{name: "exact value before key only", give: e("to_number", "2065550100"), want: "unlimited"},
		{name: "numeric value", give: e("status", "429"), want: "requests 1/1s sliding_window buckets=20"},
		{name: "wildcard", give: e("path", "/v1/users"), want: "requests 20/1m0s sliding_window buckets=20 shared"},
		{name: "longest wildcard first", give: e("path", "/v1/admin/keys"), want: "requests 2/1m0s sliding_window buckets=20"},
		{name: "no wildcard matches", give: e("path", "/v2/users"), want: "none"},
		{name: "shadow mode", give: e("service", "s", "user", "tester"), want: "requests 10/1s sliding_window buckets=20 shadow"},
		{name: "detailed metric", give: e("service", "s", "user", "bob"), want: "requests 20/1h0m0s sliding_window buckets=20 detailed"},
		{name: "replaces", give: e("vip", "true", "to_number", "1"), want: "requests 1000/24h0m0s sliding_window buckets=20 replaces=per_number"},
		{name: "placeholder without limit", give: e("placeholder", "x"), want: "none"},
		{name: "null children", give: e("all_commented_out", "x"), want: "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ruleString(d.Match(tt.give)); got != tt.want {
				t.Errorf("Match = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestLoadExamples loads every example rule file shipped in config/.
func TestLoadExamples(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("glob config/*.yaml = %v, %v; want the example files", files, err)
	}
	// make run and make validate load the directory whole.
	if _, err := Load(filepath.Join("..", "..", "config")); err != nil {
		t.Errorf("Load(config):\n%v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			rs, err := Load(f)
			if err != nil {
				t.Fatalf("Load:\n%v", err)
			}
			if len(rs.Domains()) != 1 {
				t.Errorf("Load = %d domains, want 1", len(rs.Domains()))
			}
		})
	}
}

func TestProblemString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give Problem
		want string
	}{
		{name: "everything", give: Problem{File: "r.yaml", Line: 3, Path: "domain", Msg: "is empty"}, want: "r.yaml:3: domain: is empty"},
		{name: "no path", give: Problem{File: "r.yaml", Line: 1, Msg: "domain is required"}, want: "r.yaml:1: domain is required"},
		{name: "no line", give: Problem{File: "r.yaml", Msg: "too big"}, want: "r.yaml: too big"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.give.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

// ruleString summarizes what a matched rule does, for comparisons.
func ruleString(r *limit.Rule) string {
	if r == nil {
		return "none"
	}
	if r.Unlimited {
		return "unlimited"
	}
	var parts []string
	for _, l := range []*limit.Limit{r.RateLimit, r.TokenLimit} {
		if l == nil {
			continue
		}
		s := fmt.Sprintf("%s %d/%s %s", l.Kind, l.Amount, l.Window(), l.Algorithm)
		if l.Burst != 0 {
			s += fmt.Sprintf(" burst=%d", l.Burst)
		}
		if l.Buckets != 0 {
			s += fmt.Sprintf(" buckets=%d", l.Buckets)
		}
		if l.Name != "" {
			s += " name=" + l.Name
		}
		parts = append(parts, s)
	}
	s := strings.Join(parts, "; ")
	if r.Shadow {
		s += " shadow"
	}
	if r.DetailedMetric {
		s += " detailed"
	}
	if r.ShareThreshold {
		s += " shared"
	}
	if r.MaxConcurrent > 0 {
		s += fmt.Sprintf(" concurrent=%d/%s", r.MaxConcurrent, r.Lease)
	}
	if len(r.Replaces) > 0 {
		s += " replaces=" + strings.Join(r.Replaces, ",")
	}
	return s
}

func TestLoadControl(t *testing.T) {
	t.Parallel()
	rs, err := Load(filepath.Join("testdata", "good", "control.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := &limit.Control{
		Capacity: map[string]int64{"gpt-4o": 32}, Target: 1, Sheddable: []string{"free", "standard"},
		Interval: 250 * time.Millisecond, Window: 2 * time.Second, Dwell: 10 * time.Second, Quantum: 0.1,
		Lease: 2 * time.Minute, Grace: 10 * time.Second,
	}
	d := rs.Domain("inference")
	if d == nil || d.Shedding == nil {
		t.Fatal("no shedding")
	}
	if diff := cmp.Diff(want, d.Shedding.Control); diff != "" {
		t.Errorf("control (-want +got):\n%s", diff)
	}
}

// TestLoadEnvoyLeniency: what envoyproxy/ratelimit loads and ignores, or
// reads leniently, Tollgate loads too, with a warning on the domain that
// names file, line and path (issue 18); what it refuses stays refused.
func TestLoadEnvoyLeniency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, give  string
		want        string // the warning
		wantAmount  uint64
		wantLimit   bool
		wantUnlimit bool
	}{
		{
			name:      "unit without requests_per_unit is a limit of 0",
			give:      "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n",
			want:      "rules.yaml:5: descriptors[0].rate_limit: warning: requests_per_unit is missing: read as 0, as envoyproxy/ratelimit reads it, so every request this rule matches is over its limit",
			wantLimit: true,
		},
		{
			name:        "requests_per_unit beside unlimited is ignored",
			give:        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      requests_per_unit: 10\n",
			want:        "rules.yaml:6: descriptors[0].rate_limit.requests_per_unit: warning: ignored beside unlimited: true (as envoyproxy/ratelimit ignores it)",
			wantUnlimit: true,
		},
		{
			name:       "unit beside key is ignored",
			give:       "domain: d\ndescriptors:\n  - key: k\n    unit: second\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
			want:       "rules.yaml:4: descriptors[0].unit: warning: ignored: a unit belongs inside rate_limit or token_limit (envoyproxy/ratelimit ignores it here too)",
			wantAmount: 3,
			wantLimit:  true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("rules.yaml", []byte(tt.give))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(d.Warnings) != 1 || d.Warnings[0] != tt.want {
				t.Errorf("warnings %q, want [%q]", d.Warnings, tt.want)
			}
			r := d.Descriptors[0]
			if r.Unlimited != tt.wantUnlimit || (r.RateLimit != nil) != tt.wantLimit {
				t.Fatalf("rule unlimited %v, rate_limit %+v; want unlimited %v, a limit %v", r.Unlimited, r.RateLimit, tt.wantUnlimit, tt.wantLimit)
			}
			if r.RateLimit != nil && r.RateLimit.Amount != tt.wantAmount {
				t.Errorf("amount %d, want %d", r.RateLimit.Amount, tt.wantAmount)
			}
		})
	}
	// Still refused: a unit beside unlimited (envoyproxy/ratelimit refuses
	// it too), and a token_limit without its amount (Tollgate's own).
	for _, give := range []string{
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: minute}\n",
		"domain: d\ndescriptors:\n  - key: k\n    token_limit: {unit: minute}\n",
	} {
		if _, err := Parse("rules.yaml", []byte(give)); err == nil {
			t.Errorf("Parse(%q) loaded", give)
		}
	}
	// A file without any of it has no warnings.
	d, err := Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"))
	if err != nil || len(d.Warnings) != 0 {
		t.Errorf("a plain file: warnings %q, %v; want none", d.Warnings, err)
	}
}

// TestWildcardAnywhere: a * anywhere in a value matches any run of bytes,
// none included, as envoyproxy/ratelimit matches it; the pattern with the
// most literal bytes wins, then the file's order; an exact value beats
// every pattern; and a value that matches no pattern falls to the key.
func TestWildcardAnywhere(t *testing.T) {
	t.Parallel()
	d, err := Parse("rules.yaml", []byte(`domain: d
descriptors:
  - {key: k, value: "bar*b", rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: k, value: "foo*bar*baz", rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: k, value: "/api*v1", rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: k, value: "a*", rate_limit: {unit: minute, requests_per_unit: 4}}
  - {key: k, value: "*z", rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: k, value: "abc*", rate_limit: {unit: minute, requests_per_unit: 6}}
  - {key: k, value: "abc*x*", rate_limit: {unit: minute, requests_per_unit: 7}}
  - {key: k, value: "barxb", rate_limit: {unit: minute, requests_per_unit: 8}}
  - {key: k, value: "m*n", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 9}}
  - {key: k, rate_limit: {unit: minute, requests_per_unit: 10}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Warnings) != 0 {
		t.Errorf("warnings %q, want none", d.Warnings)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatal(err)
	}
	dom := rs.Domain("d")
	for _, tt := range []struct {
		value string
		want  uint64 // the matched limit's amount
	}{
		{"barab", 1}, {"bar123b", 1}, {"barb", 1}, {"bar*b", 1},
		{"bara", 10}, {"xbarb", 10}, {"bab", 10}, // "bar" and "b" may not overlap
		{"barxb", 8}, // exact beats every pattern
		{"foobarbaz", 2}, {"foo1bar2baz", 2}, {"foobazbar", 10}, {"foobarba", 10},
		{"/apiv1", 3}, {"/api/x/v1", 3}, {"/api/v2", 10},
		{"a", 4}, {"ab", 4}, {"z", 5}, {"xyz", 5},
		{"abcd", 6},           // abc* (3 literal bytes) before a* (1)
		{"abcxd", 7},          // abc*x* (4) before abc* (3)
		{"az", 4},             // a* and *z both match: one literal byte each, the file's order
		{"mn", 9}, {"m-n", 9}, // share_threshold with a middle *
		{"", 10}, {"q", 10},
	} {
		r := dom.Match([]limit.Entry{{Key: "k", Value: tt.value}})
		got := uint64(0)
		if r != nil && r.RateLimit != nil {
			got = r.RateLimit.Amount
		}
		if got != tt.want {
			t.Errorf("k=%q matched a limit of %d, want %d", tt.value, got, tt.want)
		}
	}
	// Every value that m*n matches shares its pattern's counter.
	for _, v := range []string{"mn", "m-n", "mxyzn"} {
		_, shared := dom.MatchShared([]limit.Entry{{Key: "k", Value: v}})
		got := dom.SharedEntries([]limit.Entry{{Key: "k", Value: v}}, shared)
		if shared != 1 || got[0].Value != "m*n" {
			t.Errorf("k=%q: shared %b, counter entry %q; want the pattern m*n", v, shared, got[0].Value)
		}
	}
}

// TestMetadata: a descriptor's metadata loads as protobuf's Struct holds
// it (numbers as float64, other scalars as their text), aliases
// included; what a Struct cannot hold is refused with its path.
func TestMetadata(t *testing.T) {
	t.Parallel()
	d, err := Parse("rules.yaml", []byte(`domain: d
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
          weight: 3
          ratio: 0.5
          on: true
          none: null
          when: 2026-11-27
          tags: &tags [a, 1]
          nested: {deeper: {x: "2"}}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
        metadata: {again: *tags}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"name": "service_1", "weight": 3.0, "ratio": 0.5, "on": true, "none": nil, "when": "2026-11-27",
		"tags": []any{"a", 1.0}, "nested": map[string]any{"deeper": map[string]any{"x": "2"}},
	}
	kids := d.Descriptors[0].Children
	if diff := cmp.Diff(want, kids[0].Metadata); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"again": []any{"a", 1.0}}, kids[1].Metadata); diff != "" {
		t.Errorf("metadata through an alias (-want +got):\n%s", diff)
	}
	for _, tt := range []struct{ give, want string }{
		{"metadata: [a, b]", "rules.yaml:5: descriptors[0].metadata: want a mapping, got a list"},
		{"metadata: {x: .nan}", "rules.yaml:5: descriptors[0].metadata.x: .nan is not a number JSON can hold"},
		{"metadata: {x: 1, x: 2}", "rules.yaml:5: descriptors[0].metadata.x: repeated key"},
		{"metadata: {[a]: 1}", "rules.yaml:5: descriptors[0].metadata: a key must be a string, got a list"},
		{"metadata: " + strings.Repeat("{a: ", 18) + "1" + strings.Repeat("}", 18), "nested deeper than 16 levels"},
	} {
		_, err := Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    "+tt.give+"\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.give, err, tt.want)
		}
	}
}

// TestMetricEntries: detailed_metric, value_to_metric and share_threshold
// name a descriptor in metrics as envoyproxy/ratelimit names its stats.
func TestMetricEntries(t *testing.T) {
	t.Parallel()
	d, err := Parse("rules.yaml", []byte(`domain: d
descriptors:
  - {key: files, value: "files/*", share_threshold: true, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: wild, value: "foo*", rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: wildv, value: "foo*", value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: route
    value: "api/*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - {key: method, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: svc
    value_to_metric: true
    descriptors:
      - {key: method, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: plain
    descriptors:
      - {key: method, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: mid
    value: "a*z"
    share_threshold: true
    descriptors:
      - {key: id, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatal(err)
	}
	dom := rs.Domain("d")
	name := func(es []limit.Entry) string {
		var b strings.Builder
		for i, e := range es {
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e.Key)
			if e.Value != "" {
				b.WriteString("_" + e.Value)
			}
		}
		return b.String()
	}
	for _, tt := range []struct {
		give     []string // key, value pairs
		byValue  bool     // whether the rule reached names values at all
		detailed bool
		want     string
	}{
		// share_threshold wins even over detailed_metric: the pattern.
		{[]string{"files", "files/a.txt"}, false, true, "files_files/*"},
		// A wildcard without flags keeps its pattern; with value_to_metric the value.
		{[]string{"wild", "foobar"}, false, false, "wild_foo*"},
		{[]string{"wildv", "foobar"}, true, false, "wildv_foobar"},
		// share_threshold beats value_to_metric; a key-only child is its key.
		{[]string{"route", "api/v1", "method", "GET"}, true, false, "route_api/*.method"},
		// value_to_metric on a key-only parent names its value.
		{[]string{"svc", "billing", "method", "GET"}, true, false, "svc_billing.method"},
		// detailed_metric names every value.
		{[]string{"plain", "x", "method", "GET"}, false, true, "plain_x.method_GET"},
		{[]string{"mid", "abcz", "id", "7"}, true, false, "mid_a*z.id_7"},
	} {
		var es []limit.Entry
		for i := 0; i+1 < len(tt.give); i += 2 {
			es = append(es, limit.Entry{Key: tt.give[i], Value: tt.give[i+1]})
		}
		r := dom.Match(es)
		if r == nil {
			t.Fatalf("%v matched nothing", tt.give)
		}
		if r.ByValue() != tt.byValue || r.DetailedMetric != tt.detailed {
			t.Errorf("%v: ByValue %v, DetailedMetric %v; want %v, %v", tt.give, r.ByValue(), r.DetailedMetric, tt.byValue, tt.detailed)
		}
		if got := name(dom.MetricEntries(es, r.DetailedMetric)); got != tt.want {
			t.Errorf("%v: named %s, want %s", tt.give, got, tt.want)
		}
	}
}
