package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// uncomment turns on the commented-out section of a shipped example that
// starts with the line "# "+key+":": it drops the "# " of that line and
// of each indented line after it, as the file's comment tells a reader.
// It fails the test when the file has no such section.
func uncomment(tb testing.TB, src, key string) string {
	tb.Helper()
	lines := strings.Split(src, "\n")
	found := false
	for i := 0; i < len(lines); i++ {
		if lines[i] != "# "+key+":" {
			continue
		}
		found = true
		lines[i] = key + ":"
		for i++; i < len(lines) && strings.HasPrefix(lines[i], "#   "); i++ {
			lines[i] = strings.TrimPrefix(lines[i], "# ")
		}
	}
	if !found {
		tb.Fatalf("no commented-out %s: section", key)
	}
	return strings.Join(lines, "\n")
}

// TestExampleCommentedSections: the retry_budget and queue sections that
// config/inference.yaml ships commented out parse, once uncommented as its
// comments say, to what the comments promise.
func TestExampleCommentedSections(t *testing.T) {
	t.Parallel()
	const path = "../../config/inference.yaml"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off, err := Parse(path, raw)
	if err != nil {
		t.Fatal(err)
	}
	if off.RetryBudget != nil || off.Queue != nil {
		t.Fatalf("as shipped: retry budget %+v, queue %+v; want both off", off.RetryBudget, off.Queue)
	}
	tests := []struct {
		name string
		give []string // the sections uncommented
		want func(t *testing.T, d *limit.Domain)
	}{
		{name: "retry_budget", give: []string{"retry_budget"}, want: func(t *testing.T, d *limit.Domain) {
			want := limit.DefaultRetryBudget()
			if d.RetryBudget == nil {
				t.Fatal("no retry budget")
			}
			want.Source = d.RetryBudget.Source
			if diff := cmp.Diff(want, *d.RetryBudget); diff != "" {
				t.Errorf("retry budget, want the defaults the comment names (-want +got):\n%s", diff)
			}
		}},
		{name: "queue", give: []string{"queue"}, want: func(t *testing.T, d *limit.Domain) {
			if d.Queue == nil {
				t.Fatal("no queue")
			}
			type tier struct {
				wait time.Duration
				rank int
				ok   bool
				skip bool
			}
			for name, w := range map[string]tier{
				"premium":  {wait: 2 * time.Second, rank: 0, ok: true},
				"standard": {wait: time.Second, rank: 1, ok: true},
				"free":     {skip: true, rank: 2}, // a skipping tier does not wait
			} {
				qt, rank, ok := d.Queue.For(name)
				if got := (tier{wait: qt.MaxWait, rank: rank, ok: ok, skip: qt.Skip}); got != w {
					t.Errorf("tier %s: %+v, want %+v", name, got, w)
				}
			}
			if got := d.Queue.PollEvery(); got != 250*time.Millisecond {
				t.Errorf("poll %v, want 250ms", got)
			}
		}},
		{name: "both", give: []string{"retry_budget", "queue"}, want: func(t *testing.T, d *limit.Domain) {
			if d.RetryBudget == nil || d.Queue == nil {
				t.Errorf("retry budget %+v, queue %+v; want both", d.RetryBudget, d.Queue)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := string(raw)
			for _, key := range tt.give {
				src = uncomment(t, src, key)
			}
			d, err := Parse(path, []byte(src))
			if err != nil {
				t.Fatalf("uncommented %v: %v", tt.give, err)
			}
			tt.want(t, d)
		})
	}
}
