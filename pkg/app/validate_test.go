package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateAuthz: validate checks the authz config and its keys file,
// alone and against the rules, and --strict refuses warnings.
func TestValidateAuthz(t *testing.T) {
	t.Parallel()
	const rules = "domain: inference\ntiers: {key: tier, default: free, plans: {free: 1, premium: 3}}\n" +
		"descriptors:\n  - {key: tenant, rate_limit: {name: tenant_requests, unit: minute, requests_per_unit: 5}}\n"
	const keys = "keys:\n  - {key: \"0123456789abcdef-key\", tenant: acme, tier: premium}\n"
	tests := []struct {
		name       string
		authz      string
		keys       string
		rules      string
		args       []string
		want       int
		wantStderr string
		wantStdout string
	}{
		{
			name:       "valid together",
			authz:      "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			want:       ExitOK,
			wantStdout: "ok: 1 domains; authz config AUTHZ: domain inference, 1 descriptors, 1 keys",
		},
		{
			name:       "a misspelt domain",
			authz:      "domain: inferense\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			want:       ExitError,
			wantStderr: `AUTHZ:1: domain: "inferense" is not a domain of the rules (they declare inference)`,
		},
		{
			name:       "a keys file naming an unknown tier",
			authz:      "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			keys:       "keys:\n  - {key: \"0123456789abcdef-key\", tenant: acme, tier: gold}\n",
			want:       ExitError,
			wantStderr: `keys.yaml:2: keys[0].tier: tier "gold" is not a plan of domain "inference"`,
		},
		{
			name:       "a bad keys file",
			authz:      "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			keys:       "keys:\n  - {key: short, tenant: acme}\n",
			want:       ExitError,
			wantStderr: `keys.yaml:2: keys[0].key: is shorter than 16 bytes`,
		},
		{
			name:       "a warning loads",
			authz:      "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			rules:      "domain: inference\ndescriptors:\n  - {key: tenant, unit: second, rate_limit: {unit: minute, requests_per_unit: 5}}\n",
			keys:       "keys: []\n",
			want:       ExitOK,
			wantStderr: "descriptors[0].unit: warning: ignored",
		},
		{
			name:       "--strict refuses it",
			authz:      "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			rules:      "domain: inference\ndescriptors:\n  - {key: tenant, unit: second, rate_limit: {unit: minute, requests_per_unit: 5}}\n",
			keys:       "keys: []\n",
			args:       []string{"--strict"},
			want:       ExitError,
			wantStderr: "tollgate validate: 1 warnings, refused under --strict",
		},
		{
			name:       "--strict refuses a keys file's warning",
			authz:      "domain: inference\nkeys_file: keys.yaml\ndescriptors:\n  - [{key: tenant, from: tenant}]\n",
			rules:      "domain: inference\ndescriptors:\n  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 5}}\n",
			args:       []string{"--strict"},
			want:       ExitError,
			wantStderr: `keys.yaml:2: keys[0].tier: warning: domain "inference" has no tiers, so tier "premium" changes nothing`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "rules"), 0o755); err != nil {
				t.Fatal(err)
			}
			r, k := tt.rules, tt.keys
			if r == "" {
				r = rules
			}
			if k == "" {
				k = keys
			}
			writeFile(t, filepath.Join(dir, "rules", "rules.yaml"), r)
			writeFile(t, filepath.Join(dir, "keys.yaml"), k)
			authz := filepath.Join(dir, "authz.yaml")
			writeFile(t, authz, tt.authz)
			stdout, stderr := &buffer{}, &buffer{}
			a := &App{Stdout: stdout, Stderr: stderr, LookupEnv: env(nil)}
			args := append(append([]string{"validate", "--authz-config", authz}, tt.args...), filepath.Join(dir, "rules"))
			if code := a.Run(t.Context(), args); code != tt.want {
				t.Fatalf("validate = %d, want %d:\n%s", code, tt.want, stderr)
			}
			for out, want := range map[*buffer]string{stdout: tt.wantStdout, stderr: tt.wantStderr} {
				want = strings.ReplaceAll(want, "AUTHZ", authz)
				if !strings.Contains(out.String(), want) {
					t.Errorf("output %q lacks %q", out, want)
				}
			}
		})
	}
}
