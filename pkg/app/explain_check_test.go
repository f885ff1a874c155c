package app

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExplainCheck: explain with --authz-config runs the Check a request
// would get on a fresh store and prints who the key is (never the key),
// the descriptors, the estimate, the rules' explanation and the answer.
func TestExplainCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), `domain: e2e
tiers: {key: tier, default: free, plans: {free: 1, premium: 3}}
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 1000, name: tokens}
`)
	authzDir := filepath.Join(dir, "authz")
	if err := os.Mkdir(authzDir, 0o755); err != nil {
		t.Fatal(err)
	}
	authz := filepath.Join(authzDir, "authz.yaml")
	writeFile(t, authz, authzSettings)
	writeFile(t, filepath.Join(authzDir, "keys.yaml"), "keys:\n"+
		"  - {key: \""+authzKey+"\", tenant: acme, tier: premium, name: ci}\n"+
		"  - {key: \""+anotherKey+"\", tenant: small, limits: {tokens: {amount: 10}}}\n")
	body := filepath.Join(dir, "body.json")
	writeFile(t, body, `{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
	sum := sha256.Sum256([]byte(authzKey))

	tests := []struct {
		name    string
		args    []string
		want    []string
		notWant []string
	}{
		{
			name: "a key",
			args: []string{"--api-key", authzKey, "--body", body},
			want: []string{
				"identity: tenant acme, tier premium, key ci (listed in " + filepath.Join(authzDir, "keys.yaml") + ")",
				"model: m1", "estimate: 51 tokens",
				"descriptor 1: tenant=acme", "descriptor 2: tenant=acme,model=m1",
				"tier: premium (x3)",
				"token_limit tokens: 3000/hour", // 1000 x 3 for premium
				"answer on a fresh store: 200",
				"to the upstream: x-tollgate-tenant: acme",
			},
		},
		{
			name: "a key by its hash",
			args: []string{"--api-key-sha256", hex.EncodeToString(sum[:]), "--body", body},
			want: []string{"identity: tenant acme, tier premium, key ci", "answer on a fresh store: 200"},
		},
		{
			name: "an override too small for the estimate",
			args: []string{"--api-key", anotherKey, "--body", body},
			want: []string{
				"identity: tenant small, no tier (the rules' default plan)", "override tokens: 10",
				"token_limit tokens: 10/hour", "answer on a fresh store: 413", "request_too_large",
			},
		},
		{
			name: "an unknown key",
			args: []string{"--api-key", "sk-nobody-0123456789abcdef", "--body", body},
			want: []string{"identity: the key is not in the keys file, or is disabled: Check answers 401", "answer on a fresh store: 401"},
		},
		{
			name: "no key",
			args: []string{"--body", body},
			want: []string{"identity: no key given, and require_api_key is true: Check answers 401", "answer on a fresh store: 401"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr := &buffer{}, &buffer{}
			a := &App{Stdout: stdout, Stderr: stderr, LookupEnv: env(nil)}
			args := append([]string{"explain", "--config", filepath.Join(dir, "rules.yaml"), "--authz-config", authz}, tt.args...)
			if code := a.Run(t.Context(), args); code != ExitOK {
				t.Fatalf("explain = %d:\n%s", code, stderr)
			}
			out := stdout.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, k := range []string{authzKey, anotherKey, hex.EncodeToString(sum[:])} {
				if strings.Contains(out, k) {
					t.Errorf("output shows a key or its hash:\n%s", out)
				}
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		t.Parallel()
		stdout, stderr := &buffer{}, &buffer{}
		a := &App{Stdout: stdout, Stderr: stderr, LookupEnv: env(nil)}
		if code := a.Run(t.Context(), []string{"explain", "--config", filepath.Join(dir, "rules.yaml"), "--authz-config", authz,
			"--api-key", authzKey, "--body", body, "--json"}); code != ExitOK {
			t.Fatalf("explain = %d:\n%s", code, stderr)
		}
		var got checkExplain
		if err := json.Unmarshal([]byte(stdout.String()), &got); err != nil {
			t.Fatal(err)
		}
		if got.Identity.Tenant != "acme" || got.Tokens != 51 || got.Answer.Status != 200 || len(got.Descriptors) != 2 || got.Rules == nil {
			t.Errorf("explain --json = %+v", got)
		}
	})

	t.Run("usage", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"explain", "--api-key", authzKey, "--domain", "e2e", "--descriptor", "tenant=a"},
			{"explain", "--authz-config", authz, "--domain", "e2e"},
			{"explain", "--authz-config", authz, "--api-key", authzKey, "--api-key-sha256", hex.EncodeToString(sum[:])},
		} {
			stderr := &buffer{}
			a := &App{Stdout: &buffer{}, Stderr: stderr, LookupEnv: env(nil)}
			if code := a.Run(t.Context(), args); code != ExitUsage {
				t.Errorf("%q = %d, want %d:\n%s", args, code, ExitUsage, stderr)
			}
		}
	})
}
