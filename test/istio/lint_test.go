package istio

// Cross-references PGV cannot see: between the manifests (provider names,
// selectors, Tollgate's host and port), and between the manifests and
// Tollgate's own config (the ratelimit domain and descriptors against
// config/*.yaml, body size and usage header against config/authz/authz.yaml),
// plus the EnvoyFilter pitfalls that make Istio or Envoy ignore a patch
// without an error.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingapi "istio.io/api/networking/v1alpha3"
	telemetryapi "istio.io/api/telemetry/v1alpha1"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
	"sigs.k8s.io/yaml"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	h2mv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const (
	manifestDir    = "../../istio"
	meshConfigFile = "mesh-config.yaml"
	rulesDir       = "../../config"
	authzConfig    = "../../config/authz/authz.yaml"

	// tollgatePort is Tollgate's gRPC port: RLS, ext_authz and ALS.
	tollgatePort = 8081

	// defaultMaxBodyBytes is Tollgate's estimate.max_body_bytes when
	// authz.yaml leaves it out (extauthz.DefaultMaxBodyBytes).
	defaultMaxBodyBytes = 1 << 20

	hcmFilter    = "envoy.filters.network.http_connection_manager"
	routerFilter = "envoy.filters.http.router"
)

// sampleValues are the descriptor values used to check that a descriptor
// built from request headers matches a Tollgate rule. A descriptor key
// with no sample here is a problem: add one.
var sampleValues = map[string]string{
	"tenant": "x",
	"model":  "gpt-4o",
	"user":   "u-1",
}

// env is Tollgate's side of the wiring.
type env struct {
	rules *limit.RuleSet
	authz authzSettings
}

// authzSettings is what the wiring needs from config/authz/authz.yaml,
// read with a plain YAML decode as test/envoyconfig does.
type authzSettings struct {
	UsageHeader   string   `json:"usage_header"`
	APIKeyHeaders []string `json:"api_key_headers"`
	Estimate      struct {
		MaxBodyBytes int64 `json:"max_body_bytes"`
	} `json:"estimate"`
}

func loadEnv() (env, error) {
	rules, err := config.Load(rulesDir)
	if err != nil {
		return env{}, fmt.Errorf("config.Load(%s): %w", rulesDir, err)
	}
	data, err := os.ReadFile(authzConfig)
	if err != nil {
		return env{}, err
	}
	var s authzSettings
	if err := yaml.Unmarshal(data, &s); err != nil {
		return env{}, fmt.Errorf("%s: %w", authzConfig, err)
	}
	if s.Estimate.MaxBodyBytes == 0 {
		s.Estimate.MaxBodyBytes = defaultMaxBodyBytes
	}
	if len(s.APIKeyHeaders) == 0 {
		s.APIKeyHeaders = []string{"authorization", "x-api-key"} // extauthz.DefaultAPIKeyHeaders
	}
	return env{rules: rules, authz: s}, nil
}

// readManifests reads istio/*.yaml by base name.
func readManifests() (map[string][]byte, error) {
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out[filepath.Base(f)] = data
	}
	return out, nil
}

// check decodes, validates and lints a set of manifests (base name ->
// content) as one deployment, and returns every problem found.
func check(files map[string][]byte, e env) []string {
	var problems []string
	var mc *meshv1alpha1.MeshConfig
	var resources []resource
	for _, name := range sortedKeys(files) {
		if name == meshConfigFile {
			m, err := decodeMeshConfig(name, files[name])
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			mc = m
			continue
		}
		rs, err := decodeResources(name, files[name])
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		resources = append(resources, rs...)
	}
	if mc == nil {
		return append(problems, meshConfigFile+": missing or not decodable; the extension providers are defined there")
	}
	return append(problems, lint(mc, resources, e)...)
}

// ---------------------------------------------------------------------------

// builtinProviders are the extension providers every mesh has: Istio adds
// its defaults to the configured ones (pkg/config/mesh/mesh.go,
// DefaultMeshConfig and ApplyMeshConfig); envoy is the stdout access log.
var builtinProviders = map[string]bool{"envoy": true, "prometheus": true, "stackdriver": true}

// mesh is what the lint needs from the mesh config.
type mesh struct {
	providers map[string]*meshv1alpha1.MeshConfig_ExtensionProvider
	host      string // Tollgate's Service host, from the providers
}

func lint(mc *meshv1alpha1.MeshConfig, resources []resource, e env) []string {
	m, problems := lintMesh(mc, e)
	var policies []resource
	var telemetries []resource
	var extProcs []extProcPatch
	var callers []resource // caller policies (callers_test.go), linted once the Telemetries are known
	var ports []*backendPorts
	for _, r := range resources {
		switch o := r.obj.(type) {
		case *securityv1.AuthorizationPolicy:
			if isCallersPolicy(o) {
				callers = append(callers, r)
				continue
			}
			problems = append(problems, lintPolicy(r, o, m)...)
			policies = append(policies, r)
		case *telemetryv1.Telemetry:
			problems = append(problems, lintTelemetry(r, o, m)...)
			telemetries = append(telemetries, r)
		case *networkingv1alpha3.EnvoyFilter:
			patches, more := decodePatches(r, &o.Spec)
			problems = append(problems, more...)
			if len(more) > 0 {
				// The cross-checks would only repeat the decode error
				// as a missing filter or cluster.
				continue
			}
			for _, p := range patches {
				if p.value != nil {
					problems = append(problems, deepValidate(p.path+" value", p.value, whole(p.cp.GetPatch().GetOperation()))...)
				}
			}
			problems = append(problems, lintEnvoyFilter(r, patches, m, e)...)
			problems = append(problems, lintProxyFloor(patches)...)
			bp, more := lintInboundPorts(r, patches)
			problems = append(problems, more...)
			if bp != nil {
				ports = append(ports, bp)
			}
			extProcs = append(extProcs, extProcPatches(r, o, patches)...)
		}
	}
	problems = append(problems, lintExtProcs(extProcs, policies, m)...)
	problems = append(problems, lintBackendPortsAgree(ports)...)
	for _, r := range callers {
		problems = append(problems, lintCallers(r, r.obj.(*securityv1.AuthorizationPolicy), m, telemetries, extProcs)...)
	}
	return append(problems, lintSettled(policies, telemetries, m)...)
}

func lintMesh(mc *meshv1alpha1.MeshConfig, e env) (mesh, []string) {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, meshConfigFile+": "+fmt.Sprintf(format, args...))
	}
	m := mesh{providers: map[string]*meshv1alpha1.MeshConfig_ExtensionProvider{}}
	hosts := map[string]bool{}
	for i, p := range mc.GetExtensionProviders() {
		path := fmt.Sprintf("extensionProviders[%d] (%s)", i, p.GetName())
		if _, dup := m.providers[p.GetName()]; dup {
			add("%s: name %q is used twice", path, p.GetName())
		}
		m.providers[p.GetName()] = p
		if a := p.GetEnvoyExtAuthzGrpc(); a != nil {
			hosts[a.GetService()] = true
			if a.GetPort() != tollgatePort {
				add("%s.envoyExtAuthzGrpc.port is %d, want %d (Tollgate's gRPC port)", path, a.GetPort(), tollgatePort)
			}
			if a.GetClearRouteCache() {
				add("%s.envoyExtAuthzGrpc.clearRouteCache is set: Istio never reads it for a gRPC provider (pilot/pkg/security/authz/builder/extauthz.go, generateGRPCConfig), so it changes nothing; remove it", path)
			}
			if a.GetTimeout().AsDuration() <= 0 {
				add("%s.envoyExtAuthzGrpc.timeout is not set: Envoy's 200ms default applies; set it explicitly, above Tollgate's p99.9 Check latency", path)
			}
			b := a.GetIncludeRequestBodyInCheck()
			switch {
			case b == nil:
				add("%s.envoyExtAuthzGrpc.includeRequestBodyInCheck is not set: Tollgate reads the model and estimates tokens from the body, so without it every request with a body is refused (500 request_body_not_checked) while the model is read from the body", path)
			case b.GetMaxRequestBytes() == 0:
				add("%s.envoyExtAuthzGrpc.includeRequestBodyInCheck.maxRequestBytes is 0", path)
			case int64(b.GetMaxRequestBytes()) > e.authz.Estimate.MaxBodyBytes:
				add("%s.envoyExtAuthzGrpc.includeRequestBodyInCheck.maxRequestBytes is %d, over estimate.max_body_bytes %d in %s: Tollgate refuses such a body with 413, so buffering it only costs memory", path, b.GetMaxRequestBytes(), e.authz.Estimate.MaxBodyBytes, authzConfig)
			case int64(b.GetMaxRequestBytes()) < e.authz.Estimate.MaxBodyBytes:
				add("%s.envoyExtAuthzGrpc.includeRequestBodyInCheck.maxRequestBytes is %d, under estimate.max_body_bytes %d in %s: a body in between is decided from its first %d bytes, so a model, max_tokens or n repeated after them goes unseen (docs/partial-bodies.md); keep the two equal", path, b.GetMaxRequestBytes(), e.authz.Estimate.MaxBodyBytes, authzConfig, b.GetMaxRequestBytes())
			}
			if b != nil && !b.GetAllowPartialMessage() {
				add("%s.envoyExtAuthzGrpc.includeRequestBodyInCheck.allowPartialMessage is false: Envoy answers a body over maxRequestBytes with its own plain-text 413 and never asks Tollgate, so the client gets no OpenAI-style error; set it true, and Tollgate refuses such a body itself (docs/partial-bodies.md)", path)
			}
			if b != nil && !b.GetPackAsBytes() {
				add("%s.envoyExtAuthzGrpc.includeRequestBodyInCheck.packAsBytes is false: a body cut at maxRequestBytes can end mid-character, and a protobuf string must be UTF-8, so Tollgate's gRPC server rejects the Check", path)
			}
		}
		if l := p.GetEnvoyHttpAls(); l != nil {
			hosts[l.GetService()] = true
			if l.GetPort() != tollgatePort {
				add("%s.envoyHttpAls.port is %d, want %d (Tollgate's gRPC port)", path, l.GetPort(), tollgatePort)
			}
			if l.GetLogName() == "" {
				add("%s.envoyHttpAls.logName is empty", path)
			}
			if e.authz.UsageHeader == "" {
				add("usage_header is not set in %s: the access log cannot correct token estimates", authzConfig)
			} else if !containsFold(l.GetAdditionalResponseHeadersToLog(), e.authz.UsageHeader) {
				add("%s.envoyHttpAls.additionalResponseHeadersToLog does not list %s, the usage_header of %s: every token estimate stands as the charge", path, e.authz.UsageHeader, authzConfig)
			}
			for _, h := range l.GetAdditionalRequestHeadersToLog() {
				if containsFold(e.authz.APIKeyHeaders, h) {
					add("%s.envoyHttpAls.additionalRequestHeadersToLog lists %s: every API key would be sent in the access log", path, h)
				}
			}
		}
	}
	switch len(hosts) {
	case 0:
		add("no envoyExtAuthzGrpc or envoyHttpAls provider")
	case 1:
		for h := range hosts {
			m.host = h
		}
		if m.host == "" {
			add("the providers' service is empty")
		}
	default:
		add("the providers name different services %v: Tollgate's ext_authz and access log must reach the same Tollgate", sortedKeys(hosts))
	}
	return m, problems
}

func lintPolicy(r resource, o *securityv1.AuthorizationPolicy, m mesh) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, r.String()+": "+fmt.Sprintf(format, args...))
	}
	s := &o.Spec
	if s.GetAction().String() != "CUSTOM" {
		add("spec.action is %v, want CUSTOM (the action that calls an ext_authz provider)", s.GetAction())
		return problems
	}
	name := s.GetProvider().GetName()
	p, ok := m.providers[name]
	switch {
	case !ok:
		add("spec.provider.name %q is not an extensionProviders name in %s (have %v): Istio rejects every request to the workload", name, meshConfigFile, sortedKeys(m.providers))
	case p.GetEnvoyExtAuthzGrpc() == nil:
		add("spec.provider.name %q is not an envoyExtAuthzGrpc provider: Tollgate serves ext_authz over gRPC only", name)
	}
	if len(s.GetRules()) == 0 {
		add("spec.rules is empty: a CUSTOM policy without rules matches no request, so Tollgate is never asked; use `rules: [{}]` for every request")
	}
	if len(s.GetSelector().GetMatchLabels()) == 0 && len(s.GetTargetRefs()) == 0 {
		add("spec has neither selector nor targetRefs: it applies to every workload in namespace %s", r.meta().GetNamespace())
	}
	return problems
}

func lintTelemetry(r resource, o *telemetryv1.Telemetry, m mesh) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, r.String()+": "+fmt.Sprintf(format, args...))
	}
	if len(o.Spec.GetAccessLogging()) == 0 {
		add("spec.accessLogging is empty")
	}
	for i, al := range o.Spec.GetAccessLogging() {
		path := fmt.Sprintf("spec.accessLogging[%d]", i)
		toTollgate, others := false, false
		for _, pr := range al.GetProviders() {
			if m.providers[pr.GetName()].GetEnvoyHttpAls() != nil {
				toTollgate = true
			} else {
				others = true
			}
		}
		if toTollgate && !others {
			add("%s.providers lists only Tollgate's: a Telemetry's providers replace the ones the workload inherits, so its stdout access log (meshConfig.accessLogFile or a mesh-wide Telemetry) would stop; list envoy (Istio's built-in stdout provider) or the mesh's own provider too", path)
		}
		for j, pr := range al.GetProviders() {
			if builtinProviders[pr.GetName()] {
				continue
			}
			p, ok := m.providers[pr.GetName()]
			if !ok {
				add("%s.providers[%d].name %q is not an extensionProviders name in %s (have %v)", path, j, pr.GetName(), meshConfigFile, sortedKeys(m.providers))
				continue
			}
			if p.GetEnvoyHttpAls() == nil {
				continue
			}
			if al.GetFilter() != nil {
				add("%s has a filter: Tollgate must see every entry, or the reservations of the requests left out are never settled", path)
			}
			if al.GetDisabled().GetValue() {
				add("%s is disabled", path)
			}
			if al.GetMatch().GetMode() == telemetryapi.WorkloadMode_CLIENT {
				add("%s.match.mode is CLIENT: the Check runs on the server (inbound) side, so no entry would carry a reservation", path)
			}
		}
	}
	return problems
}

// lintSettled: each workload that Tollgate's Check admits needs its access
// log sent to Tollgate, or no reservation is ever settled.
func lintSettled(policies, telemetries []resource, m mesh) []string {
	var problems []string
	for _, pr := range policies {
		ap := pr.obj.(*securityv1.AuthorizationPolicy)
		if p := m.providers[ap.Spec.GetProvider().GetName()]; p.GetEnvoyExtAuthzGrpc() == nil {
			continue
		}
		found := slices.ContainsFunc(telemetries, func(tr resource) bool {
			tm := tr.obj.(*telemetryv1.Telemetry)
			if tr.meta().GetNamespace() != pr.meta().GetNamespace() && tr.meta().GetNamespace() != "istio-system" {
				return false
			}
			if tr.meta().GetNamespace() == pr.meta().GetNamespace() && !sameLabels(tm.Spec.GetSelector().GetMatchLabels(), ap.Spec.GetSelector().GetMatchLabels()) && len(tm.Spec.GetSelector().GetMatchLabels()) > 0 {
				return false
			}
			for _, al := range tm.Spec.GetAccessLogging() {
				for _, prov := range al.GetProviders() {
					if m.providers[prov.GetName()].GetEnvoyHttpAls() != nil {
						return true
					}
				}
			}
			return false
		})
		if !found {
			problems = append(problems, fmt.Sprintf("%s: no Telemetry sends this workload's access log to an envoyHttpAls provider (same namespace and selector, or istio-system): Tollgate never settles a reservation (leases are held until they expire, token estimates are never corrected)", pr))
		}
	}
	return problems
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------------------
// EnvoyFilter

// rlFilter is an envoy.filters.http.ratelimit filter an EnvoyFilter inserts.
type rlFilter struct {
	path string
	name string
	cfg  *rlv3.RateLimit
	ctx  networkingapi.EnvoyFilter_PatchContext
}

func lintEnvoyFilter(r resource, patches []envoyPatch, m mesh, e env) []string {
	var problems []string
	if len(patches) == 0 {
		return nil
	}
	// Patches that belong together must apply together: with different
	// proxy or context matches, a proxy can get the filter without the
	// descriptors (no limiting, silently) or the reverse.
	first := patches[0].cp.GetMatch()
	for _, p := range patches[1:] {
		if !proto.Equal(p.cp.GetMatch().GetProxy(), first.GetProxy()) {
			problems = append(problems, fmt.Sprintf("%s: match.proxy differs from configPatches[0]'s: the patches would apply to different proxies", p.path))
		}
		if p.cp.GetMatch().GetContext() != first.GetContext() {
			problems = append(problems, fmt.Sprintf("%s: match.context %v differs from configPatches[0]'s %v", p.path, p.cp.GetMatch().GetContext(), first.GetContext()))
		}
	}

	clusters := map[string]*clusterv3.Cluster{}
	var filters []rlFilter
	written := map[string]bool{} // "namespace:key" set by header_to_metadata response rules
	for _, p := range patches {
		switch v := p.value.(type) {
		case *clusterv3.Cluster:
			if p.cp.GetPatch().GetOperation() == networkingapi.EnvoyFilter_Patch_ADD {
				clusters[v.GetName()] = v
			}
		case *hcmv3.HttpFilter:
			inner, err := typedConfig(v.GetTypedConfig())
			if err != nil {
				continue // deepValidate reports it
			}
			switch c := inner.(type) {
			case *rlv3.RateLimit:
				problems = append(problems, lintFilterPlacement(p, v.GetName())...)
				filters = append(filters, rlFilter{path: p.path + " value.typed_config<RateLimit>", name: v.GetName(), cfg: c, ctx: p.cp.GetMatch().GetContext()})
			case *h2mv3.Config:
				for _, rule := range c.GetResponseRules() {
					for _, kv := range []*h2mv3.Config_KeyValuePair{rule.GetOnHeaderPresent(), rule.GetOnHeaderMissing()} {
						if kv != nil {
							ns := kv.GetMetadataNamespace()
							if ns == "" {
								ns = "envoy.filters.http.header_to_metadata"
							}
							written[ns+":"+kv.GetKey()] = true
						}
					}
				}
			}
		}
	}

	byName := map[string]rlFilter{}
	for _, f := range filters {
		byName[f.name] = f
		problems = append(problems, lintRateLimitFilter(f, clusters, m, e)...)
	}

	for _, p := range patches {
		var vhPer map[string]*anypb.Any
		var vhLimits, routeLimits []*routev3.RateLimit
		switch v := p.value.(type) {
		case *routev3.VirtualHost:
			vhPer, vhLimits = v.GetTypedPerFilterConfig(), v.GetRateLimits()
		case *routev3.Route:
			vhPer, routeLimits = v.GetTypedPerFilterConfig(), v.GetRoute().GetRateLimits()
		default:
			continue
		}
		for _, key := range sortedKeys(vhPer) {
			inner, err := typedConfig(vhPer[key])
			if err != nil {
				continue
			}
			per, ok := inner.(*rlv3.RateLimitPerRoute)
			if !ok {
				continue
			}
			path := fmt.Sprintf("%s value.typed_per_filter_config[%q]<RateLimitPerRoute>", p.path, key)
			f, ok := byName[key]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: no envoy.filters.http.ratelimit filter of this EnvoyFilter is named %q (have %v): Envoy looks per-route config up by filter name and ignores this one without an error", path, key, sortedKeys(byName)))
				continue
			}
			if c := p.cp.GetMatch().GetContext(); c != f.ctx {
				problems = append(problems, fmt.Sprintf("%s: match.context %v, but the filter is inserted in %v", p.path, c, f.ctx))
			}
			domain := f.cfg.GetDomain()
			if per.GetDomain() != "" {
				domain = per.GetDomain()
				problems = append(problems, lintDomain(path+".domain", domain, e)...)
			}
			for i, rl := range per.GetRateLimits() {
				problems = append(problems, lintEntry(fmt.Sprintf("%s.rate_limits[%d]", path, i), rl, true, domain, written, e)...)
			}
			if len(per.GetRateLimits()) > 0 && len(vhLimits)+len(routeLimits) > 0 {
				problems = append(problems, fmt.Sprintf("%s: has rate_limits, so Envoy ignores the virtual host's and route's rate_limits in the same patch", path))
			}
		}
		for i, rl := range vhLimits {
			problems = append(problems, lintEntry(fmt.Sprintf("%s value.rate_limits[%d]", p.path, i), rl, false, firstDomain(filters), written, e)...)
		}
		for i, rl := range routeLimits {
			problems = append(problems, lintEntry(fmt.Sprintf("%s value.route.rate_limits[%d]", p.path, i), rl, false, firstDomain(filters), written, e)...)
		}
	}
	return problems
}

func firstDomain(filters []rlFilter) string {
	if len(filters) == 0 {
		return ""
	}
	return filters[0].cfg.GetDomain()
}

// lintFilterPlacement: the pitfalls that make Istio skip an HTTP_FILTER
// patch, or Envoy never run the filter, without an error.
func lintFilterPlacement(p envoyPatch, name string) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, p.path+": "+fmt.Sprintf(format, args...))
	}
	match := p.cp.GetMatch()
	switch match.GetContext() {
	case networkingapi.EnvoyFilter_SIDECAR_INBOUND, networkingapi.EnvoyFilter_GATEWAY:
	default:
		add("match.context is %v: want SIDECAR_INBOUND (the backend's sidecar) or GATEWAY; ANY and SIDECAR_OUTBOUND also limit the calls the workload makes", match.GetContext())
	}
	fc := match.GetListener().GetFilterChain().GetFilter()
	if fc.GetName() != hcmFilter {
		add("match.listener.filterChain.filter.name is %q, want %q (the legacy envoy.http_connection_manager matches nothing)", fc.GetName(), hcmFilter)
	}
	op := p.cp.GetPatch().GetOperation()
	if op != networkingapi.EnvoyFilter_Patch_INSERT_BEFORE || fc.GetSubFilter().GetName() != routerFilter {
		add("%s is inserted with %v relative to subFilter %q: insert it INSERT_BEFORE subFilter %s, since a filter after the router never runs", name, op, fc.GetSubFilter().GetName(), routerFilter)
	}
	return problems
}

func lintDomain(path, domain string, e env) []string {
	if e.rules.Domain(domain) != nil {
		return nil
	}
	var have []string
	for _, d := range e.rules.Domains() {
		have = append(have, d.Name)
	}
	return []string{fmt.Sprintf("%s: domain %q is the domain: of no file in %s (have %v); Tollgate answers OK with no limits for an unknown domain", path, domain, rulesDir, have)}
}

// outboundCluster is Istio's name for a Service port's cluster.
var outboundCluster = regexp.MustCompile(`^outbound\|(\d+)\|[^|]*\|(.+)$`)

func lintRateLimitFilter(f rlFilter, clusters map[string]*clusterv3.Cluster, m mesh, e env) []string {
	problems := lintDomain(f.path+".domain", f.cfg.GetDomain(), e)
	add := func(format string, args ...any) {
		problems = append(problems, f.path+fmt.Sprintf(format, args...))
	}
	rls := f.cfg.GetRateLimitService()
	if v := rls.GetTransportApiVersion(); v != corev3.ApiVersion_V3 {
		add(".rate_limit_service.transport_api_version is %v, want V3", v)
	}
	if f.cfg.GetEnableXRatelimitHeaders() != rlv3.RateLimit_OFF {
		add(".enable_x_ratelimit_headers must stay OFF: Tollgate adds the x-ratelimit-* headers itself, and clients would get two copies")
	}
	g := rls.GetGrpcService().GetEnvoyGrpc()
	name := g.GetClusterName()
	if name == "" {
		add(".rate_limit_service.grpc_service: want envoy_grpc with a cluster_name")
		return problems
	}
	if sm := outboundCluster.FindStringSubmatch(name); sm != nil {
		if sm[1] != fmt.Sprint(tollgatePort) {
			add(".rate_limit_service.grpc_service.envoy_grpc.cluster_name %q: port %s, want %d (Tollgate's gRPC port)", name, sm[1], tollgatePort)
		}
		if m.host != "" && sm[2] != m.host {
			add(".rate_limit_service.grpc_service.envoy_grpc.cluster_name %q: host %s, but the extension providers in %s reach Tollgate at %s", name, sm[2], meshConfigFile, m.host)
		}
		if g.GetAuthority() != "" && g.GetAuthority() != sm[2] {
			add(".rate_limit_service.grpc_service.envoy_grpc.authority %q is not the cluster's host %s", g.GetAuthority(), sm[2])
		}
		return problems
	}
	c, ok := clusters[name]
	if !ok {
		add(".rate_limit_service.grpc_service.envoy_grpc.cluster_name %q is neither Istio's outbound|%d||<host> cluster nor added by a CLUSTER ADD patch of this EnvoyFilter: every check fails (and fails open)", name, tollgatePort)
		return problems
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if a == nil || a.UnmarshalTo(opts) != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		add(": cluster %q must speak HTTP/2 (typed_extension_protocol_options HttpProtocolOptions explicit_http_config.http2_protocol_options): gRPC over HTTP/1.1 fails every check", name)
	}
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			if port := lb.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != tollgatePort {
				add(": cluster %q has an endpoint on port %d, want %d", name, port, tollgatePort)
			}
		}
	}
	return problems
}

// formatCommand matches one substitution command such as
// %DYNAMIC_METADATA(ns:key)% or %BYTES_RECEIVED%.
var formatCommand = regexp.MustCompile(`%[A-Z_0-9]+(\([^)]*\))?(:[0-9]+)?%`)

// dynamicMetadata matches %DYNAMIC_METADATA(ns:key[:key...])%.
var dynamicMetadata = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+):([^:)]+)[^)]*\)%$`)

// lintEntry checks one route.v3.RateLimit: what Envoy ignores or rejects
// only at runtime, and that its descriptor matches a Tollgate rule.
func lintEntry(path string, rl *routev3.RateLimit, perRoute bool, domain string, written map[string]bool, e env) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, path+": "+fmt.Sprintf(format, args...))
	}
	ha := rl.GetHitsAddend()
	if perRoute && (rl.GetStage() != nil || rl.GetDisableKey() != "") {
		add("stage and disable_key are not supported in RateLimitPerRoute; Envoy rejects the config")
	}
	if ha != nil {
		if !perRoute {
			add("hits_addend is ignored in a virtual host's or route's rate_limits; put the entry in typed_per_filter_config (RateLimitPerRoute)")
		}
		switch {
		case (ha.GetNumber() != nil) == (ha.GetFormat() != ""):
			add("hits_addend must contain either a format or a number (Envoy rejects both or neither)")
		case ha.GetFormat() != "":
			if n := len(formatCommand.FindAllString(ha.GetFormat(), -1)); n != 1 {
				add("hits_addend.format %q has %d substitution commands; Envoy wants exactly one substitution command", ha.GetFormat(), n)
			} else if sm := dynamicMetadata.FindStringSubmatch(ha.GetFormat()); sm != nil && !written[sm[1]+":"+sm[2]] {
				add("hits_addend.format reads %s:%s, but no header_to_metadata response rule of this EnvoyFilter writes it: every cost report is dropped", sm[1], sm[2])
			}
		}
	}

	dom := e.rules.Domain(domain)
	if dom == nil {
		return problems // lintDomain reports it
	}
	var entries []limit.Entry
	var keys []string
	for i, a := range rl.GetActions() {
		rh := a.GetRequestHeaders()
		if rh == nil {
			add("actions[%d]: only request_headers actions can be checked against the rules; extend lintEntry", i)
			return problems
		}
		k := rh.GetDescriptorKey()
		keys = append(keys, k)
		if dom.Tiers != nil && k == dom.Tiers.Key {
			if !rh.GetSkipIfAbsent() {
				add("actions[%d] (%s from %s): skip_if_absent is false, so a request without %s sends no descriptor at all and is not limited; set it to true (Tollgate applies the default plan)", i, k, rh.GetHeaderName(), rh.GetHeaderName())
			}
			continue // Tollgate removes the tier entry before matching
		}
		v, ok := sampleValues[k]
		if !ok {
			add("actions[%d]: no sample value for descriptor key %q: add one to sampleValues", i, k)
			return problems
		}
		entries = append(entries, limit.Entry{Key: k, Value: v})
	}
	if slices.Contains(keys, "tier") && dom.Tiers == nil {
		add("sends a tier entry, but domain %q has no tiers: the entry is matched as a descriptor key and the descriptor matches no rule", domain)
	}
	if len(entries) == 0 {
		add("descriptor (%s) has no entry that a rule can match", strings.Join(keys, ", "))
		return problems
	}
	r := dom.Match(entries)
	if r == nil {
		add("descriptor (%s) matches no rule in domain %q (%s)", strings.Join(keys, ", "), domain, dom.Source)
		return problems
	}
	if ha != nil && r.TokenLimit == nil {
		add("has hits_addend but rule %s has no token_limit: the report would be charged as requests", r.ID)
	}
	return problems
}

// typedConfig returns the message in a, unpacking a TypedStruct.
func typedConfig(a *anypb.Any) (proto.Message, error) {
	if a == nil {
		return nil, fmt.Errorf("no typed_config")
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	ts := inner.ProtoReflect()
	switch ts.Descriptor().FullName() {
	case "xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct":
		fields := ts.Descriptor().Fields()
		value, _ := ts.Get(fields.ByName("value")).Message().Interface().(*structpb.Struct)
		return fromStruct(ts.Get(fields.ByName("type_url")).String(), value)
	}
	return inner, nil
}

func fromStruct(typeURL string, value *structpb.Struct) (proto.Message, error) {
	a := &anypb.Any{TypeUrl: typeURL}
	inner, err := a.UnmarshalNew() // resolves the type; the empty value decodes
	if err != nil {
		return nil, err
	}
	js, err := protojson.Marshal(value)
	if err != nil {
		return nil, err
	}
	return inner, (protojson.UnmarshalOptions{}).Unmarshal(js, inner)
}

func containsFold(list []string, s string) bool {
	return slices.ContainsFunc(list, func(x string) bool { return strings.EqualFold(x, s) })
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
