package istio

// The ext_proc usage reader (istio/ext-proc.yaml): an EnvoyFilter that
// inserts Envoy's ext_proc filter, in observability mode, after the
// ext_authz filter Istio builds for the CUSTOM policy. The lints are those
// of test/envoyconfig's extproc_test.go for the filter itself, plus
// Istio's placement and the link to the AuthorizationPolicy whose Check
// writes the ticket.

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

const (
	// extAuthzFilter is the HTTP filter Istio builds for a CUSTOM
	// AuthorizationPolicy (wellknown.HTTPExternalAuthorization), and the
	// dynamic metadata namespace Envoy's ext_authz writes Check's
	// metadata, the ticket among it, under.
	extAuthzFilter = "envoy.filters.http.ext_authz"
)

// extProcPatch is an ext_proc filter an EnvoyFilter inserts.
type extProcPatch struct {
	r    resource
	ef   *networkingv1alpha3.EnvoyFilter
	path string
	cp   *networkingapi.EnvoyFilter_EnvoyConfigObjectPatch
	cfg  *extprocv3.ExternalProcessor
}

// extProcPatches returns the ext_proc filters of an EnvoyFilter.
func extProcPatches(r resource, ef *networkingv1alpha3.EnvoyFilter, patches []envoyPatch) []extProcPatch {
	var out []extProcPatch
	for _, p := range patches {
		f, ok := p.value.(*hcmv3.HttpFilter)
		if !ok {
			continue
		}
		inner, err := typedConfig(f.GetTypedConfig())
		if err != nil {
			continue // deepValidate reports it
		}
		if c, ok := inner.(*extprocv3.ExternalProcessor); ok {
			out = append(out, extProcPatch{r: r, ef: ef, path: p.path + " value.typed_config<ExternalProcessor>", cp: p.cp, cfg: c})
		}
	}
	return out
}

// lintExtProcs checks each ext_proc filter, and that it runs where a
// CUSTOM policy's Check writes the ticket.
func lintExtProcs(procs []extProcPatch, policies []resource, m mesh) []string {
	var problems []string
	for _, p := range procs {
		problems = append(problems, lintExtProc(p, m)...)
		sel := p.ef.Spec.GetWorkloadSelector().GetLabels()
		found := slices.ContainsFunc(policies, func(pr resource) bool {
			ap := pr.obj.(*securityv1.AuthorizationPolicy)
			return pr.meta().GetNamespace() == p.r.meta().GetNamespace() &&
				m.providers[ap.Spec.GetProvider().GetName()].GetEnvoyExtAuthzGrpc() != nil &&
				sameLabels(ap.Spec.GetSelector().GetMatchLabels(), sel)
		})
		if !found {
			problems = append(problems, fmt.Sprintf("%s: no CUSTOM AuthorizationPolicy with an envoyExtAuthzGrpc provider selects the same workload (namespace %s, labels %v): its requests carry no ticket, and the INSERT_AFTER %s patch finds no filter to follow", p.r, p.r.meta().GetNamespace(), sel, extAuthzFilter))
		}
	}
	return problems
}

// lintExtProc checks one ext_proc filter's placement and configuration.
func lintExtProc(p extProcPatch, m mesh) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, p.path+fmt.Sprintf(format, args...))
	}
	match := p.cp.GetMatch()
	switch match.GetContext() {
	case networkingapi.EnvoyFilter_SIDECAR_INBOUND, networkingapi.EnvoyFilter_GATEWAY:
	default:
		add(": match.context is %v: want SIDECAR_INBOUND or GATEWAY, where the CUSTOM policy's ext_authz filter runs", match.GetContext())
	}
	fc := match.GetListener().GetFilterChain().GetFilter()
	if fc.GetName() != hcmFilter {
		add(": match.listener.filterChain.filter.name is %q, want %q", fc.GetName(), hcmFilter)
	}
	if op := p.cp.GetPatch().GetOperation(); op != networkingapi.EnvoyFilter_Patch_INSERT_AFTER || fc.GetSubFilter().GetName() != extAuthzFilter {
		add(": inserted with %v relative to subFilter %q: insert it INSERT_AFTER subFilter %s, so that it runs after Check wrote the ticket", op, fc.GetSubFilter().GetName(), extAuthzFilter)
	}

	c := p.cfg
	g := c.GetGrpcService().GetEnvoyGrpc()
	switch sm := outboundCluster.FindStringSubmatch(g.GetClusterName()); {
	case g.GetClusterName() == "":
		add(".grpc_service: want envoy_grpc with a cluster_name (Tollgate serves ext_proc over gRPC)")
	case sm == nil:
		add(".grpc_service.envoy_grpc.cluster_name %q is not Istio's outbound|%d||<host> cluster for Tollgate", g.GetClusterName(), tollgatePort)
	default:
		if sm[1] != fmt.Sprint(tollgatePort) {
			add(".grpc_service.envoy_grpc.cluster_name %q: port %s, want %d (Tollgate's gRPC port)", g.GetClusterName(), sm[1], tollgatePort)
		}
		if m.host != "" && sm[2] != m.host {
			add(".grpc_service.envoy_grpc.cluster_name %q: host %s, but the extension providers in %s reach Tollgate at %s", g.GetClusterName(), sm[2], meshConfigFile, m.host)
		}
		if g.GetAuthority() != "" && g.GetAuthority() != sm[2] {
			add(".grpc_service.envoy_grpc.authority %q is not the cluster's host %s", g.GetAuthority(), sm[2])
		}
	}
	if !c.GetObservabilityMode() {
		add(".observability_mode is false: Envoy would wait for Tollgate on every response chunk")
	}
	if !c.GetFailureModeAllow() {
		add(".failure_mode_allow is false: a Tollgate outage would fail responses; the access log or expiry still ends the reservation")
	}
	if !slices.Contains(c.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), extAuthzFilter) {
		add(".metadata_options.forwarding_namespaces.untyped does not list %s: Tollgate gets no ticket and reads nothing", extAuthzFilter)
	}
	pm := c.GetProcessingMode()
	want := func(field string, got, wantV fmt.Stringer) {
		if got.String() != wantV.String() {
			add(".processing_mode.%s is %v, want %v", field, got, wantV)
		}
	}
	want("request_header_mode", headerMode(pm.GetRequestHeaderMode(), false), extprocv3.ProcessingMode_SKIP)
	want("request_body_mode", pm.GetRequestBodyMode(), extprocv3.ProcessingMode_NONE)
	want("request_trailer_mode", headerMode(pm.GetRequestTrailerMode(), true), extprocv3.ProcessingMode_SKIP)
	want("response_header_mode", headerMode(pm.GetResponseHeaderMode(), false), extprocv3.ProcessingMode_SEND)
	want("response_body_mode", pm.GetResponseBodyMode(), extprocv3.ProcessingMode_STREAMED)
	want("response_trailer_mode", headerMode(pm.GetResponseTrailerMode(), true), extprocv3.ProcessingMode_SEND)
	return problems
}

// headerMode resolves DEFAULT to what Envoy does for it in a filter's
// processing_mode: headers are sent, trailers skipped.
func headerMode(m extprocv3.ProcessingMode_HeaderSendMode, trailer bool) extprocv3.ProcessingMode_HeaderSendMode {
	if m != extprocv3.ProcessingMode_DEFAULT {
		return m
	}
	if trailer {
		return extprocv3.ProcessingMode_SKIP
	}
	return extprocv3.ProcessingMode_SEND
}

// TestExtProcCatches changes one thing in ext-proc.yaml (or in the policy
// it depends on) per case and requires a problem containing every wanted
// string.
func TestExtProcCatches(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	e := mustEnv(t)
	const ep = "ext-proc.yaml"
	for _, tt := range []struct {
		name     string
		file     string
		old, new string
		want     []string
	}{
		{
			name: "unknown field in the filter", file: ep,
			old: "observability_mode: true", new: "observability_modee: true",
			want: []string{"configPatches[0] (HTTP_FILTER INSERT_AFTER)", `unknown field "observability_modee"`},
		},
		{
			name: "PGV inside the typed_config", file: ep,
			old: "request_trailer_mode: SKIP", new: "request_trailer_mode: 7",
			want: []string{"typed_config<ExternalProcessor>.processing_mode", "RequestTrailerMode", "defined enum"},
		},
		{
			name: "observability mode off", file: ep,
			old: "observability_mode: true", new: "observability_mode: false",
			want: []string{"typed_config<ExternalProcessor>.observability_mode is false"},
		},
		{
			name: "fails closed", file: ep,
			old: "failure_mode_allow: true", new: "failure_mode_allow: false",
			want: []string{"typed_config<ExternalProcessor>.failure_mode_allow is false"},
		},
		{
			name: "response body buffered", file: ep,
			old: "response_body_mode: STREAMED", new: "response_body_mode: BUFFERED",
			want: []string{"processing_mode.response_body_mode is BUFFERED, want STREAMED"},
		},
		{
			name: "request headers sent", file: ep,
			old: "request_header_mode: SKIP", new: "request_header_mode: SEND",
			want: []string{"processing_mode.request_header_mode is SEND, want SKIP"},
		},
		{
			name: "response trailers skipped", file: ep,
			old: "response_trailer_mode: SEND", new: "response_trailer_mode: SKIP",
			want: []string{"processing_mode.response_trailer_mode is SKIP, want SEND"},
		},
		{
			name: "ext_authz namespace not forwarded", file: ep,
			old: "untyped: [envoy.filters.http.ext_authz]", new: "untyped: [envoy.filters.http.ext_auth]",
			want: []string{"forwarding_namespaces.untyped does not list envoy.filters.http.ext_authz"},
		},
		{
			name: "before the router, not after ext_authz", file: ep,
			old: "              name: envoy.filters.http.ext_authz\n    patch:\n      operation: INSERT_AFTER", new: "              name: envoy.filters.http.router\n    patch:\n      operation: INSERT_BEFORE",
			want: []string{"inserted with INSERT_BEFORE relative to subFilter \"envoy.filters.http.router\"", "INSERT_AFTER subFilter envoy.filters.http.ext_authz"},
		},
		{
			name: "outbound context", file: ep,
			old: "context: SIDECAR_INBOUND", new: "context: SIDECAR_OUTBOUND",
			want: []string{"match.context is SIDECAR_OUTBOUND"},
		},
		{
			name: "cluster on the wrong port", file: ep,
			old: "cluster_name: outbound|8081||", new: "cluster_name: outbound|8080||",
			want: []string{"cluster_name", "port 8080, want 8081"},
		},
		{
			name: "cluster on another host", file: ep,
			old: "cluster_name: outbound|8081||tollgate.tollgate.svc", new: "cluster_name: outbound|8081||tollgate.default.svc",
			want: []string{"cluster_name", "tollgate.default.svc.cluster.local", "extension providers"},
		},
		{
			name: "not Istio's cluster", file: ep,
			old: "cluster_name: outbound|8081||tollgate.tollgate.svc.cluster.local", new: "cluster_name: tollgate",
			want: []string{`cluster_name "tollgate" is not Istio's outbound|8081||<host> cluster`},
		},
		{
			name: "another workload than the policy's", file: ep,
			old: "app: inference-backend", new: "app: inference-gateway",
			want: []string{"EnvoyFilter inference/tollgate-ext-proc", "no CUSTOM AuthorizationPolicy", "selects the same workload"},
		},
		{
			name: "policy in another namespace", file: "ext-authz.yaml",
			old: "  namespace: inference\n", new: "  namespace: models\n",
			want: []string{"EnvoyFilter inference/tollgate-ext-proc", "no CUSTOM AuthorizationPolicy"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			runCatch(t, files, e, tt.file, [][2]string{{tt.old, tt.new}}, tt.want)
		})
	}
}

// TestExtProcPatchDecodes pins that ext-proc.yaml holds one ext_proc
// filter the lints see.
func TestExtProcPatchDecodes(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	rs, err := decodeResources("ext-proc.yaml", files["ext-proc.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	ef := rs[0].obj.(*networkingv1alpha3.EnvoyFilter)
	patches, problems := decodePatches(rs[0], &ef.Spec)
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
	if got := extProcPatches(rs[0], ef, patches); len(got) != 1 || !got[0].cfg.GetObservabilityMode() {
		t.Fatalf("ext_proc filters = %v, want one in observability mode", got)
	}
}
