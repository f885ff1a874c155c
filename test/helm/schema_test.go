package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type schemaNode struct {
	Type                 any                    `json:"type"`
	Description          string                 `json:"description"`
	Default              any                    `json:"default"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
}

// TestSchemaDocumentsEveryValue: every value in values.yaml has a type and
// a description in values.schema.json, each leaf's default there is its
// value in values.yaml, each object with named properties is closed, the
// flags it allows are `tollgate serve` flags the chart does not set itself,
// and the README's table names every leaf.
func TestSchemaDocumentsEveryValue(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var root schemaNode
	if err := json.Unmarshal(raw, &root); err != nil {
		t.Fatal(err)
	}
	vraw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(vraw, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Free-form values whose content another tool checks: no default in
	// the schema (rules and authz.settings are long; Tollgate checks them).
	freeForm := []string{"rules", "authz.settings"}
	var walk func(path string, n *schemaNode, v any)
	walk = func(path string, n *schemaNode, v any) {
		if n.Type == nil || n.Description == "" {
			t.Errorf("schema %s: want a type and a description", path)
		}
		if n.Properties != nil && path != "flags" {
			if n.AdditionalProperties != false {
				t.Errorf("schema %s: want additionalProperties false", path)
			}
			vm, _ := v.(map[string]any)
			for k := range vm {
				if _, ok := n.Properties[k]; !ok {
					t.Errorf("values.yaml %s.%s is not in the schema", path, k)
				}
			}
			for k, c := range n.Properties {
				p := strings.TrimPrefix(path+"."+k, ".")
				walk(p, c, vm[k])
			}
			return
		}
		if !strings.Contains(string(readme), "`"+path+"`") {
			t.Errorf("README.md's values table does not name `%s`", path)
		}
		if slices.Contains(freeForm, path) {
			return
		}
		if !reflect.DeepEqual(n.Default, v) && !(n.Default == nil && v == nil) {
			t.Errorf("schema %s: default %v, values.yaml has %v", path, n.Default, v)
		}
	}
	walk("", &root, values)

	flags := mustServeFlags(t)
	managed := []string{"config", "authz-config", "grpc-addr", "admin-addr", "replica-id", "pressure-token-file", "redis-url", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", "redis-tls-server-name", "tls-cert", "tls-key", "tls-client-ca", "allow-callers", "ticket-key-file",
		// debug.*; and the Redis password comes as TOLLGATE_REDIS_PASSWORD, not a file.
		"debug", "pprof", "admin-token-file", "redis-password-file"}
	for name := range root.Properties["flags"].Properties {
		if !flags[name] {
			t.Errorf("schema flags.%s: tollgate serve has no flag --%s", name, name)
		}
		if slices.Contains(managed, name) {
			t.Errorf("schema flags.%s: the chart sets --%s itself", name, name)
		}
	}
	for name := range flags {
		if _, ok := root.Properties["flags"].Properties[name]; !ok && !slices.Contains(managed, name) {
			t.Errorf("tollgate serve --%s is neither in the schema's flags nor set by the chart", name)
		}
	}
}
