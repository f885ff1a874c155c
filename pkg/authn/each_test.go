package authn

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

// accepted names the test keys k accepts, each with its tenant and tier.
func accepted(k *Keys) string {
	var parts []string
	for i, key := range testKeys {
		if id, ok := k.Lookup(key); ok {
			parts = append(parts, fmt.Sprintf("%d:%s/%s", i, id.Tenant, id.Tier))
		}
	}
	return strings.Join(parts, " ")
}

// TestParseEach checks that a bad entry is left out and the rest of the
// file applies, removals included; with Parse, every one of these files
// is refused whole.
func TestParseEach(t *testing.T) {
	t.Parallel()
	type want struct {
		accepted string // as accepted gives it
		skipped  int
		problems string
	}
	tests := []struct {
		name string
		give string
		want want
	}{
		{
			name: "a good file",
			give: goodKeys,
			want: want{accepted: "0:acme/premium 1:acme/standard 2:beta/"},
		},
		{
			name: "a short key beside good ones",
			give: "keys:\n  - {key: " + keyAcme + ", tenant: acme}\n  - {key: short, tenant: acme}\n  - {key: " + keyBeta + ", tenant: beta}\n",
			want: want{accepted: "0:acme/ 2:beta/", skipped: 1,
				problems: "keys.yaml:3: keys[1].key: is shorter than 16 bytes, too easy to guess"},
		},
		{
			name: "a key disabled with a YAML 1.1 boolean stays out",
			give: "keys:\n  - {key: " + keyOff + ", tenant: acme, disabled: yes}\n  - {key: " + keyAcme + ", tenant: acme}\n",
			want: want{accepted: "0:acme/", skipped: 1,
				problems: "keys.yaml:2: keys[0].disabled: want true or false, got a string"},
		},
		{
			name: "a bad override leaves out its key, not a key without it",
			give: "keys:\n  - {key: " + keyCI + ", tenant: acme, limits: {tenant_requests: {amount: -1}}}\n  - {key: " + keyAcme + ", tenant: acme}\n",
			want: want{accepted: "0:acme/", skipped: 1,
				problems: "keys.yaml:2: keys[0].limits.tenant_requests.amount: -1 is negative"},
		},
		{
			name: "a bad tenant leaves out its keys",
			give: "tenants:\n  acme: {tier: [premium]}\n  beta: {tier: free}\nkeys:\n  - {key: " + keyAcme + ", tenant: acme}\n  - {key: " + keyCI + ", tenant: acme, tier: x}\n  - {key: " + keyBeta + ", tenant: beta}\n",
			want: want{accepted: "2:beta/free", skipped: 3, problems: `keys.yaml:2: tenants.acme.tier: want a string, got a list
keys.yaml:5: keys[0]: left out with its tenant acme (line 2)
keys.yaml:6: keys[1]: left out with its tenant acme (line 2)`},
		},
		{
			name: "a tenant listed twice is left out, both listings",
			give: "tenants:\n  acme: {tier: premium}\n  acme: {tier: free}\n  '': {tier: x}\nkeys:\n  - {key: " + keyAcme + ", tenant: acme}\n  - {key: " + keyBeta + ", tenant: beta}\n",
			want: want{accepted: "2:beta/", skipped: 4, problems: `keys.yaml:3: tenants.acme: repeated (first at line 2)
keys.yaml:4: tenants: a name is empty
keys.yaml:6: keys[0]: left out with its tenant acme (line 2)`},
		},
		{
			name: "a key listed twice, once disabled, is left out",
			give: "keys:\n  - {key: " + keyAcme + ", tenant: acme}\n  - {key: " + keyAcme + ", tenant: acme, disabled: true}\n  - {key: " + keyBeta + ", tenant: beta}\n",
			want: want{accepted: "2:beta/", skipped: 2,
				problems: "keys.yaml:3: keys[1]: the same key as keys[0] at line 2; a key may be listed once"},
		},
		{
			name: "a key listed three times, by key and by hash",
			give: "keys:\n  - {key: " + keyAcme + ", tenant: acme, disabled: true}\n  - {sha256: " + hashOf(keyAcme) + ", tenant: acme}\n  - {key: " + keyAcme + ", tenant: beta}\n",
			want: want{skipped: 3, problems: `keys.yaml:3: keys[1]: the same key as keys[0] at line 2; a key may be listed once
keys.yaml:4: keys[2]: the same key as keys[0] at line 2; a key may be listed once`},
		},
		{
			name: "a bad listing of a key keeps a good repeat out",
			give: "keys:\n  - {key: " + keyAcme + ", tenant: acme, disabled: maybe}\n  - {key: " + keyAcme + ", tenant: acme}\n",
			want: want{skipped: 2,
				problems: "keys.yaml:2: keys[0].disabled: want true or false, got a string\nkeys.yaml:3: keys[1]: the same key as keys[0] at line 2; a key may be listed once"},
		},
		{
			name: "an entry that is not a mapping",
			give: "keys:\n  - " + keyStranger + "\n  - {key: " + keyAcme + ", tenant: acme}\n",
			want: want{accepted: "0:acme/", skipped: 1,
				problems: "keys.yaml:2: keys[0]: want a mapping with keys sha256|key|tenant|tier|name|limits|disabled, got a string"},
		},
		{
			name: "an unknown field of an entry",
			give: "keys:\n  - {key: " + keyAcme + ", tenant: acme, " + keyStranger + ": x}\n  - {key: " + keyBeta + ", tenant: beta}\n",
			want: want{accepted: "2:beta/", skipped: 1,
				problems: "keys.yaml:2: keys[0]: unknown key (want one of sha256|key|tenant|tier|name|limits|disabled)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := ParseEach("keys.yaml", []byte(tt.give))
			if err != nil {
				t.Fatalf("ParseEach: %v", err)
			}
			got := want{accepted: accepted(k), skipped: k.Skipped()}
			if err := k.Problems(); err != nil {
				got.problems = err.Error()
				noSecret(t, "problems", got.problems)
			}
			if got != tt.want {
				t.Errorf("ParseEach = %+v\nwant %+v", got, tt.want)
			}
			noSecret(t, "String", k.String())
			if tt.want.skipped > 0 {
				if _, err := Parse("keys.yaml", []byte(tt.give)); err == nil {
					t.Errorf("Parse accepts the file; it must stay strict")
				}
			}
		})
	}
}

// TestParseEachRefuses checks that a file that cannot be used at all is
// refused whole, with the problems Parse gives.
func TestParseEachRefuses(t *testing.T) {
	t.Parallel()
	var many strings.Builder
	many.WriteString("keys:\n  - {key: " + keyAcme + ", tenant: acme}\n")
	for range 60 {
		many.WriteString("  - {key: short, tenant: acme}\n")
	}
	tests := []struct {
		name string
		give string
		want string // a line of the error
	}{
		{name: "empty", give: "", want: "keys.yaml:1: file is empty; a keys file needs at least keys: []"},
		{name: "not YAML", give: "keys: [\n", want: "keys.yaml:1: invalid YAML: did not find expected node content"},
		{name: "a bare key", give: keyAcme + "\n", want: "keys.yaml:1: want a mapping with keys tenants|keys, got a string"},
		{name: "a misspelt tenants", give: "tenant: {acme: {tier: x}}\nkeys: [{key: " + keyAcme + ", tenant: acme}]\n", want: "keys.yaml:1: unknown key; did you mean tenants?"},
		{name: "tenants not a mapping", give: "tenants: [acme]\nkeys: [{key: " + keyAcme + ", tenant: acme}]\n", want: "keys.yaml:1: tenants: want a mapping of tenant names to their defaults, got a list"},
		{name: "keys not a list", give: "keys: {key: " + keyAcme + "}\n", want: "keys.yaml:1: keys: want a list of keys, got a mapping"},
		{name: "keys missing", give: "tenants: {}\n", want: "keys.yaml:1: keys is required"},
		{name: "too many problems", give: many.String(), want: "keys.yaml: stopped after the first 50 problems"},
		{name: "too large", give: "keys: []\n# " + strings.Repeat("x", config.MaxFileBytes), want: "keys.yaml: file is larger than 4 MiB, the most it may hold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := ParseEach("keys.yaml", []byte(tt.give))
			if err == nil {
				t.Fatalf("ParseEach = %v, want an error", k)
			}
			if !strings.Contains("\n"+err.Error()+"\n", "\n"+tt.want+"\n") {
				t.Errorf("error:\n%s\nwant a line:\n%s", err, tt.want)
			}
			noSecret(t, "error", err.Error())
			_, strict := Parse("keys.yaml", []byte(tt.give))
			if strict == nil || strict.Error() != err.Error() {
				t.Errorf("Parse error:\n%v\nwant the same as ParseEach's", strict)
			}
		})
	}
}
