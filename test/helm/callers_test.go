package helm

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// authorizationPolicy is the part of Istio's AuthorizationPolicy the chart
// renders. Decoded strictly, so any other field (one that would narrow the
// denial, or a misspelt one) fails the decode; test/istio checks the same
// policy in istio/tollgate-callers.yaml against Istio's own types.
type authorizationPolicy struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Action string              `json:"action"`
		Rules  []authorizationRule `json:"rules"`
	} `json:"spec"`
}

type authorizationRule struct {
	From []struct {
		Source struct {
			NotPrincipals []string `json:"notPrincipals"`
		} `json:"source"`
	} `json:"from"`
	To []struct {
		Operation struct {
			Paths []string `json:"paths"`
		} `json:"operation"`
	} `json:"to"`
}

// podArgs are the Deployment's container args as flag name -> value.
func podArgs(dep *appsv1.Deployment) map[string]string {
	args := map[string]string{}
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		if name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			args[name] = value
		}
	}
	return args
}

// TestCallersRender: with each values file, an allow-list enforced by
// Tollgate comes with mutual TLS, and one enforced by Istio is a DENY
// policy on the release's own pods, never both.
func TestCallersRender(t *testing.T) {
	t.Parallel()
	var sawFlag, sawPolicy bool
	for _, values := range valuesFiles(t) {
		r := mustRender(t, values)
		dep := one[*appsv1.Deployment](t, r, "Deployment")
		args := podArgs(dep)
		policies := r.all("AuthorizationPolicy")
		if _, ok := args["allow-callers"]; ok {
			sawFlag = true
			if args["tls-client-ca"] == "" {
				t.Errorf("%s: --allow-callers without --tls-client-ca: Tollgate refuses to start", caseName(values))
			}
			if len(policies) > 0 {
				t.Errorf("%s: both --allow-callers and an AuthorizationPolicy", caseName(values))
			}
		}
		for _, o := range policies {
			sawPolicy = true
			ap := o.obj.(*authorizationPolicy)
			if ap.APIVersion != "security.istio.io/v1" || ap.Spec.Action != "DENY" {
				t.Errorf("%s: %s %s, action %s: want security.istio.io/v1 DENY", caseName(values), o, ap.APIVersion, ap.Spec.Action)
			}
			if !reflect.DeepEqual(ap.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels) {
				t.Errorf("%s: %s selects %v, want the Deployment's pods %v", caseName(values), o, ap.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels)
			}
		}
	}
	if !sawFlag || !sawPolicy {
		t.Errorf("no values file in ci/ renders --allow-callers (%v) or the AuthorizationPolicy (%v): add one of each", sawFlag, sawPolicy)
	}
}

// TestCallersPolicyIsTheLintedOne: ci/istio.yaml lists the principals of
// istio/tollgate-callers.yaml, and the chart must render the same rules,
// so that test/istio's lint of that file holds for the chart too.
func TestCallersPolicyIsTheLintedOne(t *testing.T) {
	t.Parallel()
	r := mustRender(t, filepath.Join(chartDir, "ci", "istio.yaml"))
	got := one[*authorizationPolicy](t, r, "AuthorizationPolicy")
	if _, ok := podArgs(one[*appsv1.Deployment](t, r, "Deployment"))["allow-callers"]; ok {
		t.Error("callers.enforce istio renders --allow-callers: behind a sidecar Tollgate sees no client certificate")
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "istio", "tollgate-callers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		t.Fatal(err)
	}
	var want authorizationPolicy
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&want); err != nil {
		t.Fatalf("istio/tollgate-callers.yaml: %v", err)
	}
	if got.Spec.Action != want.Spec.Action || !reflect.DeepEqual(got.Spec.Rules, want.Spec.Rules) {
		g, _ := json.MarshalIndent(got.Spec.Rules, "", "  ")
		w, _ := json.MarshalIndent(want.Spec.Rules, "", "  ")
		t.Errorf("the chart renders action %s, rules\n%s\nistio/tollgate-callers.yaml has action %s, rules\n%s", got.Spec.Action, g, want.Spec.Action, w)
	}
}

// TestCallersFlag pins what ci/full.yaml renders for Tollgate to enforce.
func TestCallersFlag(t *testing.T) {
	t.Parallel()
	r := mustRender(t, filepath.Join(chartDir, "ci", "full.yaml"))
	dep := one[*appsv1.Deployment](t, r, "Deployment")
	args := podArgs(dep)
	want := "accesslog=spiffe://cluster.local/ns/gateway/sa/envoy,spiffe://cluster.local/ns/edge/sa/*;ext_proc=spiffe://cluster.local/ns/gateway/sa/envoy"
	if args["allow-callers"] != want {
		t.Errorf("--allow-callers=%q, want %q", args["allow-callers"], want)
	}
	if args["tls-client-ca"] != "/etc/tollgate/client-ca/ca.crt" {
		t.Errorf("--tls-client-ca=%q, want the clientCA bundle's mount", args["tls-client-ca"])
	}
	var found bool
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "client-ca" {
			found = v.ConfigMap != nil && v.ConfigMap.Name == "gateway-ca-bundle"
		}
	}
	if !found {
		t.Error("no client-ca volume from the ConfigMap gateway-ca-bundle")
	}
	if n := len(r.all("AuthorizationPolicy")); n != 0 {
		t.Errorf("%d AuthorizationPolicies with callers.enforce tollgate, want 0", n)
	}
}
