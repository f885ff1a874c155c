package helm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../../charts/tollgate"
	namespace = "tollgate"
	release   = "tg"
)

// helmPath returns bin/helm (or $HELM), skipping t when it is absent:
// `make validate` builds it before running these tests.
func helmPath(t testing.TB) string {
	t.Helper()
	p := os.Getenv("HELM")
	if p == "" {
		p = filepath.Join("..", "..", "bin", "helm")
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no helm at %s (%v): run `make validate`, which builds bin/helm, or set HELM", p, err)
	}
	return p
}

// render runs helm template on chart with the values files given; the
// error carries helm's stderr.
func render(t testing.TB, chart string, values ...string) (string, error) {
	t.Helper()
	args := []string{"template", release, chart, "--namespace", namespace}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	cmd := exec.Command(helmPath(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// valuesFiles are the cases every check runs on: the chart's defaults
// ("") and each file of charts/tollgate/ci.
func valuesFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("%s/ci holds %d values files, want at least 4 (memory, redis-tls, authz, full)", chartDir, len(files))
	}
	return append([]string{""}, files...)
}

func caseName(values string) string {
	if values == "" {
		return "defaults"
	}
	return strings.TrimSuffix(filepath.Base(values), ".yaml")
}

// object is one rendered document, decoded.
type object struct {
	source string // helm's "# Source:" comment
	kind   string
	name   string
	obj    any // *appsv1.Deployment, ..., or map[string]any for a ServiceMonitor
}

func (o object) String() string { return fmt.Sprintf("%s %s (%s)", o.kind, o.name, o.source) }

var (
	documentSep = regexp.MustCompile(`(?m)^---[ \t]*$`)
	sourceLine  = regexp.MustCompile(`(?m)^# Source: (.+)$`)
)

// newTyped returns an empty object of the Kubernetes type for apiVersion
// and kind, or nil for one the chart must not render.
func newTyped(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &map[string]any{}
	case "security.istio.io/v1/AuthorizationPolicy":
		return &authorizationPolicy{}
	}
	return nil
}

// decode splits helm's output into documents and decodes each strictly:
// unknown fields and duplicate keys are errors naming the template.
func decode(out string) ([]object, error) {
	var objs []object
	var errs []error
	for _, doc := range documentSep.Split(out, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		src := "?"
		if m := sourceLine.FindStringSubmatch(doc); m != nil {
			src = m[1]
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(js, &head); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		obj := newTyped(head.APIVersion, head.Kind)
		if obj == nil {
			errs = append(errs, fmt.Errorf("%s: unexpected apiVersion %q kind %q", src, head.APIVersion, head.Kind))
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s %s: %w", src, head.Kind, head.Metadata.Name, err))
			continue
		}
		if head.Metadata.Name == "" || head.Metadata.Namespace != namespace {
			errs = append(errs, fmt.Errorf("%s: %s: metadata.name %q, namespace %q: want a name and namespace %q", src, head.Kind, head.Metadata.Name, head.Metadata.Namespace, namespace))
		}
		if m, ok := obj.(*map[string]any); ok {
			obj = *m
		}
		objs = append(objs, object{source: src, kind: head.Kind, name: head.Metadata.Name, obj: obj})
	}
	return objs, errors.Join(errs...)
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// rendered is one values file's output, decoded.
type rendered struct {
	values string
	out    string
	objs   []object
}

func (r rendered) all(kind string) []object {
	var out []object
	for _, o := range r.objs {
		if o.kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the single object of kind, failing t when there is not
// exactly one.
func one[T any](t testing.TB, r rendered, kind string) T {
	t.Helper()
	os := r.all(kind)
	if len(os) != 1 {
		t.Fatalf("%s: %d %s objects, want 1", caseName(r.values), len(os), kind)
	}
	return os[0].obj.(T)
}

func mustRender(t testing.TB, values string) rendered {
	t.Helper()
	var files []string
	if values != "" {
		files = append(files, values)
	}
	out, err := render(t, chartDir, files...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return rendered{values: values, out: out, objs: objs}
}

// serveFlags lists the flags `tollgate serve -h` prints, from the binary
// built from ../.. once per test run.
var serveFlags = sync.OnceValues(func() (map[string]bool, error) {
	dir, err := os.MkdirTemp("", "tollgate-helm-test")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "tollgate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tollgate")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/tollgate: %w: %s", err, out)
	}
	// -h exits 0 or 2 depending on the flag package's handling; the usage
	// text is what matters.
	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 || !flags["config"] || !flags["redis-url"] {
		return nil, fmt.Errorf("tollgate serve -h listed %d flags, not the expected set:\n%s", len(flags), out)
	}
	return flags, nil
})

func mustServeFlags(t testing.TB) map[string]bool {
	t.Helper()
	f, err := serveFlags()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
