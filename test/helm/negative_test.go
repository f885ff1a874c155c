package helm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBrokenChart: testdata/broken/deployment.yaml is a copy of the
// Deployment template with one field misspelt; the chart with it must fail
// the strict decode, naming the field.
func TestBrokenChart(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile(filepath.Join(chartDir, "templates", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	broken, err := os.ReadFile(filepath.Join("testdata", "broken", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := differingLines(string(good), string(broken)); n != 1 {
		t.Fatalf("testdata/broken/deployment.yaml differs from templates/deployment.yaml in %d lines, want 1: copy the template again and misspell one field", n)
	}
	chart := copyChart(t)
	if err := os.WriteFile(filepath.Join(chart, "templates", "deployment.yaml"), broken, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := render(t, chart)
	if err != nil {
		t.Fatalf("helm template failed before the decode could: %v", err)
	}
	_, err = decode(out)
	if err == nil {
		t.Fatal("the broken chart decoded: a misspelt field in the Deployment went unnoticed")
	}
	for _, want := range []string{"templates/deployment.yaml", `unknown field "readinesProbe"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

// TestRefused: values the chart must refuse, each with a message naming
// what to change.
func TestRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		give string
		want []string
	}{
		{name: "schema", give: "testdata/bad-values.yaml", want: []string{"schema", "/flags", "log-levle"}},
		{name: "memory with replicas", give: "testdata/memory-replicas.yaml", want: []string{"store.type memory", "replicaCount 1"}},
		{name: "callers without mutual TLS", give: "testdata/callers-no-mtls.yaml", want: []string{"callers.enforce tollgate needs grpcTLS.secretName and grpcTLS.requireClientCert"}},
		{name: "callers for Istio not SPIFFE", give: "testdata/callers-istio-uri.yaml", want: []string{"callers.allow.accesslog", `"urn:example:gateway" is not a SPIFFE ID`}},
		{name: "callers SAN with a separator", give: "testdata/callers-bad-san.yaml", want: []string{"schema", "/callers/allow/accesslog/0"}},
		{name: "debug without a token", give: "testdata/debug-no-token.yaml", want: []string{"debug.enabled and debug.pprof need debug.tokenSecret.name"}},
		{name: "client CA without requireClientCert", give: "testdata/client-ca-no-mtls.yaml", want: []string{"grpcTLS.clientCA is used only with grpcTLS.secretName and grpcTLS.requireClientCert"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, chartDir, tc.give)
			if err == nil {
				t.Fatalf("helm template accepted %s", tc.give)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func differingLines(a, b string) int {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	if len(la) != len(lb) {
		return max(len(la), len(lb))
	}
	n := 0
	for i := range la {
		if la[i] != lb[i] {
			n++
		}
	}
	return n
}

// copyChart copies charts/tollgate into a temporary directory.
func copyChart(t testing.TB) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "tollgate")
	if err := os.CopyFS(dst, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	return dst
}
