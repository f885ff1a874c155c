package extauthz

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
)

func TestParseSettings(t *testing.T) {
	t.Parallel()
	tenant := Entry{Key: "tenant", Source: Source{Kind: FromTenant}}
	tests := []struct {
		name string
		give string
		want *Settings
	}{
		{
			name: "minimal: defaults",
			give: "domain: ai\nkeys_file: keys.yaml\ndescriptors: [[{key: tenant, from: tenant}]]\n",
			want: &Settings{
				Source: "dir/authz.yaml", Domain: "ai", KeysFile: "dir/keys.yaml",
				APIKeyHeaders: []string{"authorization", "x-api-key"}, RequireAPIKey: true,
				ModelBodyField: "model", Descriptors: [][]Entry{{tenant}},
				CharsPerToken: 4, DefaultMaxTokens: 256, MaxBodyBytes: 1 << 20,
				ImageTokens: [imageDetails]uint64{85, 1445, 1445},
			},
		},
		{
			name: "everything",
			give: `
domain: inference
keys_file: /etc/tollgate/keys.yaml
api_key_headers: [X-Api-Key]
require_api_key: false
trusted_headers: {tenant: X-Tenant-ID, tier: x-tier}
model: {body_field: engine, header: X-Model}
descriptors:
  - [{key: tenant, from: tenant}, {key: tier, from: tier}]
  - [{key: model, from: model}, {key: path, from: path}, {key: method, from: method}]
  - [{key: team, from: "header:X-Team"}, {key: plan, from: "literal:gold: 1"}]
estimate: {chars_per_token: 3.5, default_max_tokens: 0, max_body_bytes: 65536, partial_body: estimate, image_tokens: {low: 10, auto: 0}}
usage_header: X-Usage-Total-Tokens
`,
			want: &Settings{
				Source: "dir/authz.yaml", Domain: "inference", KeysFile: "/etc/tollgate/keys.yaml",
				APIKeyHeaders: []string{"x-api-key"}, TenantHeader: "x-tenant-id", TierHeader: "x-tier",
				ModelBodyField: "engine", ModelHeader: "x-model",
				Descriptors: [][]Entry{
					{tenant, {Key: "tier", Source: Source{Kind: FromTier}}},
					{{Key: "model", Source: Source{Kind: FromModel}}, {Key: "path", Source: Source{Kind: FromPath}}, {Key: "method", Source: Source{Kind: FromMethod}}},
					{{Key: "team", Source: Source{Kind: FromHeader, Arg: "x-team"}}, {Key: "plan", Source: Source{Kind: FromLiteral, Arg: "gold: 1"}}},
				},
				CharsPerToken: 3.5, DefaultMaxTokens: 0, MaxBodyBytes: 65536, PartialBody: PartialEstimate, UsageHeader: "x-usage-total-tokens",
				ImageTokens: [imageDetails]uint64{ImageLow: 10, ImageHigh: 1445, ImageAuto: 0},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseSettings("dir/authz.yaml", []byte(tt.give))
			if err != nil {
				t.Fatalf("ParseSettings: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreUnexported(authn.Keys{}, Settings{})); diff != "" {
				t.Errorf("ParseSettings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseSettingsRejects: one bad config per failure mode, with the
// exact message an operator reads.
func TestParseSettingsRejects(t *testing.T) {
	t.Parallel()
	const desc = "descriptors: [[{key: tenant, from: tenant}]]\n"
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "empty", give: "", want: "authz.yaml:1: file is empty; an authz config needs at least a domain and descriptors"},
		{name: "not YAML", give: "domain: [", want: "authz.yaml:1: invalid YAML: did not find expected node content"},
		{name: "no domain", give: "keys_file: k\n" + desc, want: "authz.yaml:1: domain is required"},
		{name: "empty domain", give: "domain: ''\nkeys_file: k\n" + desc, want: "authz.yaml:1: domain: is empty"},
		{name: "long domain", give: "domain: " + strings.Repeat("d", 257) + "\nkeys_file: k\n" + desc, want: "authz.yaml:1: domain: is 257 bytes, more than 256"},
		{name: "empty entry key", give: "domain: ai\nkeys_file: k\ndescriptors: [[{key: '', from: tenant}]]\n", want: "authz.yaml:3: descriptors[0][0].key: is empty"},
		{name: "long entry key", give: "domain: ai\nkeys_file: k\ndescriptors: [[{key: " + strings.Repeat("k", 257) + ", from: tenant}]]\n",
			want: "authz.yaml:3: descriptors[0][0].key: is 257 bytes, more than 256"},
		{name: "unknown key", give: "domain: ai\nkeys_file: k\nrequire_api_keys: true\n" + desc, want: "authz.yaml:3: require_api_keys: unknown key; did you mean require_api_key?"},
		{name: "no keys file while keys are required", give: "domain: ai\n" + desc, want: "authz.yaml:1: keys_file is required while require_api_key is true (the default)"},
		{name: "trusted mode without a tenant header", give: "domain: ai\nrequire_api_key: false\n" + desc,
			want: "authz.yaml:1: trusted_headers.tenant is required when require_api_key is false: a call without a key takes its tenant from it"},
		{name: "no descriptors", give: "domain: ai\nkeys_file: k\n", want: "authz.yaml:1: descriptors is required"},
		{name: "descriptors not a list", give: "domain: ai\nkeys_file: k\ndescriptors: {a: b}\n", want: "authz.yaml:3: descriptors: want a list of descriptors (each a list of {key, from}), got a mapping"},
		{name: "descriptor not a list", give: "domain: ai\nkeys_file: k\ndescriptors: [{key: tenant, from: tenant}]\n", want: "authz.yaml:3: descriptors[0]: want a list of entries {key, from}, got a mapping"},
		{name: "empty descriptor", give: "domain: ai\nkeys_file: k\ndescriptors: [[]]\n", want: "authz.yaml:3: descriptors[0]: want 1 to 32 entries, got 0"},
		{name: "unknown source", give: "domain: ai\nkeys_file: k\ndescriptors: [[{key: tenant, from: user}]]\n",
			want: `authz.yaml:3: descriptors[0][0].from: "user" is not one of tenant|tier|model|path|method|header:NAME|literal:VALUE`},
		{name: "bad header source", give: "domain: ai\nkeys_file: k\ndescriptors: [[{key: h, from: \"header:a b\"}]]\n", want: `authz.yaml:3: descriptors[0][0].from: "a b" is not a header name`},
		{name: "empty literal", give: "domain: ai\nkeys_file: k\ndescriptors: [[{key: h, from: \"literal:\"}]]\n", want: `authz.yaml:3: descriptors[0][0].from: a literal value is empty`},
		{name: "entry without from", give: "domain: ai\nkeys_file: k\ndescriptors: [[{key: tenant}]]\n", want: "authz.yaml:3: descriptors[0][0]: from is required"},
		{name: "bad chars_per_token", give: "domain: ai\nkeys_file: k\n" + desc + "estimate: {chars_per_token: 0}\n", want: `authz.yaml:4: estimate.chars_per_token: want a number greater than 0 and at most 1000, got "0"`},
		{name: "bad max_body_bytes", give: "domain: ai\nkeys_file: k\n" + desc + "estimate: {max_body_bytes: 0}\n", want: "authz.yaml:4: estimate.max_body_bytes: 0 is less than 1"},
		{name: "unknown partial_body", give: "domain: ai\nkeys_file: k\n" + desc + "estimate: {partial_body: allow}\n", want: `authz.yaml:4: estimate.partial_body: "allow" is not one of refuse|estimate`},
		{name: "partial_body not a string", give: "domain: ai\nkeys_file: k\n" + desc + "estimate: {partial_body: [refuse]}\n", want: "authz.yaml:4: estimate.partial_body: want a string, got a list"},
		{name: "bad header name", give: "domain: ai\nkeys_file: k\n" + desc + "usage_header: \"x usage\"\n", want: `authz.yaml:4: usage_header: "x usage" is not a header name`},
		{name: "no api key headers", give: "domain: ai\nkeys_file: k\n" + desc + "api_key_headers: []\n", want: "authz.yaml:4: api_key_headers: want 1 to 16 header names, got 0"},
		{name: "require_api_key not a bool", give: "domain: ai\nkeys_file: k\n" + desc + "require_api_key: maybe\n", want: `authz.yaml:4: require_api_key: want true or false, got the string "maybe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseSettings("authz.yaml", []byte(tt.give))
			var errs config.Errors
			if !errors.As(err, &errs) {
				t.Fatalf("ParseSettings error = %v, want config.Errors", err)
			}
			if err.Error() != tt.want {
				t.Errorf("ParseSettings error:\n got %s\nwant %s", err, tt.want)
			}
		})
	}
}

func writeFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "authz.yaml")
	writeFile(t, path, testSettings)
	writeFile(t, filepath.Join(dir, "keys.yaml"), testKeys)
	s, err := LoadSettings(path)
	if err != nil {
		t.Fatalf("LoadSettings: %v", err)
	}
	if id, ok := s.Keys.Lookup(keyAcme); !ok || id.Tenant != "acme" || s.KeysFile != filepath.Join(dir, "keys.yaml") {
		t.Errorf("LoadSettings: keys %v from %s, lookup = %+v %v", s.Keys, s.KeysFile, id, ok)
	}

	// A bad keys file is reported with its own name and line.
	writeFile(t, filepath.Join(dir, "keys.yaml"), "keys:\n  - {tenant: acme}\n")
	_, err = LoadSettings(path)
	if err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "keys.yaml")+":2: keys[0]: sha256 or key is required") {
		t.Errorf("LoadSettings with a bad keys file: %v", err)
	}
	if _, err := LoadSettings(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "load authz config") {
		t.Errorf("LoadSettings of a missing file: %v", err)
	}
}

// TestExampleConfig loads config/authz, which `make run` serves.
func TestExampleConfig(t *testing.T) {
	t.Parallel()
	s, err := LoadSettings(filepath.Join("..", "..", "config", "authz", "authz.yaml"))
	if err != nil {
		t.Fatalf("LoadSettings: %v", err)
	}
	if s.Keys.Len() == 0 || s.Domain != "inference" {
		t.Errorf("example: domain %q, %v", s.Domain, s.Keys)
	}
	// config.Load reads config/ without recursing, so the authz files
	// there are never taken for rules.
	rs, err := config.Load(filepath.Join("..", "..", "config"))
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	if rs.Domain("inference") == nil {
		t.Error("config.Load lost the inference rules")
	}
}

// FuzzParseSettings: an authz config is outside input; any bytes give
// settings or a config.Errors, never a panic.
func FuzzParseSettings(f *testing.F) {
	f.Add([]byte(testSettings))
	f.Add([]byte(trustedSettings))
	f.Add([]byte("domain: ai\ndescriptors: [[{key: a, from: \"header:x\"}, {key: b, from: \"literal:y\"}]]\nestimate: {chars_per_token: 1e-9}\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSettings("authz.yaml", data)
		if err != nil {
			var errs config.Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not config.Errors: %v", err, err)
			}
			return
		}
		if s.Domain == "" || len(s.Descriptors) == 0 || s.CharsPerToken <= 0 || s.MaxBodyBytes <= 0 {
			t.Fatalf("accepted incomplete settings %+v", s)
		}
	})
}
