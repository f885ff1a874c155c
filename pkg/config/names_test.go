package config

import (
	"errors"
	"strings"
	"testing"
)

// TestParseNames checks the words a rule file's names are refused with:
// the domain, tiers.key and a descriptor key, each empty and too long.
// The keys file and the authz config check their names with the same
// walker.name, and test its words there too.
func TestParseNames(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 257)
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "empty domain", give: "domain: ''\n", want: "r.yaml:1: domain: is empty"},
		{name: "long domain", give: "domain: " + long + "\n", want: "r.yaml:1: domain: is 257 bytes, more than 256"},
		{
			name: "empty tiers key",
			give: "domain: d\ntiers: {key: '', default: free, plans: {free: 1}}\n",
			want: "r.yaml:2: tiers.key: is empty",
		},
		{
			name: "long tiers key",
			give: "domain: d\ntiers: {key: " + long + ", default: free, plans: {free: 1}}\n",
			want: "r.yaml:2: tiers.key: is 257 bytes, more than 256",
		},
		{
			name: "long descriptor key",
			give: "domain: d\ndescriptors:\n  - key: " + long + "\n",
			want: "r.yaml:3: descriptors[0].key: is 257 bytes, more than 256",
		},
		{
			name: "descriptor key not a string",
			give: "domain: d\ndescriptors:\n  - key: [a]\n",
			want: "r.yaml:3: descriptors[0].key: want a string, got a list",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("r.yaml", []byte(tt.give))
			var probs Errors
			if d != nil || !errors.As(err, &probs) {
				t.Fatalf("Parse = %v, %v (%T), want nil and Errors", d, err, err)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("Parse error:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}
