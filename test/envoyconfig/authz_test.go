package envoyconfig

// The ext_authz path: Envoy's ext_authz filter calls Tollgate's Check before
// the request, and the http_grpc access logger sends Tollgate the outcome
// afterwards, which settles the reservation Check made. These lints run on
// every bootstrap (from lint), but each one only looks at ext_authz filters
// and http_grpc loggers, so a bootstrap with neither (envoy/envoy.yaml)
// passes them trivially.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	grpclogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"sigs.k8s.io/yaml"
)

const (
	// usageHeader is the response header the backend reports actual total
	// tokens in, and that Tollgate's access log reads (usage_header in
	// config/authz/authz.yaml; TestAuthzWiring checks they agree).
	usageHeader = "x-usage-total-tokens"

	// tollgateHeaderPrefix starts the upstream request headers Check sets
	// (x-tollgate-tenant, x-tollgate-tier, x-tollgate-model).
	tollgateHeaderPrefix = "x-tollgate-"

	authzConfig = "../../config/authz/authz.yaml"

	// defaultMaxBodyBytes is Tollgate's estimate.max_body_bytes when
	// authz.yaml leaves it out (extauthz.DefaultMaxBodyBytes).
	defaultMaxBodyBytes = 1 << 20
)

// extAuthz is one ext_authz HTTP filter of an HCM.
type extAuthz struct {
	index int    // in http_filters
	path  string // ...http_filters[i].typed_config<ExtAuthz>
	cfg   *extauthzv3.ExtAuthz
}

// cluster is the cluster Check goes to, "" if not an envoy_grpc service.
func (f extAuthz) cluster() string {
	return f.cfg.GetGrpcService().GetEnvoyGrpc().GetClusterName()
}

// grpcLogger is one envoy.access_loggers.http_grpc logger of an HCM.
type grpcLogger struct {
	path     string // ...access_log[i].typed_config<HttpGrpcAccessLogConfig>
	filtered bool   // the AccessLog has a filter
	cfg      *grpclogv3.HttpGrpcAccessLogConfig
}

func (l grpcLogger) cluster() string {
	return l.cfg.GetCommonConfig().GetGrpcService().GetEnvoyGrpc().GetClusterName()
}

func extAuthzFilters(base string, hcm *hcmv3.HttpConnectionManager) ([]extAuthz, []string) {
	var out []extAuthz
	var problems []string
	for i, f := range hcm.GetHttpFilters() {
		c := &extauthzv3.ExtAuthz{}
		if !f.GetTypedConfig().MessageIs(c) {
			continue
		}
		path := fmt.Sprintf("%s.http_filters[%d].typed_config<ExtAuthz>", base, i)
		if err := f.GetTypedConfig().UnmarshalTo(c); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		out = append(out, extAuthz{index: i, path: path, cfg: c})
	}
	return out, problems
}

func grpcLoggers(base string, hcm *hcmv3.HttpConnectionManager) ([]grpcLogger, []string) {
	var out []grpcLogger
	var problems []string
	for i, al := range hcm.GetAccessLog() {
		c := &grpclogv3.HttpGrpcAccessLogConfig{}
		if !al.GetTypedConfig().MessageIs(c) {
			continue
		}
		path := fmt.Sprintf("%s.access_log[%d].typed_config<HttpGrpcAccessLogConfig>", base, i)
		if err := al.GetTypedConfig().UnmarshalTo(c); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		out = append(out, grpcLogger{path: path, filtered: al.GetFilter() != nil, cfg: c})
	}
	return out, problems
}

// lintAuthzPath checks one HCM's ext_authz filters and http_grpc access
// loggers, and that they work together: the clusters ext_authz sends
// Check to are "Tollgate", and each of them needs a logger that sends the
// outcome back, with the usage header, unfiltered.
func lintAuthzPath(m *model, site httpFilterSite) []string {
	base := site.path + "<HttpConnectionManager>"
	filters, problems := extAuthzFilters(base, site.hcm)
	loggers, more := grpcLoggers(base, site.hcm)
	problems = append(problems, more...)

	router := slices.IndexFunc(site.hcm.GetHttpFilters(), func(f *hcmv3.HttpFilter) bool {
		return f.GetTypedConfig().MessageIs(&routerv3.Router{})
	})
	tollgate := map[string]bool{}
	for _, f := range filters {
		problems = append(problems, lintExtAuthz(m, f, router)...)
		if c := f.cluster(); c != "" {
			tollgate[c] = true
		}
	}
	problems = append(problems, lintRouteCache(base, site.hcm, filters)...)
	for _, l := range loggers {
		problems = append(problems, lintGrpcLogger(m, l, tollgate)...)
	}
	for _, c := range keys(tollgate) {
		if !slices.ContainsFunc(loggers, func(l grpcLogger) bool { return l.cluster() == c }) {
			problems = append(problems, fmt.Sprintf("%s.access_log: ext_authz sends Check to cluster %q, but no envoy.access_loggers.http_grpc logger sends to that cluster: Tollgate never settles a reservation (concurrency leases are held until they expire, token estimates are never corrected)", base, c))
		}
	}
	return problems
}

func lintExtAuthz(m *model, f extAuthz, router int) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, f.path+fmt.Sprintf(format, args...))
	}
	c := f.cfg
	// The generic "router must be last" lint fires too; this one says
	// what it means for ext_authz.
	if router >= 0 && f.index > router {
		add(": comes after the router (http_filters[%d]), so it never runs and nothing is checked; put it before envoy.filters.http.router", router)
	}
	if v := c.GetTransportApiVersion(); v != corev3.ApiVersion_V3 {
		add(".transport_api_version is %v, want V3", v)
	}
	switch {
	case c.GetGrpcService() == nil:
		add(": want grpc_service (Tollgate serves ext_authz over gRPC only, not http_service)")
	case f.cluster() == "":
		add(".grpc_service: want envoy_grpc with a cluster_name")
	default:
		if p := grpcClusterProblem(m, f.cluster()); p != "" {
			add(".grpc_service: %s", p)
		}
	}
	// max_request_bytes > 0 is a PGV rule; the deep walk reports it.
	b := c.GetWithRequestBody()
	switch {
	case b == nil:
		add(".with_request_body is not set: Tollgate reads the model and estimates tokens from the body, so without it every request with a body is refused (500 request_body_not_checked) while the model is read from the body")
	case !b.GetPackAsBytes():
		add(".with_request_body.pack_as_bytes is false: the body would go in a protobuf string, which must be valid UTF-8; a body cut at max_request_bytes can end mid-character, and Tollgate's Go gRPC server then rejects the whole CheckRequest")
	}
	if b != nil && !b.GetAllowPartialMessage() {
		add(".with_request_body.allow_partial_message is false: Envoy answers a body over max_request_bytes with its own plain-text 413 and never asks Tollgate, so the client gets no OpenAI-style error; set it true, and Tollgate refuses such a body itself (docs/partial-bodies.md)")
	}
	return problems
}

// lintRouteCache: Envoy picks the route from the client's headers before
// ext_authz runs. A route that matches on an x-tollgate-* header needs
// clear_route_cache, or it matches on what the client sent rather than on
// what Tollgate set. Without such a route, clear_route_cache only re-runs
// route matching on every admitted request (Tollgate always sets headers).
func lintRouteCache(base string, hcm *hcmv3.HttpConnectionManager, filters []extAuthz) []string {
	if len(filters) == 0 {
		return nil
	}
	var clearing []extAuthz
	for _, f := range filters {
		if f.cfg.GetClearRouteCache() {
			clearing = append(clearing, f)
		}
	}
	var problems []string
	matched := 0
	for vi, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for ri, r := range vh.GetRoutes() {
			for hi, h := range r.GetMatch().GetHeaders() {
				name := strings.ToLower(h.GetName())
				if !strings.HasPrefix(name, tollgateHeaderPrefix) {
					continue
				}
				matched++
				path := fmt.Sprintf("%s.route_config.virtual_hosts[%d].routes[%d].match.headers[%d]", base, vi, ri, hi)
				if len(clearing) == 0 {
					problems = append(problems, fmt.Sprintf("%s: matches on %s, which Tollgate's Check sets, but no ext_authz filter has clear_route_cache: true, so the route is chosen from the value the client sent", path, name))
				}
				for _, f := range clearing {
					if only := f.cfg.GetClearRouteCacheHeaders(); len(only) > 0 && !slices.ContainsFunc(only, func(s string) bool { return strings.EqualFold(s, name) }) {
						problems = append(problems, fmt.Sprintf("%s: matches on %s, which is not in %s.clear_route_cache_headers, so a change to it does not re-run route matching", path, name, f.path))
					}
				}
			}
		}
	}
	if matched == 0 {
		for _, f := range clearing {
			problems = append(problems, f.path+".clear_route_cache is true but no route matches on an x-tollgate-* header: Tollgate sets headers on every admitted request, so route matching would re-run on each for nothing")
		}
	}
	return problems
}

// lintGrpcLogger checks any http_grpc logger as a gRPC client, and the
// one that reports to Tollgate (a cluster ext_authz sends Check to) for
// what settling reservations needs.
func lintGrpcLogger(m *model, l grpcLogger, tollgate map[string]bool) []string {
	var problems []string
	cc := l.cfg.GetCommonConfig()
	cpath := l.path + ".common_config"
	if v := cc.GetTransportApiVersion(); v != corev3.ApiVersion_V3 {
		problems = append(problems, fmt.Sprintf("%s.transport_api_version is %v, want V3", cpath, v))
	}
	cluster := l.cluster()
	if cluster == "" {
		problems = append(problems, cpath+".grpc_service: want envoy_grpc with a cluster_name")
		return problems
	}
	if p := grpcClusterProblem(m, cluster); p != "" {
		problems = append(problems, cpath+".grpc_service: "+p)
	}
	if !tollgate[cluster] {
		return problems
	}
	if l.filtered {
		problems = append(problems, l.path+": the access log has a filter; Tollgate must see every entry, or the reservations of the requests left out are never settled")
	}
	if !containsFold(l.cfg.GetAdditionalResponseHeadersToLog(), usageHeader) {
		problems = append(problems, fmt.Sprintf("%s.additional_response_headers_to_log does not list %s: Tollgate cannot see actual usage, so every token estimate stands as the charge", l.path, usageHeader))
	}
	return problems
}

func containsFold(list []string, s string) bool {
	return slices.ContainsFunc(list, func(x string) bool { return strings.EqualFold(x, s) })
}

// ---------------------------------------------------------------------------
// Wiring to config/authz/authz.yaml

// authzSettings is what the wiring needs from the authz config. It is read
// with a plain YAML decode, not Tollgate's parser, like ruleDomains.
type authzSettings struct {
	UsageHeader string `json:"usage_header"`
	Estimate    struct {
		MaxBodyBytes int64 `json:"max_body_bytes"`
	} `json:"estimate"`
}

func loadAuthzSettings(t *testing.T) authzSettings {
	t.Helper()
	data, err := os.ReadFile(authzConfig)
	if err != nil {
		t.Fatal(err)
	}
	var s authzSettings
	if err := yaml.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s: %v", authzConfig, err)
	}
	if s.Estimate.MaxBodyBytes == 0 {
		s.Estimate.MaxBodyBytes = defaultMaxBodyBytes
	}
	return s
}

// authzWiring checks bs's ext_authz path against Tollgate's authz config,
// and returns how many ext_authz filters it found.
func authzWiring(bs *bootstrapv3.Bootstrap, s authzSettings) (problems []string, nFilters int) {
	m, problems := buildModel(bs)
	if s.UsageHeader == "" {
		problems = append(problems, authzConfig+": usage_header is not set: the access log releases leases but never corrects a token estimate")
	} else if !strings.EqualFold(s.UsageHeader, usageHeader) {
		problems = append(problems, fmt.Sprintf("%s: usage_header is %q, but the bootstrap lint expects %q; change usageHeader in this test along with the bootstraps", authzConfig, s.UsageHeader, usageHeader))
	}
	for _, site := range m.hcms {
		base := site.path + "<HttpConnectionManager>"
		filters, more := extAuthzFilters(base, site.hcm)
		problems = append(problems, more...)
		loggers, more := grpcLoggers(base, site.hcm)
		problems = append(problems, more...)
		for _, f := range filters {
			nFilters++
			// The body limit (lintExtAuthz reports a missing with_request_body).
			switch n := int64(f.cfg.GetWithRequestBody().GetMaxRequestBytes()); {
			case f.cfg.GetWithRequestBody() == nil:
			case n > s.Estimate.MaxBodyBytes:
				problems = append(problems, fmt.Sprintf("%s.with_request_body.max_request_bytes is %d, over estimate.max_body_bytes %d in %s: Tollgate refuses such a body with 413, so buffering it only costs memory", f.path, n, s.Estimate.MaxBodyBytes, authzConfig))
			case n < s.Estimate.MaxBodyBytes:
				problems = append(problems, fmt.Sprintf("%s.with_request_body.max_request_bytes is %d, under estimate.max_body_bytes %d in %s: a body in between is decided from its first %d bytes, so a model, max_tokens or n repeated after them goes unseen (docs/partial-bodies.md); keep the two equal", f.path, n, s.Estimate.MaxBodyBytes, authzConfig, n))
			}
			for _, l := range loggers {
				if l.cluster() == f.cluster() && s.UsageHeader != "" && !containsFold(l.cfg.GetAdditionalResponseHeadersToLog(), s.UsageHeader) {
					problems = append(problems, fmt.Sprintf("%s.additional_response_headers_to_log does not list %s, the usage_header of %s", l.path, s.UsageHeader, authzConfig))
				}
			}
		}
	}
	return problems, nFilters
}

// TestAuthzWiring checks every bootstrap with an ext_authz filter against
// config/authz/authz.yaml.
func TestAuthzWiring(t *testing.T) {
	s := loadAuthzSettings(t)
	for _, file := range bootstrapFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bs, err := decode(data)
			if err != nil {
				t.Fatal(err)
			}
			problems, n := authzWiring(bs, s)
			if n == 0 {
				t.Skipf("%s has no ext_authz filter", file)
			}
			for _, p := range problems {
				t.Errorf("%s: %s", file, p)
			}
		})
	}
}

// TestBothPathsHaveABootstrap pins that the glob picks up both attachment paths,
// so that neither file's lints go untested.
func TestBothPathsHaveABootstrap(t *testing.T) {
	var rl, az int
	for _, file := range bootstrapFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := decode(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		m, _ := buildModel(bs)
		for _, site := range m.hcms {
			f, _ := ratelimitFilters(site.hcm)
			rl += len(f)
			a, _ := extAuthzFilters("", site.hcm)
			az += len(a)
		}
	}
	if rl == 0 || az == 0 {
		t.Fatalf("envoy/*.yaml has %d ratelimit and %d ext_authz filters; want a bootstrap for each path", rl, az)
	}
}

// ---------------------------------------------------------------------------
// Negative tests

// baseAuthz is a small, valid bootstrap with the same shape as
// envoy/envoy-ext-authz.yaml (ext_authz, the ext_proc usage reader, the
// access logger). Each case below changes one thing in it.
const baseAuthz = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 9901}}
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, port_value: 10000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          access_log:
          - name: envoy.access_loggers.http_grpc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig
              common_config:
                log_name: tollgate
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: tollgate}}
                buffer_flush_interval: 0.1s
              additional_response_headers_to_log: [x-usage-total-tokens]
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: backend}
          http_filters:
          - name: envoy.filters.http.ext_authz
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
              transport_api_version: V3
              grpc_service: {envoy_grpc: {cluster_name: tollgate}, timeout: 0.25s}
              with_request_body: {max_request_bytes: 1048576, allow_partial_message: true, pack_as_bytes: true}
              failure_mode_allow: false
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {cluster_name: tollgate}
              failure_mode_allow: true
              observability_mode: true
              processing_mode: {request_header_mode: SKIP, response_body_mode: STREAMED, response_trailer_mode: SEND}
              metadata_options: {forwarding_namespaces: {untyped: [envoy.filters.http.ext_authz]}}
              stat_prefix: tollgate_usage
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: tollgate
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: tollgate
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8081}}}}]}]
  - name: backend
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backend
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8000}}}}]}]
`

// TestBaseAuthzIsValid also shows that the ratelimit lints leave a
// bootstrap without a ratelimit filter alone (TestBaseIsValid shows the
// reverse for the lints in this file).
func TestBaseAuthzIsValid(t *testing.T) {
	if _, problems := check([]byte(baseAuthz)); len(problems) > 0 {
		t.Fatalf("baseAuthz bootstrap: %s", strings.Join(problems, "\n"))
	}
	bs, err := decode([]byte(baseAuthz))
	if err != nil {
		t.Fatal(err)
	}
	if problems, n := authzWiring(bs, loadAuthzSettings(t)); n != 1 || len(problems) > 0 {
		t.Fatalf("baseAuthz wiring: %d filters, problems:\n%s", n, strings.Join(problems, "\n"))
	}
}

const (
	extAuthzPath = "filters[0].typed_config<HttpConnectionManager>.http_filters[0].typed_config<ExtAuthz>"
	loggerPath   = "filters[0].typed_config<HttpConnectionManager>.access_log[0].typed_config<HttpGrpcAccessLogConfig>"
)

// TestAuthzCatches changes one thing in baseAuthz per case and requires a
// problem containing every wanted string (the path and the message).
func TestAuthzCatches(t *testing.T) {
	const (
		withBody    = "              with_request_body: {max_request_bytes: 1048576, allow_partial_message: true, pack_as_bytes: true}\n"
		authzGRPC   = "{envoy_grpc: {cluster_name: tollgate}, timeout: 0.25s}"
		loggerGRPC  = "{envoy_grpc: {cluster_name: tollgate}}"
		routerHTTP  = "          - name: envoy.filters.http.router\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n"
		authzHTTP   = "          - name: envoy.filters.http.ext_authz\n"
		loggerName  = "          - name: envoy.access_loggers.http_grpc\n"
		loggerBlock = "          access_log:\n" + loggerName +
			"            typed_config:\n" +
			"              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig\n" +
			"              common_config:\n" +
			"                log_name: tollgate\n" +
			"                transport_api_version: V3\n" +
			"                grpc_service: {envoy_grpc: {cluster_name: tollgate}}\n" +
			"                buffer_flush_interval: 0.1s\n" +
			"              additional_response_headers_to_log: [x-usage-total-tokens]\n"
		tierRoute = `- match: {prefix: "/", headers: [{name: x-tollgate-tier, string_match: {exact: premium}}]}`
	)
	for _, tc := range []struct {
		name     string
		old, new string
		// also is a second change, made first.
		also [2]string
		want []string
	}{
		{
			name: "bad @type inside the access logger typed_config",
			old:  "grpc.v3.HttpGrpcAccessLogConfig\n", new: "grpc.v3.HttpGrpcAccessLogConfigX\n",
			want: []string{"protojson", "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfigX"},
		},
		{
			name: "unknown field inside the access logger common_config",
			old:  "buffer_flush_interval: 0.1s", new: "buffer_flush_intervall: 0.1s",
			want: []string{"protojson", `unknown field "buffer_flush_intervall"`},
		},
		{
			name: "ext_authz without with_request_body",
			old:  withBody, new: "",
			want: []string{extAuthzPath + ".with_request_body is not set"},
		},
		{
			name: "ext_authz body as a UTF-8 string",
			old:  "pack_as_bytes: true", new: "pack_as_bytes: false",
			want: []string{extAuthzPath + ".with_request_body.pack_as_bytes is false"},
		},
		{
			name: "ext_authz without allow_partial_message",
			old:  "allow_partial_message: true", new: "allow_partial_message: false",
			want: []string{extAuthzPath + ".with_request_body.allow_partial_message is false", "plain-text 413"},
		},
		{
			name: "ext_authz max_request_bytes 0 (PGV, inside typed_config)",
			old:  "max_request_bytes: 1048576", new: "max_request_bytes: 0",
			want: []string{extAuthzPath + ".with_request_body", "MaxRequestBytes", "greater than 0"},
		},
		{
			name: "logger on a missing cluster",
			old:  loggerGRPC, new: "{envoy_grpc: {cluster_name: tolgate}}",
			want: []string{loggerPath + ".common_config.grpc_service", `cluster "tolgate" is not defined`},
		},
		{
			name: "logger on another cluster than ext_authz",
			old:  loggerGRPC, new: "{envoy_grpc: {cluster_name: backend}}",
			want: []string{"access_log", `ext_authz sends Check to cluster "tollgate"`, "no envoy.access_loggers.http_grpc logger"},
		},
		{
			name: "logger on a cluster that is not HTTP/2",
			old:  loggerGRPC, new: "{envoy_grpc: {cluster_name: backend}}",
			want: []string{loggerPath + ".common_config.grpc_service", `cluster "backend" must speak HTTP/2`},
		},
		{
			name: "no http_grpc logger",
			old:  loggerBlock, new: "",
			want: []string{"access_log", `ext_authz sends Check to cluster "tollgate"`, "no envoy.access_loggers.http_grpc logger"},
		},
		{
			name: "logger with a filter",
			old:  loggerName, new: loggerName + "            filter: {not_health_check_filter: {}}\n",
			want: []string{loggerPath, "has a filter"},
		},
		{
			name: "logger without the usage header",
			old:  "additional_response_headers_to_log: [x-usage-total-tokens]", new: "additional_response_trailers_to_log: [x-usage-total-tokens]",
			want: []string{loggerPath + ".additional_response_headers_to_log does not list x-usage-total-tokens"},
		},
		{
			name: "logger without transport_api_version",
			old:  "                transport_api_version: V3\n", new: "",
			want: []string{loggerPath + ".common_config.transport_api_version is AUTO, want V3"},
		},
		{
			name: "ext_authz transport V2",
			old:  "\n              transport_api_version: V3\n", new: "\n              transport_api_version: V2\n",
			want: []string{extAuthzPath + ".transport_api_version is V2, want V3"},
		},
		{
			name: "ext_authz on a missing cluster",
			old:  authzGRPC, new: "{envoy_grpc: {cluster_name: tolgate}, timeout: 0.25s}",
			want: []string{extAuthzPath + ".grpc_service", `cluster "tolgate" is not defined`},
		},
		{
			name: "ext_authz on a cluster that is not HTTP/2",
			old:  "explicit_http_config: {http2_protocol_options: {}}", new: "explicit_http_config: {http_protocol_options: {}}",
			want: []string{extAuthzPath + ".grpc_service", `cluster "tollgate" must speak HTTP/2`},
		},
		{
			name: "ext_authz over HTTP",
			old:  "grpc_service: " + authzGRPC, new: "http_service: {server_uri: {uri: \"http://127.0.0.1:8081\", cluster: tollgate, timeout: 0.25s}}",
			want: []string{extAuthzPath, "want grpc_service"},
		},
		{
			name: "ext_authz after the router",
			old:  authzHTTP, new: routerHTTP + authzHTTP,
			want: []string{"http_filters[1].typed_config<ExtAuthz>", "comes after the router"},
		},
		{
			name: "route on x-tollgate-tier without clear_route_cache",
			old:  `- match: {prefix: "/"}`, new: tierRoute,
			want: []string{"routes[0].match.headers[0]", "x-tollgate-tier", "no ext_authz filter has clear_route_cache: true"},
		},
		{
			name: "route on x-tollgate-tier missing from clear_route_cache_headers",
			old:  "failure_mode_allow: false\n", new: "failure_mode_allow: false\n              clear_route_cache: true\n              clear_route_cache_headers: [x-tollgate-model]\n",
			also: [2]string{`- match: {prefix: "/"}`, tierRoute},
			want: []string{"routes[0].match.headers[0]", "x-tollgate-tier", "clear_route_cache_headers"},
		},
		{
			name: "clear_route_cache with no route on x-tollgate-*",
			old:  "failure_mode_allow: false\n", new: "failure_mode_allow: false\n              clear_route_cache: true\n",
			want: []string{extAuthzPath + ".clear_route_cache is true but no route matches"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseAuthz
			if tc.also[0] != "" {
				if strings.Count(in, tc.also[0]) != 1 {
					t.Fatalf("%q occurs %d times in baseAuthz, want once", tc.also[0], strings.Count(in, tc.also[0]))
				}
				in = strings.Replace(in, tc.also[0], tc.also[1], 1)
			}
			if strings.Count(in, tc.old) != 1 {
				t.Fatalf("%q occurs %d times in baseAuthz, want once", tc.old, strings.Count(in, tc.old))
			}
			_, problems := check([]byte(strings.Replace(in, tc.old, tc.new, 1)))
			for _, p := range problems {
				if containsAll(p, tc.want) {
					t.Log(p)
					return
				}
			}
			t.Errorf("no problem contains all of %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
		})
	}
}

// TestAuthzRouteCacheWhenNeeded: a route on an x-tollgate-* header with
// clear_route_cache set is fine.
func TestAuthzRouteCacheWhenNeeded(t *testing.T) {
	in := strings.Replace(baseAuthz, `- match: {prefix: "/"}`, `- match: {prefix: "/", headers: [{name: x-tollgate-tier, string_match: {exact: premium}}]}`, 1)
	in = strings.Replace(in, "failure_mode_allow: false\n", "failure_mode_allow: false\n              clear_route_cache: true\n              clear_route_cache_headers: [x-tollgate-tier]\n", 1)
	if _, problems := check([]byte(in)); len(problems) > 0 {
		t.Fatalf("%s", strings.Join(problems, "\n"))
	}
}

// TestAuthzWiringCatches proves the wiring checks can fail.
func TestAuthzWiringCatches(t *testing.T) {
	good := loadAuthzSettings(t)
	for _, tc := range []struct {
		name     string
		old, new string
		settings func(authzSettings) authzSettings
		want     []string
	}{
		{
			name: "max_request_bytes over Tollgate's max_body_bytes",
			old:  "max_request_bytes: 1048576", new: "max_request_bytes: 4194304",
			want: []string{extAuthzPath + ".with_request_body.max_request_bytes is 4194304, over estimate.max_body_bytes"},
		},
		{
			name: "max_request_bytes under Tollgate's max_body_bytes",
			old:  "max_request_bytes: 1048576", new: "max_request_bytes: 65536",
			want: []string{extAuthzPath + ".with_request_body.max_request_bytes is 65536, under estimate.max_body_bytes 1048576", "keep the two equal"},
		},
		{
			name:     "max_body_bytes in authz.yaml over Envoy's max_request_bytes",
			settings: func(s authzSettings) authzSettings { s.Estimate.MaxBodyBytes = 4 << 20; return s },
			want:     []string{extAuthzPath + ".with_request_body.max_request_bytes is 1048576, under estimate.max_body_bytes 4194304"},
		},
		{
			name:     "usage_header in authz.yaml is not logged",
			settings: func(s authzSettings) authzSettings { s.UsageHeader = "x-llm-total-tokens"; return s },
			want:     []string{loggerPath + ".additional_response_headers_to_log does not list x-llm-total-tokens"},
		},
		{
			name:     "usage_header unset in authz.yaml",
			settings: func(s authzSettings) authzSettings { s.UsageHeader = ""; return s },
			want:     []string{"usage_header is not set"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseAuthz
			if tc.old != "" {
				if strings.Count(in, tc.old) != 1 {
					t.Fatalf("%q occurs %d times in baseAuthz, want once", tc.old, strings.Count(in, tc.old))
				}
				in = strings.Replace(in, tc.old, tc.new, 1)
			}
			s := good
			if tc.settings != nil {
				s = tc.settings(s)
			}
			bs, err := decode([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			problems, _ := authzWiring(bs, s)
			for _, p := range problems {
				if containsAll(p, tc.want) {
					t.Log(p)
					return
				}
			}
			t.Errorf("no problem contains all of %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
		})
	}
}
