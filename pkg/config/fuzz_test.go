package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// FuzzParse feeds Parse arbitrary bytes. It must never panic, and its
// answer must be one of two things: a domain that indexes cleanly, or
// Errors in which every problem names the file.
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/good/*.yaml", "testdata/bad/*.yaml", "testdata/bad/*/*.yaml", "testdata/retrybudget/*.yaml", "../../config/*.yaml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	for _, s := range []string{
		"domain: d",
		"domain: d\ndescriptors: [{key: k, value: v*, rate_limit: {unlimited: true}}]",
		"domain: d\ndescriptors: [&a {key: k, descriptors: [*a]}]",
		"domain: d\ndescriptors: [{key: k, token_limit: {unit: week, tokens_per_unit: 1, algorithm: token_bucket, burst: 2}}]",
		"domain: d\n---\n",
		"{domain: [d]}",
		"domain: d\ndescriptors: [{key: k, rate_limit: {unit: year, unit_multiplier: 293, requests_per_unit: 9007199254740993}}]",
		"domain: d\ntiers: {key: t, default: f, plans: {f: 1}}\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}, fair_share: {key: u, weights: plan, credit: 1}}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse("f.yaml", data)
		if err != nil {
			var probs Errors
			if !errors.As(err, &probs) || len(probs) == 0 || len(probs) > maxProblems+1 {
				t.Fatalf("Parse error = %#v, want 1 to %d Problems", err, maxProblems+1)
			}
			for _, p := range probs {
				if p.File != "f.yaml" || p.Msg == "" || p.Line < 0 {
					t.Fatalf("problem %+v, want File f.yaml, a message and a line >= 0", p)
				}
			}
			if d != nil {
				t.Fatalf("Parse returned a domain with its error")
			}
			return
		}
		if d == nil || d.Name == "" || d.Source != "f.yaml" {
			t.Fatalf("Parse = %+v, want a named domain from f.yaml", d)
		}
		// Parse checks everything NewRuleSet does, and more.
		if _, err := limit.NewRuleSet(d); err != nil {
			t.Fatalf("NewRuleSet after a clean Parse: %v", err)
		}
	})
}
