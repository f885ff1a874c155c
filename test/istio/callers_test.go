package istio

// The caller policy (tollgate-callers.yaml): an AuthorizationPolicy DENY
// on Tollgate's own pods that keeps every caller but the filters' sidecars
// away from the outcome APIs. Its pitfalls all fail open (the APIs stay
// reachable by every workload) or break settlement (the real sender is
// refused), silently; the lint below catches each.

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
)

const callersFile = "tollgate-callers.yaml"

// outcomeServices are the gRPC services that take outcomes, which the
// policy must restrict. The names are those Tollgate registers
// (pkg/app's TestGRPCServicesNames pins them to go-control-plane's
// service descriptors).
var outcomeServices = []string{
	"envoy.service.accesslog.v3.AccessLogService",
	"envoy.service.ext_proc.v3.ExternalProcessor",
}

// tollgateServices are every gRPC service on Tollgate's port: a path for
// any other service matches nothing Tollgate serves.
var tollgateServices = append([]string{
	"envoy.service.ratelimit.v3.RateLimitService",
	"envoy.service.auth.v3.Authorization",
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
}, outcomeServices...)

// tollgatePodLabels are the labels charts/tollgate gives the pods of a
// release named tollgate; the policy's selector must pick them.
var tollgatePodLabels = map[string]string{
	"app.kubernetes.io/name":     "tollgate",
	"app.kubernetes.io/instance": "tollgate",
}

// istioPrincipal is Istio's form of a SPIFFE ID: trust domain, namespace
// and service account, without spiffe://; the account may be a trailing *.
var istioPrincipal = regexp.MustCompile(`^([a-z0-9.-]+)/ns/([a-z0-9-]+)/sa/([a-z0-9.-]+|\*)$`)

// isCallersPolicy tells a caller policy from the ext_authz one: it names
// no provider and is not CUSTOM.
func isCallersPolicy(o *securityv1.AuthorizationPolicy) bool {
	return o.Spec.GetProvider() == nil && o.Spec.GetAction() != securityapi.AuthorizationPolicy_CUSTOM
}

// lintCallers checks a DENY policy meant to restrict Tollgate's callers.
// telemetries are the Telemetry resources of the set, to check that the
// workloads sending the access log are not refused.
func lintCallers(r resource, o *securityv1.AuthorizationPolicy, m mesh, telemetries []resource, extProcs []extProcPatch) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, r.String()+": "+fmt.Sprintf(format, args...))
	}
	s := &o.Spec
	if s.GetAction() != securityapi.AuthorizationPolicy_DENY {
		add("spec.action is %v: want DENY, which is checked before every ALLOW policy (Istio ORs ALLOW policies, so a broader one elsewhere would reopen the outcome APIs)", s.GetAction())
		return problems
	}
	if ns := tollgateNamespace(m.host); ns != "" && r.meta().GetNamespace() != ns {
		add("metadata.namespace is %s, but Tollgate runs in %s (%s in %s): the policy would not apply to Tollgate's pods", r.meta().GetNamespace(), ns, m.host, meshConfigFile)
	}
	labels := s.GetSelector().GetMatchLabels()
	if len(labels) == 0 {
		add("spec.selector.matchLabels is empty: the policy would apply to every workload in namespace %s", r.meta().GetNamespace())
	}
	for k, v := range labels {
		if tollgatePodLabels[k] != v {
			add("spec.selector.matchLabels %s: %s does not select Tollgate's pods (labelled %v by charts/tollgate): the outcome APIs stay open to every workload", k, v, tollgatePodLabels)
		}
	}
	if len(s.GetTargetRefs()) > 0 || s.GetTargetRef() != nil {
		add("spec.targetRefs: select Tollgate's pods with spec.selector; a targetRef applies only to waypoints and gateways")
	}
	if len(s.GetRules()) == 0 {
		add("spec.rules is empty: a DENY policy without rules denies nothing")
	}

	restricted := map[string][]string{} // service -> principals allowed to call it
	for i, rule := range s.GetRules() {
		path := fmt.Sprintf("spec.rules[%d]", i)
		// Every condition besides the caller and the path narrows what is
		// denied, and what is not denied is open.
		if len(rule.GetWhen()) > 0 {
			add("%s.when: a condition narrows the denial; callers that do not meet it get through", path)
		}
		var allowed []string
		if len(rule.GetFrom()) != 1 {
			add("%s.from: want exactly one source with notPrincipals (have %d)", path, len(rule.GetFrom()))
		}
		for j, f := range rule.GetFrom() {
			src := f.GetSource()
			if narrowsSource(src) {
				add("%s.from[%d].source: only notPrincipals may be set; any other field narrows the denial, and the callers it leaves out get through", path, j)
			}
			if len(src.GetNotPrincipals()) == 0 {
				add("%s.from[%d].source.notPrincipals is empty: the rule would refuse the filters' sidecars too, and no outcome would ever arrive", path, j)
			}
			for _, p := range src.GetNotPrincipals() {
				switch {
				case strings.HasPrefix(p, "spiffe://"):
					add("%s.from[%d].source.notPrincipals %q: Istio writes principals without spiffe://, so it matches nobody and the filters' sidecars are refused", path, j, p)
				case !istioPrincipal.MatchString(p):
					add("%s.from[%d].source.notPrincipals %q: want TRUST_DOMAIN/ns/NAMESPACE/sa/ACCOUNT (ACCOUNT may be *); a wider pattern lets other workloads through", path, j, p)
				}
				allowed = append(allowed, p)
			}
		}
		if len(rule.GetTo()) != 1 {
			add("%s.to: want exactly one operation with paths (have %d)", path, len(rule.GetTo()))
		}
		for j, t := range rule.GetTo() {
			op := t.GetOperation()
			if narrowsOperation(op) {
				add("%s.to[%d].operation: only paths may be set; any other field narrows the denial, and the calls it leaves out get through", path, j)
			}
			if len(op.GetPaths()) == 0 {
				add("%s.to[%d].operation.paths is empty: the rule would refuse every call of other workloads, Check and rate limit included, and every request to the admin port (metrics)", path, j)
			}
			for _, p := range op.GetPaths() {
				svc, ok := strings.CutSuffix(strings.TrimPrefix(p, "/"), "/*")
				if !strings.HasPrefix(p, "/") || !ok || !slices.Contains(tollgateServices, svc) {
					add("%s.to[%d].operation.paths %q: want /SERVICE/* for one of Tollgate's gRPC services %v; gRPC paths are /SERVICE/METHOD, so anything else matches no call or more than one service", path, j, p, tollgateServices)
					continue
				}
				restricted[svc] = append(restricted[svc], allowed...)
			}
		}
	}
	for _, svc := range outcomeServices {
		if _, ok := restricted[svc]; !ok {
			add("no rule restricts %s: every workload of the mesh can report outcomes to it", svc)
		}
	}

	// A namespace that sends its access log to Tollgate must have a
	// principal in the list, or every entry it sends is refused and no
	// reservation is ever settled.
	als := "envoy.service.accesslog.v3.AccessLogService"
	for _, tr := range telemetries {
		if _, ok := restricted[als]; !ok || !sendsToTollgate(tr.obj.(*telemetryv1.Telemetry), m) {
			continue
		}
		ns := tr.meta().GetNamespace()
		if !slices.ContainsFunc(restricted[als], func(p string) bool {
			sm := istioPrincipal.FindStringSubmatch(p)
			return sm != nil && sm[2] == ns
		}) {
			add("%s sends the access log of namespace %s to Tollgate, but no notPrincipals of the rule for %s is in that namespace: every entry would be refused (add cluster.local/ns/%s/sa/ACCOUNT)", tr, ns, als, ns)
		}
	}
	// Likewise a namespace whose sidecars run the ext_proc usage reader:
	// refused, its streams would settle nothing.
	const xp = "envoy.service.ext_proc.v3.ExternalProcessor"
	for _, e := range extProcs {
		ns := e.r.meta().GetNamespace()
		if _, ok := restricted[xp]; !ok || slices.ContainsFunc(restricted[xp], func(p string) bool {
			sm := istioPrincipal.FindStringSubmatch(p)
			return sm != nil && sm[2] == ns
		}) {
			continue
		}
		add("%s runs the ext_proc usage reader in namespace %s, but no notPrincipals of the rule for %s is in that namespace: every stream would be refused and no reservation settled (add cluster.local/ns/%s/sa/ACCOUNT)", e.r, ns, xp, ns)
	}
	return problems
}

// tollgateNamespace is the namespace of a Service host NAME.NAMESPACE.svc....
func tollgateNamespace(host string) string {
	parts := strings.Split(host, ".")
	if len(parts) < 3 || parts[2] != "svc" {
		return ""
	}
	return parts[1]
}

func narrowsSource(s *securityapi.Source) bool {
	return len(s.GetPrincipals())+len(s.GetRequestPrincipals())+len(s.GetNotRequestPrincipals())+
		len(s.GetNamespaces())+len(s.GetNotNamespaces())+len(s.GetServiceAccounts())+len(s.GetNotServiceAccounts())+
		len(s.GetIpBlocks())+len(s.GetNotIpBlocks())+len(s.GetRemoteIpBlocks())+len(s.GetNotRemoteIpBlocks())+
		len(s.GetTrustDomains())+len(s.GetNotTrustDomains()) > 0
}

func narrowsOperation(o *securityapi.Operation) bool {
	return len(o.GetHosts())+len(o.GetNotHosts())+len(o.GetPorts())+len(o.GetNotPorts())+
		len(o.GetMethods())+len(o.GetNotMethods())+len(o.GetNotPaths()) > 0
}

// sendsToTollgate reports whether a Telemetry sends access logs to an
// envoyHttpAls provider, which reach Tollgate.
func sendsToTollgate(tm *telemetryv1.Telemetry, m mesh) bool {
	for _, al := range tm.Spec.GetAccessLogging() {
		for _, p := range al.GetProviders() {
			if m.providers[p.GetName()].GetEnvoyHttpAls() != nil {
				return true
			}
		}
	}
	return false
}

// TestCallersCatches changes one thing in tollgate-callers.yaml per case
// and requires a problem naming it.
func TestCallersCatches(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	e := mustEnv(t)
	const deny = "AuthorizationPolicy tollgate/tollgate-callers"
	for _, tc := range []struct {
		name     string
		file     string
		old, new string
		more     [][2]string // further edits of the same file
		want     []string
	}{
		{
			name: "ALLOW instead of DENY", file: callersFile,
			old: "action: DENY", new: "action: ALLOW",
			want: []string{deny, "spec.action is ALLOW", "DENY"},
		},
		{
			name: "another namespace", file: callersFile,
			old: "  namespace: tollgate\n", new: "  namespace: inference\n",
			want: []string{"tollgate-callers", "metadata.namespace is inference, but Tollgate runs in tollgate"},
		},
		{
			name: "selector of another workload", file: callersFile,
			old: "      app.kubernetes.io/name: tollgate\n", new: "      app: tollgate\n",
			want: []string{deny, "spec.selector.matchLabels app: tollgate does not select Tollgate's pods"},
		},
		{
			name: "principal as a SPIFFE URI", file: callersFile,
			old: "- cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.accesslog", new: "- spiffe://cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.accesslog",
			want: []string{deny, "spec.rules[0].from[0].source.notPrincipals", "without spiffe://"},
		},
		{
			name: "every principal", file: callersFile,
			old: "- cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.ext_proc", new: "- \"*\"\n    to:\n    - operation:\n        paths:\n        - /envoy.service.ext_proc",
			want: []string{deny, `spec.rules[1].from[0].source.notPrincipals "*"`, "want TRUST_DOMAIN/ns/NAMESPACE/sa/ACCOUNT"},
		},
		{
			name: "principals instead of notPrincipals", file: callersFile,
			old: "    - source:\n        notPrincipals:\n        - cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.ext_proc", new: "    - source:\n        principals:\n        - cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.ext_proc",
			want: []string{deny, "only notPrincipals may be set"},
		},
		{
			name: "a narrowing method", file: callersFile,
			old: "    - operation:\n        paths:\n        - /envoy.service.accesslog", new: "    - operation:\n        methods: [GET]\n        paths:\n        - /envoy.service.accesslog",
			want: []string{deny, "spec.rules[0].to[0].operation: only paths may be set"},
		},
		{
			name: "a narrowing condition", file: callersFile,
			old: "        - /envoy.service.ext_proc.v3.ExternalProcessor/*\n", new: "        - /envoy.service.ext_proc.v3.ExternalProcessor/*\n    when:\n    - key: request.headers[x-probe]\n      values: [\"1\"]\n",
			want: []string{deny, "spec.rules[1].when"},
		},
		{
			name: "the access log left open", file: callersFile,
			old: "        - /envoy.service.accesslog.v3.AccessLogService/*\n", new: "        - /envoy.service.ext_proc.v3.ExternalProcessor/*\n",
			want: []string{deny, "no rule restricts envoy.service.accesslog.v3.AccessLogService"},
		},
		{
			name: "ext_proc left open", file: callersFile,
			old: "        - /envoy.service.ext_proc.v3.ExternalProcessor/*\n", new: "        - /envoy.service.accesslog.v3.AccessLogService/*\n",
			want: []string{deny, "no rule restricts envoy.service.ext_proc.v3.ExternalProcessor"},
		},
		{
			name: "path without the method wildcard", file: callersFile,
			old: "- /envoy.service.accesslog.v3.AccessLogService/*", new: "- /envoy.service.accesslog.v3.AccessLogService",
			want: []string{deny, `paths "/envoy.service.accesslog.v3.AccessLogService"`, "want /SERVICE/*"},
		},
		{
			name: "misspelt service", file: callersFile,
			old: "- /envoy.service.accesslog.v3.AccessLogService/*", new: "- /envoy.service.accesslog.v3.AccesslogService/*",
			want: []string{deny, `paths "/envoy.service.accesslog.v3.AccesslogService/*"`, "want /SERVICE/*"},
		},
		{
			name: "the access log's sender refused", file: callersFile,
			old: "- cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.accesslog", new: "- cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account\n    to:\n    - operation:\n        paths:\n        - /envoy.service.accesslog",
			want: []string{"Telemetry inference/tollgate-access-log", "sends the access log of namespace inference", "every entry would be refused"},
		},
		{
			name: "the usage reader's sidecar refused", file: callersFile,
			old: "- cluster.local/ns/inference/sa/inference-backend\n    to:\n    - operation:\n        paths:\n        - /envoy.service.ext_proc", new: "- cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account\n    to:\n    - operation:\n        paths:\n        - /envoy.service.ext_proc",
			want: []string{"EnvoyFilter inference/", "runs the ext_proc usage reader in namespace inference", "every stream would be refused"},
		},
		{
			name: "Tollgate moved, the policy not", file: meshConfigFile,
			old: "    service: tollgate.tollgate.svc.cluster.local\n    port: 8081\n    # 250ms", new: "    service: tollgate.gate.svc.cluster.local\n    port: 8081\n    # 250ms",
			more: [][2]string{{"    service: tollgate.tollgate.svc.cluster.local\n    port: 8081\n    # Sent", "    service: tollgate.gate.svc.cluster.local\n    port: 8081\n    # Sent"}},
			want: []string{deny, "but Tollgate runs in gate"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runCatch(t, files, e, tc.file, append([][2]string{{tc.old, tc.new}}, tc.more...), tc.want)
		})
	}
}

func TestCallersKind(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	rs, err := decodeResources(callersFile, files[callersFile])
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%s holds %d objects, want 1", callersFile, len(rs))
	}
	ap, ok := rs[0].obj.(*securityv1.AuthorizationPolicy)
	if !ok || ap.Spec.GetAction() != securityapi.AuthorizationPolicy_DENY {
		t.Fatalf("%s holds %v, want an AuthorizationPolicy with action DENY", callersFile, rs[0])
	}
}
