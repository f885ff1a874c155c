package extauthz

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const againstRules = `domain: inference
tiers: {key: tier, default: free, plans: {free: 1, premium: 3}}
descriptors:
  - key: tenant
    rate_limit: {name: tenant_requests, unit: minute, requests_per_unit: 60}
    descriptors:
      - key: model
        value: gpt-*
        token_limit: {name: tenant_gpt_tokens, unit: hour, tokens_per_unit: 100000}
  - key: route
    value: /v1/chat
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: group
    descriptors:
      - key: user
`

// TestAgainst: the settings and the keys file are checked against the
// rules they would be served with, each problem with file:line: path.
func TestAgainst(t *testing.T) {
	t.Parallel()
	d, err := config.Parse("rules.yaml", []byte(againstRules))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name        string
		authz, keys string
		want        []string // problems, in order
		warn        []string
	}{
		{
			name: "all known",
			authz: `domain: inference
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tier, from: tier}, {key: tenant, from: tenant}, {key: model, from: model}]
  - [{key: route, from: "literal:/v1/chat"}]
`,
			keys: "tenants: {acme: {tier: premium, limits: {tenant_requests: {amount: 5}}}}\nkeys: []\n",
		},
		{
			name:  "a misspelt domain",
			authz: "domain: inferense\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			want:  []string{`authz.yaml:1: domain: "inferense" is not a domain of the rules (they declare inference): every Check would be admitted with no limit; did you mean inference?`},
		},
		{
			name: "descriptors no rule matches",
			authz: `domain: inference
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: model, from: model}]
  - [{key: route, from: "literal:/v2/chat"}]
  - [{key: tenant, from: tenant}, {key: model, from: "literal:claude"}]
  - [{key: group, from: "header:x-group"}, {key: user, from: "header:x-user"}]
  - [{key: tier, from: tier}]
`,
			want: []string{
				`authz.yaml:5: descriptors[1]: (model) matches no rule of domain "inference" (rules.yaml) with a limit: it would limit nothing`,
				`authz.yaml:6: descriptors[2]: (route) matches no rule`,
				`authz.yaml:7: descriptors[3]: (tenant, model) matches no rule`,
				`authz.yaml:8: descriptors[4]: (group, user) matches no rule`,
				`authz.yaml:9: descriptors[5]: (tier) matches no rule`,
			},
		},
		{
			name:  "keys naming unknown tiers and limits",
			authz: "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			keys: `tenants:
  acme: {tier: premum}
keys:
  - key: "0123456789abcdef-1"
    tenant: acme
    limits: {tenant_request: {amount: 1}, nothing_like_it: {amount: 2}}
`,
			want: []string{
				`keys.yaml:2: tenants.acme.tier: tier "premum" is not a plan of domain "inference" (free, premium): its keys would get the default plan, free; did you mean premium?`,
				`keys.yaml:6: keys[0].limits.tenant_request: "tenant_request" names no rate_limit or token_limit of domain "inference" (named: tenant_requests, tenant_gpt_tokens): the override would change nothing; did you mean tenant_requests?`,
				`keys.yaml:6: keys[0].limits.nothing_like_it: "nothing_like_it" names no rate_limit`,
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			write := func(name, body string) string {
				p := filepath.Join(dir, name)
				if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			}
			keys := tt.keys
			if keys == "" {
				keys = "keys: []\n"
			}
			write("keys.yaml", keys)
			s, err := LoadSettings(write("authz.yaml", tt.authz))
			if err != nil {
				t.Fatal(err)
			}
			problems, warnings := s.Against(rs)
			if len(problems) != len(tt.want) {
				t.Fatalf("problems:\n%v\nwant %d", problems, len(tt.want))
			}
			for i, p := range problems {
				got := strings.ReplaceAll(p.String(), dir+string(filepath.Separator), "")
				if !strings.HasPrefix(got, tt.want[i]) {
					t.Errorf("problem %d:\n got %s\nwant %s...", i, got, tt.want[i])
				}
			}
			if len(warnings) != len(tt.warn) {
				t.Errorf("warnings %q, want %q", warnings, tt.warn)
			}
		})
	}
}
