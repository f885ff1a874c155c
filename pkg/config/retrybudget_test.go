package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestLoadRetryBudget(t *testing.T) {
	t.Parallel()
	def := limit.DefaultRetryBudget()
	def.Source = "testdata/retrybudget/defaults.yaml:5"
	tests := []struct {
		name string
		give string
		want *limit.RetryBudget
	}{
		{name: "every field", give: "good.yaml", want: &limit.RetryBudget{
			Max: 2, MaxPressure: 0.8, MaxQueueWait: 1500 * time.Millisecond, ErrorRate: 0.1, HighErrorRate: 0.4,
			Source: "testdata/retrybudget/good.yaml:6",
		}},
		{name: "an empty section is the defaults", give: "defaults.yaml", want: &def},
		{name: "disabled", give: "disabled.yaml", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs, err := Load(filepath.Join("testdata", "retrybudget", tt.give))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			got := rs.Domain("inference").RetryBudget
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("RetryBudget (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadRetryBudgetBad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want string
	}{
		{
			name: "every field out of range",
			give: "bad_ranges.yaml",
			want: `testdata/retrybudget/bad_ranges.yaml:3: retry_budget.max: 4 is more than 3
testdata/retrybudget/bad_ranges.yaml:4: retry_budget.max_pressure: 1.5 is not in (0,1]; pressure is a fraction of capacity
testdata/retrybudget/bad_ranges.yaml:5: retry_budget.max_queue_wait: 0s is not in (0s,1h]
testdata/retrybudget/bad_ranges.yaml:6: retry_budget.error_rate: 1 is not in (0,1); it is a share of the upstream's requests
testdata/retrybudget/bad_ranges.yaml:7: retry_budget.high_error_rate: -0.1 is not in (0,1); it is a share of the upstream's requests`,
		},
		{
			name: "error_rate above high_error_rate",
			give: "bad_order.yaml",
			want: `testdata/retrybudget/bad_order.yaml:3: retry_budget.error_rate: 0.6 is above high_error_rate 0.3; the budget falls to 2 before it falls to 1`,
		},
		{
			name: "unknown key",
			give: "bad_key.yaml",
			want: `testdata/retrybudget/bad_key.yaml:3: retry_budget.retries: unknown key (want one of enabled|max|max_pressure|max_queue_wait|error_rate|high_error_rate)`,
		},
		{
			name: "not a mapping",
			give: "bad_kind.yaml",
			want: `testdata/retrybudget/bad_kind.yaml:2: retry_budget: want a mapping with keys enabled|max|max_pressure|max_queue_wait|error_rate|high_error_rate, got a list`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantLoadErrors(t, filepath.Join("testdata", "retrybudget", tt.give), tt.want)
		})
	}
}

// TestRetryBudgetDocExample keeps the example in docs/retry-budget.md
// loadable, and saying what the defaults are.
func TestRetryBudgetDocExample(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/retry-budget.md")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(b), "```yaml\n")
	if !ok {
		t.Fatal("docs/retry-budget.md has no yaml block")
	}
	body, _, ok = strings.Cut(body, "```")
	if !ok {
		t.Fatal("docs/retry-budget.md: the yaml block does not end")
	}
	d, err := Parse("retry-budget.md", []byte(body))
	if err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	if d.RetryBudget == nil {
		t.Fatal("the example has no retry budget")
	}
	want := limit.DefaultRetryBudget()
	want.Source = d.RetryBudget.Source
	if diff := cmp.Diff(&want, d.RetryBudget); diff != "" {
		t.Errorf("the example's values are not the defaults it claims (-defaults +example):\n%s", diff)
	}
}
