package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
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

// authzFiles writes the files serve reads with --authz-config:
// dir/rules.yaml, and dir/authz/authz.yaml with its keys.yaml. It returns
// dir and the authz config's path.
func authzFiles(t *testing.T, rules, settings, keys string) (dir, authzPath string) {
	t.Helper()
	dir = t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), rules)
	authzDir := filepath.Join(dir, "authz")
	if err := os.Mkdir(authzDir, 0o755); err != nil {
		t.Fatal(err)
	}
	authzPath = filepath.Join(authzDir, "authz.yaml")
	writeFile(t, authzPath, settings)
	writeFile(t, filepath.Join(authzDir, "keys.yaml"), keys)
	return dir, authzPath
}

// awaitLog waits until the log in stderr says what.
func awaitLog(ctx context.Context, t *testing.T, stderr *buffer, what string) {
	t.Helper()
	for !strings.Contains(stderr.String(), what) {
		select {
		case <-ctx.Done():
			t.Fatalf("the log never said %q:\n%s", what, stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestServeAuthzAgainstRules: serve refuses to start with an authz config
// the rules disagree with, and rejects a reload of either file that would
// make them disagree, keeping the files in force.
func TestServeAuthzAgainstRules(t *testing.T) {
	t.Parallel()
	t.Run("start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		dir, authzPath := authzFiles(t, authzRules, strings.Replace(authzSettings, "domain: e2e", "domain: e2f", 1), authzKeys)
		stderr := &buffer{}
		_, code := startServe(ctx, t, stderr, map[string]string{"TOLLGATE_AUTHZ_CONFIG": authzPath}, "--config", dir)
		if code != ExitError {
			t.Fatalf("serve with a misspelt authz domain: exit %d, want %d:\n%s", code, ExitError, stderr)
		}
		if want := `domain: \"e2f\" is not a domain of the rules (they declare e2e)`; !strings.Contains(stderr.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, stderr)
		}
	})

	t.Run("reloads", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		dir, authzPath := authzFiles(t, authzRules, authzSettings, authzKeys)
		stderr := &buffer{}
		conn, code := startServe(ctx, t, stderr, map[string]string{"TOLLGATE_AUTHZ_CONFIG": authzPath}, "--config", dir)
		if conn == nil {
			t.Fatalf("serve exited with %d:\n%s", code, stderr)
		}
		client := authv3.NewAuthorizationClient(conn)
		// status is Check's HTTP status: 200, 429 over a limit, 401 for a
		// key not in force. Each admitted Check spends 400 of the
		// tenant's 1,000 tokens, so the third is over the rules' limit.
		status := func() int {
			t.Helper()
			resp, err := client.Check(ctx, authzCheck(authzKey))
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if resp.GetOkResponse() != nil {
				return 200
			}
			return int(resp.GetDeniedResponse().GetStatus().GetCode())
		}
		if got := status(); got != 200 {
			t.Fatalf("Check at start = %d, want 200", got)
		}
		// The watcher's first load is the start's, not a reload.
		awaitLog(ctx, t, stderr, `watching authz config`)
		if strings.Contains(stderr.String(), "authz config reloaded") {
			t.Errorf("the start logged a reload:\n%s", stderr)
		}
		edits := 0
		// Rules without the authz domain: rejected, the old ones serve.
		rewrite(t, filepath.Join(dir, "rules.yaml"), strings.Replace(authzRules, "domain: e2e", "domain: other", 1), &edits)
		awaitLog(ctx, t, stderr, `rules reload rejected; the previous rules keep serving`)
		awaitLog(ctx, t, stderr, `is not a domain of the rules (they declare other)`)
		if got := status(); got != 200 {
			t.Errorf("Check after the rejected rules reload = %d, want 200", got)
		}
		// A keys file naming a limit the rules lack: rejected.
		rewrite(t, filepath.Join(filepath.Dir(authzPath), "keys.yaml"),
			"keys:\n  - {key: \""+authzKey+"\", tenant: acme, limits: {tokenz: {amount: 1}}}\n", &edits)
		awaitLog(ctx, t, stderr, `authz config reload rejected; the previous settings keep serving`)
		awaitLog(ctx, t, stderr, `\"tokenz\" names no rate_limit or token_limit of domain \"e2e\"`)
		// The key still in force (not 401), the old rules' token limit
		// still counting (a rules file without the domain would admit).
		if got := status(); got != 429 {
			t.Errorf("Check after the rejected keys reload = %d, want 429 from the rules in force", got)
		}
	})
}

// TestServeStrict: serve --strict refuses warnings as validate --strict
// does: at start, and on a reload, which keeps the rules in force.
func TestServeStrict(t *testing.T) {
	t.Parallel()
	const warned = "domain: e2e\ndescriptors:\n  - {key: tenant, unit: second, rate_limit: {unit: minute, requests_per_unit: 100}}\n"
	t.Run("rules at start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "rules.yaml"), warned)
		stderr := &buffer{}
		if _, code := startServe(ctx, t, stderr, map[string]string{}, "--config", dir, "--strict"); code != ExitError {
			t.Fatalf("serve --strict with a warning: exit %d, want %d:\n%s", code, ExitError, stderr)
		}
		for _, want := range []string{"descriptors[0].unit: warning: ignored", "1 warnings, refused under --strict"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, stderr)
			}
		}
	})
	t.Run("authz at start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		// The rules have no tiers: a key's tier changes nothing, a warning.
		dir, authzPath := authzFiles(t, authzRules, authzSettings, "keys:\n  - {key: \""+authzKey+"\", tenant: acme, tier: gold}\n")
		stderr := &buffer{}
		vars := map[string]string{"TOLLGATE_AUTHZ_CONFIG": authzPath}
		if _, code := startServe(ctx, t, stderr, vars, "--config", dir, "--strict"); code != ExitError {
			t.Fatalf("serve --strict with an authz warning: exit %d, want %d:\n%s", code, ExitError, stderr)
		}
		if want := `has no tiers, so tier \"gold\" changes nothing`; !strings.Contains(stderr.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, stderr)
		}
		// Without --strict it serves, and says so.
		stderr = &buffer{}
		if conn, code := startServe(ctx, t, stderr, vars, "--config", dir); conn == nil {
			t.Fatalf("serve without --strict: exit %d:\n%s", code, stderr)
		}
	})
	t.Run("a rules reload the authz settings would warn of", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		tiered := strings.Replace(authzRules, "descriptors:", "tiers: {key: tier, default: free, plans: {free: 1, gold: 2}}\ndescriptors:", 1)
		dir, authzPath := authzFiles(t, tiered, authzSettings, "keys:\n  - {key: \""+authzKey+"\", tenant: acme, tier: gold}\n")
		stderr := &buffer{}
		if conn, code := startServe(ctx, t, stderr, map[string]string{"TOLLGATE_AUTHZ_CONFIG": authzPath}, "--config", dir, "--strict"); conn == nil {
			t.Fatalf("serve --strict: exit %d:\n%s", code, stderr)
		}
		// Rules without tiers: the key's tier would change nothing, a
		// warning of the authz settings, refused under --strict.
		edits := 0
		rewrite(t, filepath.Join(dir, "rules.yaml"), authzRules, &edits)
		awaitLog(ctx, t, stderr, "rules reload rejected; the previous rules keep serving")
		if want := `has no tiers, so tier \"gold\" changes nothing`; !strings.Contains(stderr.String(), want) {
			t.Errorf("the rejection lacks %q:\n%s", want, stderr)
		}
	})
	t.Run("rules reload", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "rules.yaml"), authzRules)
		stderr := &buffer{}
		if conn, code := startServe(ctx, t, stderr, map[string]string{}, "--config", dir, "--strict"); conn == nil {
			t.Fatalf("serve --strict: exit %d:\n%s", code, stderr)
		}
		edits := 0
		rewrite(t, filepath.Join(dir, "rules.yaml"), warned, &edits)
		awaitLog(ctx, t, stderr, "rules reload rejected; the previous rules keep serving")
		if !strings.Contains(stderr.String(), "refused under --strict") {
			t.Errorf("the rejection does not say why:\n%s", stderr)
		}
	})
}

// TestEnvByCommand: explain reads TOLLGATE_* variables for its flags, as
// serve and health do; validate reads its command line only.
func TestEnvByCommand(t *testing.T) {
	t.Parallel()
	dir, authzPath := authzFiles(t, authzRules, strings.Replace(authzSettings, "domain: e2e", "domain: e2f", 1), authzKeys)
	vars := env(map[string]string{"TOLLGATE_AUTHZ_CONFIG": authzPath})

	stdout, stderr := &buffer{}, &buffer{}
	a := &App{Stdout: stdout, Stderr: stderr, LookupEnv: vars}
	if code := a.Run(t.Context(), []string{"validate", dir}); code != ExitOK {
		t.Errorf("validate read TOLLGATE_AUTHZ_CONFIG: exit %d:\n%s", code, stderr)
	}
	stdout, stderr = &buffer{}, &buffer{}
	a = &App{Stdout: stdout, Stderr: stderr, LookupEnv: vars}
	// The misspelt domain is explain's error: it read the variable.
	if code := a.Run(t.Context(), []string{"explain", "--config", dir, "--api-key", authzKey}); code != ExitError ||
		!strings.Contains(stderr.String(), `"e2f" is not a domain of the rules`) {
		t.Errorf("explain did not read TOLLGATE_AUTHZ_CONFIG: exit %d:\n%s", code, stderr)
	}
}
