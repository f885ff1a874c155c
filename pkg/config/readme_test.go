package config

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeRules keeps the rule example in README.md loadable: a reader
// copies it first.
func TestReadmeRules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Rules")
	if i < 0 {
		t.Fatal("README.md has no ## Rules section")
	}
	start := strings.Index(s[i:], "```yaml\n")
	if start < 0 {
		t.Fatal("README.md ## Rules has no yaml block")
	}
	body := s[i+start+len("```yaml\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		t.Fatal("unterminated yaml block")
	}
	d, err := Parse("README.md", []byte(body[:end]))
	if err != nil {
		t.Fatalf("README rule example does not load:\n%v", err)
	}
	if d.Name != "inference" || len(d.Descriptors) == 0 || d.Tiers == nil {
		t.Fatalf("parsed %q with %d descriptors and tiers %v, want the tiers documented too", d.Name, len(d.Descriptors), d.Tiers)
	}
}
