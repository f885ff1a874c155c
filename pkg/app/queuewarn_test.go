package app

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestShippedTimeouts: the timeouts queueWarnings compares with are the
// ones the shipped manifests set, in every file that sets one.
func TestShippedTimeouts(t *testing.T) {
	t.Parallel()
	got := map[string][]time.Duration{}
	for _, glob := range []string{"../../envoy/*.yaml", "../../istio/*.yaml"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			for _, doc := range yamlDocs(t, f) {
				filterTimeouts(t, doc, got)
			}
		}
	}
	tests := []struct {
		name string
		give string
		want time.Duration
	}{
		{name: "ext_authz", give: "ext_authz", want: shippedAuthzTimeout},
		{name: "ratelimit", give: "ratelimit", want: shippedRLSTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if len(got[tt.give]) == 0 {
				t.Fatalf("no %s timeout found in the manifests", tt.give)
			}
			for _, d := range got[tt.give] {
				if d != tt.want {
					t.Errorf("a manifest sets %s's timeout to %v, want %v", tt.give, d, tt.want)
				}
			}
		})
	}
}

// yamlDocs decodes every document of file.
func yamlDocs(t testing.TB, file string) []any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []any
	dec := yaml.NewDecoder(f)
	for {
		var doc any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, doc)
	}
}

// filterTimeouts adds to got the timeout of every ext_authz and
// ratelimit filter config in v, and of Istio's envoyExtAuthzGrpc.
func filterTimeouts(t testing.TB, v any, got map[string][]time.Duration) {
	t.Helper()
	add := func(kind string, s any) {
		str, _ := s.(string)
		d, err := time.ParseDuration(str)
		if err != nil {
			t.Errorf("%s timeout %v: %v", kind, s, err)
			return
		}
		got[kind] = append(got[kind], d)
	}
	switch v := v.(type) {
	case map[string]any:
		typ, _ := v["@type"].(string)
		switch {
		case strings.HasSuffix(typ, "ext_authz.v3.ExtAuthz"):
			if gs, ok := v["grpc_service"].(map[string]any); ok {
				add("ext_authz", gs["timeout"])
			}
		case strings.HasSuffix(typ, "ratelimit.v3.RateLimit"):
			add("ratelimit", v["timeout"])
		}
		if e, ok := v["envoyExtAuthzGrpc"].(map[string]any); ok {
			add("ext_authz", e["timeout"])
		}
		for _, c := range v {
			filterTimeouts(t, c, got)
		}
	case []any:
		for _, c := range v {
			filterTimeouts(t, c, got)
		}
	}
}

// TestValidateQueueWarning: validate warns of a queue whose wait the
// shipped timeouts cut short, and still passes the file.
func TestValidateQueueWarning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     string
		wantWarn bool
	}{
		{name: "a wait of seconds", give: "queue: {max_wait: 3s, max_length: 10}\n", wantWarn: true},
		{name: "a wait that fits", give: "queue: {max_wait: 50ms, max_length: 10}\n"},
		{name: "no queue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "rules.yaml")
			writeFile(t, path, "domain: d\n"+tt.give+"descriptors:\n  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 1}}\n")
			stdout, stderr := &buffer{}, &buffer{}
			a := &App{Stdout: stdout, Stderr: stderr, LookupEnv: env(nil)}
			if code := a.Run(t.Context(), []string{"validate", path}); code != ExitOK {
				t.Fatalf("validate = %d:\n%s", code, stderr)
			}
			warned := strings.Contains(stderr.String(), path+`: warning: domain "d": queue max_wait`)
			if warned != tt.wantWarn {
				t.Errorf("warned %v, want %v:\n%s", warned, tt.wantWarn, stderr)
			}
		})
	}
}

// TestExplainQueue: explain says how the request's tier waits.
func TestExplainQueue(t *testing.T) {
	t.Parallel()
	rules := rulesFile(t, `domain: d
tiers: {key: tier, default: free, plans: {premium: 3, free: 1, vip: 5}}
queue:
  tiers:
    - {tier: vip, skip: true}
    - {tier: premium, max_wait: 3s, max_length: 20}
descriptors:
  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 1}}
`)
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "waits", give: "tenant=a,tier=premium", want: "queue: a refusal by a limit or cap waits up to 3s or the caller's deadline less 25ms (priority 2 of 3, then FIFO; at most 20 waiting per replica), retrying at least every 250ms"},
		{name: "skips", give: "tenant=a,tier=vip", want: `queue: tier "vip" skips it: a refusal by a limit is answered at once`},
		{name: "not listed", give: "tenant=a", want: `queue: tier "free" does not wait: a refusal by a limit is answered at once`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := explainJSON(t, "--config", rules, "--domain", "d", "--descriptor", tt.give)
			if !slices.Contains(got.Notes, tt.want) {
				t.Errorf("notes %q, want %q among them", got.Notes, tt.want)
			}
		})
	}
}

// TestValidateEnvoyLeniency: validate passes a file with what
// envoyproxy/ratelimit loads and ignores, and prints the parser's warning
// with its file and line (issue 18).
func TestValidateEnvoyLeniency(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: d\ndescriptors:\n  - key: tenant\n    unit: second\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	stdout, stderr := &buffer{}, &buffer{}
	a := &App{Stdout: stdout, Stderr: stderr, LookupEnv: env(nil)}
	if code := a.Run(t.Context(), []string{"validate", path}); code != ExitOK {
		t.Fatalf("validate = %d:\n%s", code, stderr)
	}
	if want := path + ":4: descriptors[0].unit: warning: ignored"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, stderr)
	}
	if !strings.Contains(stdout.String(), "ok: 1 domains") {
		t.Errorf("stdout %q, want ok", stdout)
	}
}
