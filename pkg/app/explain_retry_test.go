package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestExplainRetryBudget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     string // the rules file's retry_budget lines
		wantText string // a line of the text answer; "" for none
		wantJSON *retryBudgetExplain
	}{
		{
			name:     "defaults",
			give:     "retry_budget: {}\n",
			wantText: "retry budget (RULES:7): if admitted, x-envoy-max-retries up to 3; 0 while the model's breaker is open or half-open, in-flight pressure >= 0.9 or the queue wait > 2s; at most 1 above 0.5 failures, 2 above 0.2\n",
			wantJSON: &retryBudgetExplain{Source: "RULES:7", Max: 3, MaxPressure: 0.9, MaxQueueWait: "2s", ErrorRate: 0.2, HighErrorRate: 0.5},
		},
		{
			name:     "set",
			give:     "retry_budget:\n  max: 1\n  max_queue_wait: 500ms\n",
			wantText: "retry budget (RULES:8): if admitted, x-envoy-max-retries up to 1; 0 while the model's breaker is open or half-open, in-flight pressure >= 0.9 or the queue wait > 500ms; at most 1 above 0.5 failures, 2 above 0.2\n",
			wantJSON: &retryBudgetExplain{Source: "RULES:8", Max: 1, MaxPressure: 0.9, MaxQueueWait: "500ms", ErrorRate: 0.2, HighErrorRate: 0.5},
		},
		{name: "none", give: ""},
		{name: "disabled", give: "retry_budget: {enabled: false}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "rules.yaml")
			rules := "domain: ai\ndescriptors:\n  - key: model\n    rate_limit: {unit: minute, requests_per_unit: 10}\n\n\n" + tt.give
			if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"--config", path, "--domain", "ai", "--descriptor", "model=m"}
			code, out, errOut := runExplainCmd(t, args...)
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var line string
			for _, l := range strings.SplitAfter(out, "\n") {
				if strings.HasPrefix(l, "retry budget") {
					line = strings.ReplaceAll(l, path, "RULES")
				}
			}
			if line != tt.wantText {
				t.Errorf("text line:\n%q\nwant:\n%q\nin:\n%s", line, tt.wantText, out)
			}
			got := explainJSON(t, args...).RetryBudget
			if got != nil {
				got.Source = strings.ReplaceAll(got.Source, path, "RULES")
			}
			if diff := cmp.Diff(tt.wantJSON, got); diff != "" {
				t.Errorf("json retry_budget (-want +got):\n%s", diff)
			}
		})
	}
}
