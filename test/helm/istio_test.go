package helm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The Istio manifests (istio/*.yaml) reach Tollgate through the release
// tollgate in namespace tollgate, by names Istio derives from its Service.
const (
	istioDir       = "../../istio"
	istioRelease   = "tollgate"
	istioNamespace = "tollgate"
)

// outboundClusterRef is Istio's name of a Service port's cluster,
// outbound|<port>||<host>, where <port> is the Service port, not the
// targetPort (pilot/pkg/networking/core/cluster.go and
// pilot/pkg/model/telemetry_logging.go LookupCluster both build it with
// BuildSubsetKey(TrafficDirectionOutbound, "", hostname, port.Port)).
var outboundClusterRef = regexp.MustCompile(`outbound\|(\d+)\|\|([A-Za-z0-9.-]+)`)

// tollgateService is what Istio needs of the chart's Service.
type tollgateService struct {
	host       string // <name>.<namespace>.svc.cluster.local
	grpcPort   int32  // the Service port named grpc
	targetPort int32  // the container port it resolves to
}

// renderTollgateService renders the chart as release tollgate in
// namespace tollgate, with extra helm args, and resolves its gRPC Service
// port to the container port.
func renderTollgateService(t testing.TB, args ...string) (tollgateService, []string) {
	t.Helper()
	cmdArgs := append([]string{"template", istioRelease, chartDir, "--namespace", istioNamespace}, args...)
	cmd := exec.Command(helmPath(t), cmdArgs...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v: %s", strings.Join(cmdArgs, " "), err, stderr.String())
	}
	var svcs []*corev1.Service
	var deps []*appsv1.Deployment
	for _, doc := range documentSep.Split(stdout.String(), -1) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "Service":
			s := &corev1.Service{}
			if err := yaml.UnmarshalStrict([]byte(doc), s); err != nil {
				t.Fatal(err)
			}
			svcs = append(svcs, s)
		case "Deployment":
			d := &appsv1.Deployment{}
			if err := yaml.UnmarshalStrict([]byte(doc), d); err != nil {
				t.Fatal(err)
			}
			deps = append(deps, d)
		}
	}
	if len(svcs) != 1 || len(deps) != 1 {
		t.Fatalf("%d Services and %d Deployments, want one each", len(svcs), len(deps))
	}
	return resolveGRPCPort(svcs[0], deps[0])
}

// resolveGRPCPort finds the Service port named grpc and the container port
// its targetPort names, with what Istio needs of the Service.
func resolveGRPCPort(svc *corev1.Service, dep *appsv1.Deployment) (tollgateService, []string) {
	var problems []string
	ts := tollgateService{host: fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, svc.Namespace)}
	// Headless, Istio would make the cluster ORIGINAL_DST (kube
	// conversion.go: ClusterIP None -> Passthrough; cluster.go
	// convertResolution), which the calls Envoy makes itself (ratelimit,
	// ext_authz, the access log) cannot use: it needs a ClusterIP.
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		problems = append(problems, "Service "+svc.Name+" is headless (clusterIP: None): Istio gives it an ORIGINAL_DST cluster, and Envoy's own gRPC calls to Tollgate through outbound|...| fail")
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == "grpc" {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return ts, append(problems, "Service "+svc.Name+" has no port named grpc: Istio would speak HTTP/1.1 to it")
	}
	ts.grpcPort = sp.Port
	ts.targetPort = sp.TargetPort.IntVal
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, cp := range c.Ports {
			if sp.TargetPort.StrVal != "" && cp.Name == sp.TargetPort.StrVal {
				ts.targetPort = cp.ContainerPort
			}
		}
	}
	if ts.targetPort == 0 {
		problems = append(problems, fmt.Sprintf("Service port grpc: targetPort %s names no container port", sp.TargetPort.String()))
	}
	return ts, problems
}

// checkIstioRefs checks every reference of the Istio manifests to
// Tollgate against the rendered Service: the outbound cluster names and
// the extension providers' service and port, all of which take the
// Service port.
func checkIstioRefs(ts tollgateService, files map[string][]byte) []string {
	var problems []string
	refs := 0
	for _, name := range keys(files) {
		for _, m := range outboundClusterRef.FindAllStringSubmatch(string(files[name]), -1) {
			refs++
			if m[2] != ts.host {
				problems = append(problems, fmt.Sprintf("%s: %s: host %s, but the chart's Service is %s", name, m[0], m[2], ts.host))
			}
			if port, _ := strconv.Atoi(m[1]); int32(port) != ts.grpcPort {
				problems = append(problems, fmt.Sprintf("%s: %s: port %s, but the chart's Service port grpc is %d (targetPort %d): Istio names the cluster after the Service port", name, m[0], m[1], ts.grpcPort, ts.targetPort))
			}
		}
	}
	if refs == 0 {
		problems = append(problems, "no outbound|<port>||<host> cluster in "+istioDir)
	}
	type serviceRef struct {
		Service string `json:"service"`
		Port    int32  `json:"port"`
	}
	var mc struct {
		ExtensionProviders []struct {
			Name              string      `json:"name"`
			EnvoyExtAuthzGrpc *serviceRef `json:"envoyExtAuthzGrpc"`
			EnvoyHTTPAls      *serviceRef `json:"envoyHttpAls"`
		} `json:"extensionProviders"`
	}
	if err := yaml.Unmarshal(files["mesh-config.yaml"], &mc); err != nil {
		return append(problems, "mesh-config.yaml: "+err.Error())
	}
	providers := 0
	for _, p := range mc.ExtensionProviders {
		for _, v := range []*serviceRef{p.EnvoyExtAuthzGrpc, p.EnvoyHTTPAls} {
			if v == nil {
				continue
			}
			providers++
			if v.Service != ts.host || v.Port != ts.grpcPort {
				problems = append(problems, fmt.Sprintf("mesh-config.yaml: provider %s reaches %s:%d, but the chart's Service is %s with port grpc %d (targetPort %d): Istio looks the provider's port up as a Service port", p.Name, v.Service, v.Port, ts.host, ts.grpcPort, ts.targetPort))
			}
		}
	}
	if providers < 2 {
		problems = append(problems, fmt.Sprintf("mesh-config.yaml: %d envoyExtAuthzGrpc or envoyHttpAls providers, want 2", providers))
	}
	return problems
}

func readIstioManifests(t testing.TB) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(istioDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", istioDir, err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = data
	}
	return files
}

// TestIstioReachesService: istio/*.yaml name the cluster and providers of
// the Service the chart renders, by its Service port.
func TestIstioReachesService(t *testing.T) {
	t.Parallel()
	files := readIstioManifests(t)
	for _, tc := range []struct {
		name string
		give []string // helm args
		want []string // substrings of one problem; none when empty
	}{
		{name: "defaults"},
		{name: "istio values", give: []string{"--values", filepath.Join(chartDir, "ci", "istio.yaml")}},
		{
			name: "another gRPC port", give: []string{"--set", "ports.grpc=9091"},
			want: []string{"outbound|8081||tollgate.tollgate.svc.cluster.local", "Service port grpc is 9091"},
		},
		{
			name: "another release name", give: []string{"--set", "fullnameOverride=limiter"},
			want: []string{"ratelimit.yaml", "outbound|8081||tollgate.tollgate.svc.cluster.local", "limiter.tollgate.svc.cluster.local"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts, problems := renderTollgateService(t, tc.give...)
			problems = append(problems, checkIstioRefs(ts, files)...)
			if len(tc.want) == 0 {
				for _, p := range problems {
					t.Error(p)
				}
				return
			}
			for _, p := range problems {
				if containsAll(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem contains all of %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
		})
	}
}

// TestHeadlessServiceRefused: the check refuses a headless Service, which
// the chart's schema cannot render.
func TestHeadlessServiceRefused(t *testing.T) {
	t.Parallel()
	svc := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "grpc", Port: 8081}}}}
	svc.Name, svc.Namespace = "tollgate", "tollgate"
	_, problems := resolveGRPCPort(svc, &appsv1.Deployment{})
	if !containsAll(strings.Join(problems, "\n"), []string{"headless", "ORIGINAL_DST"}) {
		t.Errorf("problems %q: want the headless Service refused", problems)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// tollgateDrain is pkg/server's DefaultDrainTimeout: how long Tollgate lets
// calls finish after SIGTERM.
const tollgateDrain = 10 * time.Second

// TestIstioDrainOutlastsTollgate: with every values file the pods ask a
// classic Istio sidecar to drain longer than Tollgate does, and to be done
// before the kubelet's SIGKILL; a pod annotation of the user's own wins.
func TestIstioDrainOutlastsTollgate(t *testing.T) {
	t.Parallel()
	for _, values := range valuesFiles(t) {
		dep := one[*appsv1.Deployment](t, mustRender(t, values), "Deployment")
		raw, ok := dep.Spec.Template.Annotations["proxy.istio.io/config"]
		if !ok {
			t.Errorf("%s: no proxy.istio.io/config annotation", caseName(values))
			continue
		}
		var cfg struct {
			TerminationDrainDuration string `json:"terminationDrainDuration"`
		}
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			t.Errorf("%s: proxy.istio.io/config %q: %v", caseName(values), raw, err)
			continue
		}
		d, err := time.ParseDuration(cfg.TerminationDrainDuration)
		grace := time.Duration(*dep.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
		if err != nil || d <= tollgateDrain || d >= grace {
			t.Errorf("%s: sidecar drain %q (%v): want above Tollgate's %v and below the grace period %v", caseName(values), cfg.TerminationDrainDuration, err, tollgateDrain, grace)
		}
	}
	own := filepath.Join(t.TempDir(), "own.yaml")
	if err := os.WriteFile(own, []byte("podAnnotations:\n  proxy.istio.io/config: '{\"holdApplicationUntilProxyStarts\": true}'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dep := one[*appsv1.Deployment](t, mustRender(t, own), "Deployment")
	if got := dep.Spec.Template.Annotations["proxy.istio.io/config"]; got != `{"holdApplicationUntilProxyStarts": true}` {
		t.Errorf("the user's own proxy.istio.io/config became %q", got)
	}
}
