package helm

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/extauthz"
)

// TestRender renders the chart with each values file and checks every
// object against what Tollgate needs.
func TestRender(t *testing.T) {
	t.Parallel()
	flags := mustServeFlags(t)
	for _, values := range valuesFiles(t) {
		t.Run(caseName(values), func(t *testing.T) {
			t.Parallel()
			r := mustRender(t, values)
			dep := one[*appsv1.Deployment](t, r, "Deployment")
			checkPod(t, &dep.Spec.Template.Spec, flags)
			checkService(t, one[*corev1.Service](t, r, "Service"))
			checkReferences(t, r, dep)
			checkRules(t, r)
			checkAuthz(t, r)
			checkNoSecrets(t, r, dep)
			checkOptional(t, r, dep)
		})
	}
}

func checkPod(t *testing.T, pod *corev1.PodSpec, flags map[string]bool) {
	t.Helper()
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	// Security context: the pod's and the container's.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and seccompProfile RuntimeDefault", psc)
	}
	if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		t.Error("pod securityContext.runAsUser is 0")
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Error("container has no securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Error("container securityContext.runAsNonRoot is not true")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("container securityContext.readOnlyRootFilesystem is not true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("container securityContext.allowPrivilegeEscalation is not false")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("container is privileged")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("container capabilities %+v: want drop [ALL] and nothing added", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("container seccompProfile is not RuntimeDefault")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is not false: Tollgate never calls the Kubernetes API")
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= 10 {
		t.Errorf("terminationGracePeriodSeconds %v: want more than Tollgate's 10s drain", g)
	}

	// Ports and probes.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc"] == 0 || ports["http-admin"] == 0 {
		t.Fatalf("container ports %v: want grpc and http-admin", ports)
	}
	for _, tc := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{name: "livenessProbe", probe: c.LivenessProbe, path: "/healthz"},
		{name: "readinessProbe", probe: c.ReadinessProbe, path: "/readyz"},
	} {
		p := tc.probe
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe", tc.name)
			continue
		}
		port := p.HTTPGet.Port
		onAdmin := port.StrVal == "http-admin" || (port.StrVal == "" && port.IntVal == ports["http-admin"])
		if p.HTTPGet.Path != tc.path || !onAdmin {
			t.Errorf("%s: GET %s on port %s, want %s on the admin port (http-admin, %d)", tc.name, p.HTTPGet.Path, port.String(), tc.path, ports["http-admin"])
		}
	}

	// Args: serve, then only flags `tollgate serve -h` lists, each once.
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("args %q: want serve first", c.Args)
	}
	args := map[string]string{}
	for _, a := range c.Args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("arg %q: want --flag=value", a)
			continue
		}
		if !flags[name] {
			t.Errorf("arg %q: tollgate serve has no flag --%s", a, name)
		}
		if _, dup := args[name]; dup {
			t.Errorf("flag --%s given twice", name)
		}
		args[name] = value
	}
	if args["config"] != "/etc/tollgate/rules" {
		t.Errorf("--config=%q, want the rules ConfigMap's directory /etc/tollgate/rules", args["config"])
	}
	if args["replica-id"] != "$(POD_NAME)" {
		t.Errorf("--replica-id=%q, want $(POD_NAME)", args["replica-id"])
	}
	if args["admin-addr"] != ":"+itoa(ports["http-admin"]) || args["grpc-addr"] != ":"+itoa(ports["grpc"]) {
		t.Errorf("--admin-addr=%q --grpc-addr=%q do not match the container ports %v", args["admin-addr"], args["grpc-addr"], ports)
	}

	// Env: POD_NAME from the downward API; TOLLGATE_* only for known flags.
	var podName bool
	for _, e := range c.Env {
		if e.Name == "POD_NAME" {
			podName = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
		}
		if f, ok := strings.CutPrefix(e.Name, "TOLLGATE_"); ok && e.Name != "TOLLGATE_REDIS_PASSWORD" {
			// TOLLGATE_REDIS_PASSWORD is read by serve itself and has no
			// flag on purpose: a password never goes on a command line.
			flag := strings.ToLower(strings.ReplaceAll(f, "_", "-"))
			if !flags[flag] {
				t.Errorf("env %s: tollgate serve has no flag --%s", e.Name, flag)
			}
			if _, both := args[flag]; both {
				t.Errorf("--%s is set both as an arg and as %s", flag, e.Name)
			}
		}
	}
	if !podName {
		t.Error("env POD_NAME: want valueFrom.fieldRef metadata.name (the downward API)")
	}

	// Mounts: never subPath (a subPath mount sees no ConfigMap update, so
	// hot reload would never fire), every one of a declared volume.
	vols := map[string]bool{}
	for _, v := range pod.Volumes {
		vols[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("volumeMount %s uses subPath: kubelet updates would not reach it", m.Name)
		}
		if !vols[m.Name] {
			t.Errorf("volumeMount %s: no such volume", m.Name)
		}
		if !m.ReadOnly {
			t.Errorf("volumeMount %s is not readOnly", m.Name)
		}
	}
	// Every file flag points under a mount.
	for _, f := range []string{"config", "authz-config", "pressure-token-file", "tls-cert", "tls-key", "tls-client-ca", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", "ticket-key-file", "admin-token-file"} {
		v, ok := args[f]
		if !ok {
			continue
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(v, m.MountPath) }) {
			t.Errorf("--%s=%s is under no volumeMount", f, v)
		}
	}
}

func itoa(n int32) string {
	b, _ := yaml.Marshal(n)
	return strings.TrimSpace(string(b))
}

func checkService(t *testing.T, svc *corev1.Service) {
	t.Helper()
	byName := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		byName[p.Name] = p
	}
	g, ok := byName["grpc"]
	if !ok || g.AppProtocol == nil || *g.AppProtocol != "grpc" || g.TargetPort.StrVal != "grpc" {
		t.Errorf("Service port grpc %+v: want name grpc, appProtocol grpc (Istio picks HTTP/2 from it), targetPort grpc", g)
	}
	if a, ok := byName["http-admin"]; !ok || a.TargetPort.StrVal != "http-admin" {
		t.Errorf("Service port http-admin %+v: want it, targetPort http-admin", a)
	}
}

// checkReferences: the selector matches the pod labels, and the ConfigMaps
// the pod mounts by the release's name are rendered.
func checkReferences(t *testing.T, r rendered, dep *appsv1.Deployment) {
	t.Helper()
	for k, v := range dep.Spec.Selector.MatchLabels {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Deployment selector %s=%s does not match the pod labels %v", k, v, dep.Spec.Template.Labels)
		}
	}
	svc := one[*corev1.Service](t, r, "Service")
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pod labels", k, v)
		}
	}
	cms := map[string]bool{}
	for _, o := range r.all("ConfigMap") {
		cms[o.name] = true
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && strings.HasPrefix(v.ConfigMap.Name, dep.Name+"-") && !cms[v.ConfigMap.Name] {
			t.Errorf("volume %s mounts ConfigMap %s, which the chart does not render", v.Name, v.ConfigMap.Name)
		}
	}
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa != "default" {
		if !slices.ContainsFunc(r.all("ServiceAccount"), func(o object) bool { return o.name == sa }) {
			t.Errorf("serviceAccountName %s is not rendered", sa)
		}
	}
	// No checksum of a hot-reloaded ConfigMap: a rules edit must not
	// restart the pods.
	for k := range dep.Spec.Template.Annotations {
		if strings.HasPrefix(k, "checksum/") {
			t.Errorf("pod annotation %s: the rules and ext_authz settings are hot-reloaded, a checksum would restart the pods on every edit", k)
		}
	}
}

// checkRules loads the rendered rules ConfigMap with pkg/config, as
// `tollgate validate` does.
func checkRules(t *testing.T, r rendered) {
	t.Helper()
	cm := rulesConfigMap(t, r)
	if len(cm.Data) == 0 {
		t.Fatal("the rules ConfigMap is empty")
	}
	dir := t.TempDir()
	for name, content := range cm.Data {
		if !strings.HasSuffix(name, ".yaml") {
			t.Errorf("rules ConfigMap key %q: --config loads only *.yaml", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := config.Load(dir); err != nil {
		t.Errorf("rules ConfigMap %s does not load (tollgate validate):\n%v", cm.Name, err)
	}
}

func rulesConfigMap(t testing.TB, r rendered) *corev1.ConfigMap {
	t.Helper()
	for _, o := range r.all("ConfigMap") {
		if strings.HasSuffix(o.name, "-rules") {
			return o.obj.(*corev1.ConfigMap)
		}
	}
	t.Fatal("no rules ConfigMap (name ending -rules)")
	return nil
}

// checkAuthz parses the rendered ext_authz settings with pkg/extauthz and
// checks their domain is one of the rendered rules'.
func checkAuthz(t *testing.T, r rendered) {
	t.Helper()
	for _, o := range r.all("ConfigMap") {
		if !strings.HasSuffix(o.name, "-authz") {
			continue
		}
		cm := o.obj.(*corev1.ConfigMap)
		data, ok := cm.Data["authz.yaml"]
		if !ok {
			t.Fatalf("ConfigMap %s has no authz.yaml", cm.Name)
		}
		s, err := extauthz.ParseSettings("/etc/tollgate/authz/authz.yaml", []byte(data))
		if err != nil {
			t.Fatalf("ConfigMap %s: authz.yaml does not parse:\n%v", cm.Name, err)
		}
		if s.KeysFile != "" && !strings.HasPrefix(s.KeysFile, "/etc/tollgate/keys/") {
			t.Errorf("keys_file %s is not in the keys Secret's mount", s.KeysFile)
		}
		dir := t.TempDir()
		for name, content := range rulesConfigMap(t, r).Data {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		rules, err := config.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if rules.Domain(s.Domain) == nil {
			t.Errorf("ext_authz domain %q is in no rendered rule file", s.Domain)
		}
	}
}

// secretLike matches a URL with a literal password: user:password@.
var secretLike = regexp.MustCompile(`://[^/\s:@"]*:([^@\s"]+)@`)

// checkNoSecrets: the chart renders no Secret, references secrets only by
// name, and no known demo secret appears anywhere in its output.
func checkNoSecrets(t *testing.T, r rendered, dep *appsv1.Deployment) {
	t.Helper()
	if len(r.all("Secret")) > 0 {
		t.Error("the chart renders a Secret: secrets are referenced by name, never passed as values")
	}
	for _, m := range secretLike.FindAllStringSubmatch(r.out, -1) {
		if !strings.HasPrefix(m[1], "$(") {
			t.Errorf("a URL with a literal password in the output: %q", m[0])
		}
	}
	for _, s := range demoSecrets(t) {
		if strings.Contains(r.out, s) {
			t.Errorf("a secret from config/authz appears in the output: %q...", s[:6])
		}
	}
	c := dep.Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		lower := strings.ToLower(e.Name)
		if (strings.Contains(lower, "password") || strings.Contains(lower, "token") || strings.Contains(lower, "key")) && e.Value != "" {
			t.Errorf("env %s has a literal value: want valueFrom.secretKeyRef", e.Name)
		}
	}
}

// demoSecrets are the demo API keys and pressure token of config/authz:
// the chart's defaults come from there, so they are the likeliest leak.
func demoSecrets(t testing.TB) []string {
	t.Helper()
	var out []string
	keys, err := os.ReadFile("../../config/authz/keys.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*-?\s*(?:key|sha256):\s*"([^"]+)"`).FindAllStringSubmatch(string(keys), -1) {
		out = append(out, m[1])
	}
	tok, err := os.ReadFile("../../config/authz/pressure.token")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, strings.TrimSpace(string(tok)))
	if len(out) < 3 {
		t.Fatalf("found %d demo secrets in config/authz, want the keys and the token", len(out))
	}
	return out
}

// checkOptional: the optional objects, when rendered, point at the
// release's pods and the admin port.
func checkOptional(t *testing.T, r rendered, dep *appsv1.Deployment) {
	t.Helper()
	for _, o := range r.all("ServiceMonitor") {
		sm := o.obj.(map[string]any)
		spec, _ := sm["spec"].(map[string]any)
		sel, _ := spec["selector"].(map[string]any)
		labels, _ := sel["matchLabels"].(map[string]any)
		if len(labels) == 0 {
			t.Errorf("%s: spec.selector.matchLabels is required", o)
		}
		eps, _ := spec["endpoints"].([]any)
		if len(eps) == 0 {
			t.Errorf("%s: spec.endpoints is required", o)
		}
		for _, e := range eps {
			ep, _ := e.(map[string]any)
			if ep["port"] != "http-admin" || ep["path"] != "/metrics" {
				t.Errorf("%s: endpoint %v: want port http-admin, path /metrics", o, ep)
			}
		}
	}
	if len(r.all("HorizontalPodAutoscaler")) > 0 && dep.Spec.Replicas != nil {
		t.Error("the Deployment sets replicas while an HPA scales it: every upgrade would reset the scale")
	}
}

// TestDefaultRules pins the chart's default rules to config/: the chart
// cannot read files outside itself, so values.yaml holds copies.
func TestDefaultRules(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Rules map[string]string `json:"rules"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"inference.yaml", "envoy-ratelimit-compat.yaml"} {
		want, err := os.ReadFile(filepath.Join("..", "..", "config", name))
		if err != nil {
			t.Fatal(err)
		}
		if v.Rules[name] != string(want) {
			t.Errorf("values.yaml rules[%q] differs from config/%s: copy the file again (indented 4 spaces)", name, name)
		}
	}
}
