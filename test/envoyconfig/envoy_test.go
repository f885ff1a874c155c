// Package envoyconfig checks the Envoy bootstraps in envoy/ offline, with
// no Envoy binary.
//
// Each file is decoded strictly (an unknown field or an unknown @type is an
// error), every google.protobuf.Any and TypedStruct is unpacked, and the
// protoc-gen-validate rules are checked on every message, including those
// inside typed_config. Bootstrap.ValidateAll alone does not look inside an
// Any, so a bad filter config would pass it. On top of that come the rules
// Envoy enforces only at startup or not at all (see lint), and the wiring to
// Tollgate: the filter's domain exists in config/, its cluster exists and
// speaks HTTP/2, and every descriptor the routes build matches a rule.
//
// A bootstrap may attach Tollgate with the ratelimit filter (envoy.yaml), or
// with the ext_authz filter plus the http_grpc access logger
// (envoy-ext-authz.yaml, linted in authz_test.go). Each lint applies only
// where its filter or logger is present, so one file does not fail the
// other's checks.
package envoyconfig

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	h2mv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"

	// Extension types used only through typed_config: importing a package
	// registers its messages in protoregistry.GlobalTypes, which protojson
	// and anypb resolve "@type" against. A type a bootstrap uses but that
	// is not imported here fails the test as an unknown @type; add its
	// package to this list.
	_ "github.com/cncf/xds/go/udpa/type/v1" // udpa.type.v1.TypedStruct
	_ "github.com/cncf/xds/go/xds/type/v3"  // xds.type.v3.TypedStruct

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"    // HttpGrpcAccessLogConfig
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"  // StdoutAccessLog
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3" // ExtAuthz, ExtAuthzPerRoute
)

const (
	envoyGlob = "../../envoy/*.yaml"
	rulesDir  = "../../config"
)

// sampleValues are the descriptor values used to check that a descriptor
// built from request headers matches a Tollgate rule. A descriptor key
// with no sample here fails the test: add one.
var sampleValues = map[string]string{
	"tenant": "x",
	"model":  "gpt-4o",
	"user":   "u-1",
}

// ---------------------------------------------------------------------------
// Decoding and deep validation

// decode converts a YAML bootstrap to JSON and decodes it strictly.
func decode(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	bs := &bootstrapv3.Bootstrap{}
	// The zero options are the strict ones: unknown fields are errors, and
	// "@type" is resolved against protoregistry.GlobalTypes.
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, bs); err != nil {
		return nil, fmt.Errorf("protojson: %w", err)
	}
	return bs, nil
}

// validator is the PGV-generated method on every go-control-plane message.
type validator interface{ ValidateAll() error }

// multiError is the generated <Message>MultiError.
type multiError interface{ AllErrors() []error }

// fieldError is the generated <Message>ValidationError.
type fieldError interface {
	Reason() string
	Cause() error
}

// deepValidate walks m and returns one problem per line, each prefixed
// with the path of the message it is about.
func deepValidate(m proto.Message) []string {
	var w walker
	w.message("", m.ProtoReflect())
	return w.problems
}

type walker struct{ problems []string }

func (w *walker) addf(path, format string, args ...any) {
	if path == "" {
		path = "(root)"
	}
	w.problems = append(w.problems, path+": "+fmt.Sprintf(format, args...))
}

func (w *walker) message(path string, m protoreflect.Message) {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Any":
		w.any(path, m.Interface().(*anypb.Any))
		return
	case "google.protobuf.Duration":
		// Envoy rejects a negative or huge Duration anywhere in its
		// config at load time (MessageUtil::validateDurationFields); PGV
		// checks only the fields that have duration rules.
		d := m.Interface().(*durationpb.Duration)
		if d.GetSeconds() < 0 || d.GetNanos() < 0 {
			w.addf(path, "negative duration %v", d.AsDuration())
		} else if d.GetSeconds() > 315576000000 {
			w.addf(path, "duration of %d seconds is out of range", d.GetSeconds())
		}
		return
	case "xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct":
		// Both have type_url = 1 and value (google.protobuf.Struct) = 2.
		fields := m.Descriptor().Fields()
		typeURL := m.Get(fields.ByName("type_url")).String()
		value, _ := m.Get(fields.ByName("value")).Message().Interface().(*structpb.Struct)
		w.typedStruct(path, typeURL, value)
		return
	}
	if v, ok := m.Interface().(validator); ok {
		w.pgv(path, v.ValidateAll())
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := join(path, string(fd.Name()))
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				break
			}
			var keys []protoreflect.MapKey
			v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k)
				return true
			})
			sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
			for _, k := range keys {
				w.message(fmt.Sprintf("%s[%q]", p, k.String()), v.Map().Get(k).Message())
			}
		case fd.IsList():
			if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
				break
			}
			for i := 0; i < v.List().Len(); i++ {
				w.message(fmt.Sprintf("%s[%d]", p, i), v.List().Get(i).Message())
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			w.message(p, v.Message())
		}
		return true
	})
}

// pgv records err's field errors. An "embedded message failed validation"
// error is left out: the walk validates that message itself and reports
// its errors with their own, longer path.
func (w *walker) pgv(path string, err error) {
	if err == nil {
		return
	}
	errs := []error{err}
	if me, ok := err.(multiError); ok {
		errs = me.AllErrors()
	}
	for _, e := range errs {
		if fe, ok := e.(fieldError); ok && fe.Cause() != nil && fe.Reason() == "embedded message failed validation" {
			continue
		}
		w.addf(path, "%v", e)
	}
}

func (w *walker) any(path string, a *anypb.Any) {
	inner, err := a.UnmarshalNew() // protoregistry.GlobalTypes; unknown types fail
	if err != nil {
		w.addf(path, "cannot unpack Any %q: %v", a.GetTypeUrl(), err)
		return
	}
	w.message(path+"<"+shortName(inner)+">", inner.ProtoReflect())
}

func (w *walker) typedStruct(path, typeURL string, value *structpb.Struct) {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		w.addf(path, "TypedStruct type_url %q: %v", typeURL, err)
		return
	}
	js, err := protojson.Marshal(value)
	if err != nil {
		w.addf(path, "TypedStruct value: %v", err)
		return
	}
	inner := mt.New().Interface()
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, inner); err != nil {
		w.addf(path, "TypedStruct value as %s: %v", typeURL, err)
		return
	}
	w.message(path+"<"+shortName(inner)+">", inner.ProtoReflect())
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func shortName(m proto.Message) string {
	return string(m.ProtoReflect().Descriptor().Name())
}

// ---------------------------------------------------------------------------
// Lint: what Envoy checks only at startup, or never, and Tollgate's wiring

// httpFilterSite is one HTTP connection manager found in the bootstrap.
type httpFilterSite struct {
	path string
	hcm  *hcmv3.HttpConnectionManager
}

// rateLimitEntry is one route.v3.RateLimit with where it was found.
type rateLimitEntry struct {
	path  string
	rl    *routev3.RateLimit
	where string // "per_route" (RateLimitPerRoute or filter-level) or "route_action"/"virtual_host"
	// domain is the domain the descriptor is sent to.
	domain string
	hcm    *hcmv3.HttpConnectionManager
}

// model is what the lint needs from a decoded bootstrap.
type model struct {
	clusters map[string]*anypb.Any // name -> HttpProtocolOptions (may be nil)
	hcms     []httpFilterSite
}

func buildModel(bs *bootstrapv3.Bootstrap) (*model, []string) {
	var problems []string
	m := &model{clusters: map[string]*anypb.Any{}}
	for i, c := range bs.GetStaticResources().GetClusters() {
		if _, dup := m.clusters[c.GetName()]; dup {
			problems = append(problems, fmt.Sprintf("static_resources.clusters[%d]: cluster %q is defined twice", i, c.GetName()))
		}
		m.clusters[c.GetName()] = c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	}
	for li, l := range bs.GetStaticResources().GetListeners() {
		for ci, fc := range l.GetFilterChains() {
			for fi, f := range fc.GetFilters() {
				path := fmt.Sprintf("static_resources.listeners[%d].filter_chains[%d].filters[%d].typed_config", li, ci, fi)
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().MessageIs(hcm) {
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						problems = append(problems, fmt.Sprintf("%s: %v", path, err))
						continue
					}
					m.hcms = append(m.hcms, httpFilterSite{path: path, hcm: hcm})
				}
			}
		}
	}
	return m, problems
}

// ratelimitFilters returns the HCM's envoy.filters.http.ratelimit configs by filter name.
func ratelimitFilters(hcm *hcmv3.HttpConnectionManager) (map[string]*rlv3.RateLimit, error) {
	out := map[string]*rlv3.RateLimit{}
	for _, f := range hcm.GetHttpFilters() {
		rl := &rlv3.RateLimit{}
		if f.GetTypedConfig().MessageIs(rl) {
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				return nil, err
			}
			out[f.GetName()] = rl
		}
	}
	return out, nil
}

// rateLimitEntries collects every rate limit config reachable from the
// bootstrap, with the domain Envoy would send it to.
func rateLimitEntries(m *model) ([]rateLimitEntry, []string) {
	var out []rateLimitEntry
	var problems []string
	for _, site := range m.hcms {
		filters, err := ratelimitFilters(site.hcm)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", site.path, err))
			continue
		}
		// Per-route config is looked up by filter name, so with several
		// ratelimit filters each gets its own entries.
		for _, fname := range keys(filters) {
			f := filters[fname]
			fpath := fmt.Sprintf("%s<HttpConnectionManager>.http_filters[%q].typed_config<RateLimit>", site.path, fname)
			for i, rl := range f.GetRateLimits() {
				out = append(out, rateLimitEntry{path: fmt.Sprintf("%s.rate_limits[%d]", fpath, i), rl: rl, where: "per_route", domain: f.GetDomain(), hcm: site.hcm})
			}
			for vi, vh := range site.hcm.GetRouteConfig().GetVirtualHosts() {
				vpath := fmt.Sprintf("%s<HttpConnectionManager>.route_config.virtual_hosts[%d]", site.path, vi)
				vhPer, err := perRoute(vh.GetTypedPerFilterConfig()[fname])
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s.typed_per_filter_config[%q]: %v", vpath, fname, err))
				}
				for i, rl := range vh.GetRateLimits() {
					out = append(out, rateLimitEntry{path: fmt.Sprintf("%s.rate_limits[%d]", vpath, i), rl: rl, where: "virtual_host", domain: f.GetDomain(), hcm: site.hcm})
				}
				for ri, r := range vh.GetRoutes() {
					rpath := fmt.Sprintf("%s.routes[%d]", vpath, ri)
					per, err := perRoute(r.GetTypedPerFilterConfig()[fname])
					if err != nil {
						problems = append(problems, fmt.Sprintf("%s.typed_per_filter_config[%q]: %v", rpath, fname, err))
					}
					if per == nil {
						per = vhPer
					}
					domain := f.GetDomain()
					if per.GetDomain() != "" {
						domain = per.GetDomain()
					}
					for i, rl := range per.GetRateLimits() {
						out = append(out, rateLimitEntry{path: fmt.Sprintf("%s.typed_per_filter_config[%q]<RateLimitPerRoute>.rate_limits[%d]", rpath, fname, i), rl: rl, where: "per_route", domain: domain, hcm: site.hcm})
					}
					for i, rl := range r.GetRoute().GetRateLimits() {
						out = append(out, rateLimitEntry{path: fmt.Sprintf("%s.route.rate_limits[%d]", rpath, i), rl: rl, where: "route_action", domain: domain, hcm: site.hcm})
					}
				}
			}
		}
	}
	return out, problems
}

func perRoute(a *anypb.Any) (*rlv3.RateLimitPerRoute, error) {
	if a == nil {
		return nil, nil
	}
	per := &rlv3.RateLimitPerRoute{}
	if !a.MessageIs(per) {
		return nil, fmt.Errorf("is %s, want RateLimitPerRoute", a.GetTypeUrl())
	}
	return per, a.UnmarshalTo(per)
}

// formatCommand matches one substitution command such as
// %DYNAMIC_METADATA(ns:key)% or %BYTES_RECEIVED%.
var formatCommand = regexp.MustCompile(`%[A-Z_0-9]+(\([^)]*\))?(:[0-9]+)?%`)

// dynamicMetadata matches %DYNAMIC_METADATA(ns:key[:key...])%.
var dynamicMetadata = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+):([^:)]+)[^)]*\)%$`)

// lint returns the problems PGV cannot see. They are about how Envoy
// interprets a valid config (ignored fields, startup-only checks) and
// about Tollgate's conventions.
func lint(bs *bootstrapv3.Bootstrap) []string {
	m, problems := buildModel(bs)
	for _, site := range m.hcms {
		problems = append(problems, lintHCM(m, site)...)
		problems = append(problems, lintAuthzPath(m, site)...)
		problems = append(problems, lintExtProcPath(m, site)...)
	}
	entries, more := rateLimitEntries(m)
	problems = append(problems, more...)
	hasPerRoute := false
	for _, e := range entries {
		if e.where == "per_route" {
			hasPerRoute = true
		}
	}
	for _, e := range entries {
		problems = append(problems, lintRateLimit(e, hasPerRoute)...)
	}
	return problems
}

func lintHCM(m *model, site httpFilterSite) []string {
	var problems []string
	hcm := site.hcm
	base := site.path + "<HttpConnectionManager>"
	names := map[string]bool{}
	filters := hcm.GetHttpFilters()
	for i, f := range filters {
		names[f.GetName()] = true
		isRouter := f.GetTypedConfig().MessageIs(&routerv3.Router{})
		if isRouter != (i == len(filters)-1) {
			problems = append(problems, fmt.Sprintf("%s.http_filters[%d] %q: the router must be the last HTTP filter, and only the last", base, i, f.GetName()))
		}
		rl := &rlv3.RateLimit{}
		if !f.GetTypedConfig().MessageIs(rl) {
			continue
		}
		path := fmt.Sprintf("%s.http_filters[%d].typed_config<RateLimit>", base, i)
		if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		svc := rl.GetRateLimitService()
		if svc == nil {
			problems = append(problems, path+": rate_limit_service is not set")
			continue
		}
		if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
			problems = append(problems, fmt.Sprintf("%s.rate_limit_service.transport_api_version is %v, want V3", path, svc.GetTransportApiVersion()))
		}
		cluster := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		if cluster == "" {
			problems = append(problems, path+".rate_limit_service.grpc_service: want envoy_grpc with a cluster_name")
		} else if p := grpcClusterProblem(m, cluster); p != "" {
			problems = append(problems, path+".rate_limit_service: "+p)
		}
		// Tollgate adds x-ratelimit-* and retry-after itself; Envoy's
		// would duplicate them.
		if rl.GetEnableXRatelimitHeaders() != rlv3.RateLimit_OFF {
			problems = append(problems, path+".enable_x_ratelimit_headers: must stay OFF, Tollgate sends x-ratelimit-* itself")
		}
		if rl.GetEnableRetryAfterHeader() {
			problems = append(problems, path+".enable_retry_after_header: must stay off, Tollgate sends retry-after itself")
		}
	}
	// typed_per_filter_config under a name no filter has is silently ignored.
	check := func(path string, tpfc map[string]*anypb.Any) {
		for k := range tpfc {
			if !names[k] {
				problems = append(problems, fmt.Sprintf("%s.typed_per_filter_config[%q]: no HTTP filter has this name, Envoy ignores it", path, k))
			}
		}
	}
	for vi, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		vpath := fmt.Sprintf("%s.route_config.virtual_hosts[%d]", base, vi)
		check(vpath, vh.GetTypedPerFilterConfig())
		for ri, r := range vh.GetRoutes() {
			rpath := fmt.Sprintf("%s.routes[%d]", vpath, ri)
			check(rpath, r.GetTypedPerFilterConfig())
			if c := r.GetRoute().GetCluster(); c != "" {
				if _, ok := m.clusters[c]; !ok {
					problems = append(problems, fmt.Sprintf("%s.route.cluster: %q is not defined", rpath, c))
				}
			}
			for wi, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
				if _, ok := m.clusters[wc.GetName()]; !ok {
					problems = append(problems, fmt.Sprintf("%s.route.weighted_clusters.clusters[%d]: %q is not defined", rpath, wi, wc.GetName()))
				}
			}
		}
	}
	return problems
}

// grpcClusterProblem says what is wrong with cluster as the target of
// Envoy's gRPC client, or returns "".
func grpcClusterProblem(m *model, cluster string) string {
	opts, ok := m.clusters[cluster]
	switch {
	case !ok:
		return fmt.Sprintf("cluster %q is not defined", cluster)
	case !http2Only(opts):
		return fmt.Sprintf("cluster %q must speak HTTP/2 for gRPC (typed_extension_protocol_options HttpProtocolOptions explicit_http_config.http2_protocol_options)", cluster)
	}
	return ""
}

func http2Only(opts *anypb.Any) bool {
	if opts == nil {
		return false
	}
	o := &upstreamhttpv3.HttpProtocolOptions{}
	if err := opts.UnmarshalTo(o); err != nil {
		return false
	}
	return o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

func lintRateLimit(e rateLimitEntry, hasPerRoute bool) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, e.path+": "+fmt.Sprintf(format, args...))
	}
	rl := e.rl
	ha := rl.GetHitsAddend()
	if e.where != "per_route" {
		if hasPerRoute {
			add("ignored: RateLimitPerRoute.rate_limits or the filter's rate_limits are set, so Envoy ignores %s rate_limits", e.where)
		}
		if ha != nil {
			add("hits_addend is ignored in %s rate_limits; move the entry to RateLimitPerRoute.rate_limits", e.where)
		}
		return problems
	}
	// Rejected by Envoy at startup ("'stage' field and 'disable_key' field
	// are not supported"), not by PGV.
	if rl.GetStage() != nil || rl.GetDisableKey() != "" {
		add("stage and disable_key are not supported here")
	}
	for i, a := range rl.GetActions() {
		if a.GetDynamicMetadata() != nil {
			add("actions[%d]: the dynamic_metadata action is not supported here (use metadata)", i)
		}
	}
	if ha != nil {
		switch {
		case ha.GetFormat() != "" && ha.GetNumber() != nil, ha.GetFormat() == "" && ha.GetNumber() == nil:
			add("hits_addend must contain either a format or a number")
		case ha.GetFormat() != "":
			if n := len(formatCommand.FindAllString(ha.GetFormat(), -1)); n != 1 || strings.TrimSpace(formatCommand.ReplaceAllString(ha.GetFormat(), "")) != "" {
				add("hits_addend.format %q must be exactly one substitution command and nothing else", ha.GetFormat())
			}
			if sm := dynamicMetadata.FindStringSubmatch(ha.GetFormat()); sm != nil && !writesMetadata(e.hcm, sm[1], sm[2]) {
				add("hits_addend.format reads dynamic metadata %s:%s, but no header_to_metadata response rule in this listener writes it", sm[1], sm[2])
			}
		}
	}
	if rl.GetApplyOnStreamDone() && ha == nil {
		// Tollgate would count it as a second request, not as a cost.
		add("apply_on_stream_done without hits_addend: Tollgate counts it as one more request, not as a cost report")
	}
	return problems
}

// writesMetadata reports whether a header_to_metadata filter in hcm has a
// response rule that sets namespace:key.
func writesMetadata(hcm *hcmv3.HttpConnectionManager, ns, key string) bool {
	for _, f := range hcm.GetHttpFilters() {
		c := &h2mv3.Config{}
		if !f.GetTypedConfig().MessageIs(c) || f.GetTypedConfig().UnmarshalTo(c) != nil {
			continue
		}
		for _, r := range c.GetResponseRules() {
			for _, kv := range []*h2mv3.Config_KeyValuePair{r.GetOnHeaderPresent(), r.GetOnHeaderMissing()} {
				if kv != nil && kv.GetMetadataNamespace() == ns && kv.GetKey() == key {
					return true
				}
			}
		}
	}
	return false
}

// check decodes, deep-validates and lints one bootstrap.
func check(data []byte) (*bootstrapv3.Bootstrap, []string) {
	bs, err := decode(data)
	if err != nil {
		return nil, []string{err.Error()}
	}
	problems := deepValidate(bs)
	return bs, append(problems, lint(bs)...)
}

// ---------------------------------------------------------------------------
// Tests on the real files

func bootstrapFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(envoyGlob)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no bootstrap matches %s", envoyGlob)
	}
	return files
}

// TestBootstraps decodes, validates and lints every envoy/*.yaml.
func TestBootstraps(t *testing.T) {
	for _, file := range bootstrapFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			_, problems := check(data)
			for _, p := range problems {
				t.Errorf("%s: %s", file, p)
			}
		})
	}
}

// ruleDomains reads the `domain:` of every config/*.yaml with a plain
// line match, so that the test does not depend on the config parser for
// this.
func ruleDomains(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(rulesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^domain:[ \t]*("[^"]*"|'[^']*'|[^\s#]+)`)
	out := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if sm := re.FindSubmatch(data); sm != nil {
			out[strings.Trim(string(sm[1]), `"'`)] = f
		}
	}
	if len(out) == 0 {
		t.Fatalf("no domain: found in %s/*.yaml", rulesDir)
	}
	return out
}

// wiring checks bs against Tollgate's rules: each ratelimit filter's
// domain is the domain: of a file in config/ and loads, its cluster
// exists, and every descriptor built only from request headers matches a
// rule of the right kind. It also returns the key lists ("tenant,model")
// of the request-phase descriptors it saw, and how many ratelimit filters.
func wiring(bs *bootstrapv3.Bootstrap, rules *limit.RuleSet, domains map[string]string) (problems []string, built map[string]bool, nFilters int) {
	m, problems := buildModel(bs)
	for _, site := range m.hcms {
		filters, err := ratelimitFilters(site.hcm)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", site.path, err))
			continue
		}
		for _, name := range keys(filters) {
			f := filters[name]
			nFilters++
			where := fmt.Sprintf("%s<HttpConnectionManager>.http_filters[%q]", site.path, name)
			if _, ok := domains[f.GetDomain()]; !ok {
				problems = append(problems, fmt.Sprintf("%s: domain %q is the domain: of no %s/*.yaml (have %v); Tollgate would answer OK to everything", where, f.GetDomain(), rulesDir, keys(domains)))
			}
			if rules.Domain(f.GetDomain()) == nil {
				problems = append(problems, fmt.Sprintf("%s: config.Load(%s) has no domain %q", where, rulesDir, f.GetDomain()))
			}
			c := f.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
			if _, ok := m.clusters[c]; !ok {
				problems = append(problems, fmt.Sprintf("%s: cluster %q is not in static_resources.clusters", where, c))
			}
		}
	}

	entries, more := rateLimitEntries(m)
	problems = append(problems, more...)
	built = map[string]bool{}
	for _, e := range entries {
		ents, ok := headerDescriptor(e.rl)
		if !ok {
			continue // built from something other than request headers
		}
		var ks []string
		for i := range ents {
			ks = append(ks, ents[i].Key)
			v, ok := sampleValues[ents[i].Key]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: no sample value for descriptor key %q; add one to sampleValues", e.path, ents[i].Key))
			}
			ents[i].Value = v
		}
		dom := rules.Domain(e.domain)
		if dom == nil {
			problems = append(problems, fmt.Sprintf("%s: domain %q is not loaded", e.path, e.domain))
			continue
		}
		r := dom.Match(ents)
		switch {
		case r == nil:
			problems = append(problems, fmt.Sprintf("%s: descriptor %v matches no rule in domain %q", e.path, ents, e.domain))
		case e.rl.GetHitsAddend() != nil && r.TokenLimit == nil:
			// Without a token_limit Tollgate charges hits_addend against
			// the request limit: a 2,000-token response would count as
			// 2,000 requests.
			problems = append(problems, fmt.Sprintf("%s: descriptor %v has hits_addend but rule %s has no token_limit", e.path, ents, r.ID))
		case e.rl.GetHitsAddend() == nil && r.RateLimit == nil && !r.Unlimited:
			problems = append(problems, fmt.Sprintf("%s: descriptor %v is a request but rule %s has no rate_limit", e.path, ents, r.ID))
		}
		if !e.rl.GetApplyOnStreamDone() {
			built[strings.Join(ks, ",")] = true
		}
	}
	return problems, built, nFilters
}

func loadRules(t *testing.T) (*limit.RuleSet, map[string]string) {
	t.Helper()
	domains := ruleDomains(t)
	rules, err := config.Load(rulesDir)
	if err != nil {
		t.Fatalf("config.Load(%s): %v", rulesDir, err)
	}
	return rules, domains
}

// TestWiring checks every bootstrap against Tollgate's rules in config/,
// and that it sends the (tenant), (tenant, model) and (model) descriptors
// before the request.
func TestWiring(t *testing.T) {
	rules, domains := loadRules(t)
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
			problems, built, nFilters := wiring(bs, rules, domains)
			if nFilters == 0 {
				t.Skipf("%s has no ratelimit filter", file)
			}
			for _, p := range problems {
				t.Errorf("%s: %s", file, p)
			}
			for _, want := range []string{"tenant", "tenant,model", "model"} {
				if !built[want] {
					t.Errorf("%s: no request-phase descriptor (%s) built from request headers (have %v)", file, want, keys(built))
				}
			}
		})
	}
}

// TestWiringCatches proves the wiring checks can fail.
func TestWiringCatches(t *testing.T) {
	rules, domains := loadRules(t)
	for _, tc := range []struct {
		name     string
		old, new string
		want     []string
	}{
		{
			name: "domain in no rule file",
			old:  "domain: inference", new: "domain: inferenc",
			want: []string{`http_filters["envoy.filters.http.ratelimit"]`, `domain "inferenc" is the domain: of no`},
		},
		{
			name: "descriptor that matches no rule",
			old:  "{request_headers: {header_name: x-model, descriptor_key: model}}", new: "{request_headers: {header_name: x-model, descriptor_key: modle}}",
			want: []string{"rate_limits[1]", "matches no rule"},
		},
		{
			name: "cost report on a rule without token_limit",
			old:  "- actions: [{request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}]\n", new: "- actions: [{request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}]\n                      hits_addend: {number: 5}\n",
			want: []string{"rate_limits[0]", "has hits_addend but rule tenant has no token_limit"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Count(base, tc.old) != 1 {
				t.Fatalf("%q occurs %d times in base, want once", tc.old, strings.Count(base, tc.old))
			}
			bs, err := decode([]byte(strings.Replace(base, tc.old, tc.new, 1)))
			if err != nil {
				t.Fatal(err)
			}
			problems, _, _ := wiring(bs, rules, domains)
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

// headerDescriptor returns the entries rl builds when every action is a
// request_headers action, with keys and no values.
func headerDescriptor(rl *routev3.RateLimit) ([]limit.Entry, bool) {
	var out []limit.Entry
	for _, a := range rl.GetActions() {
		rh := a.GetRequestHeaders()
		if rh == nil {
			return nil, false
		}
		out = append(out, limit.Entry{Key: rh.GetDescriptorKey()})
	}
	return out, len(out) > 0
}

// TestExampleDescriptorsMatch pins the descriptors the bootstrap relies on
// to the rules in config/inference.yaml.
func TestExampleDescriptorsMatch(t *testing.T) {
	rules, err := config.Load(rulesDir)
	if err != nil {
		t.Fatal(err)
	}
	dom := rules.Domain("inference")
	if dom == nil {
		t.Fatal(`no domain "inference"`)
	}
	for _, tc := range []struct {
		entries    []limit.Entry
		rate, toks bool
	}{
		{entries: []limit.Entry{{Key: "tenant", Value: "x"}}, rate: true},
		{entries: []limit.Entry{{Key: "tenant", Value: "x"}, {Key: "model", Value: "gpt-4o"}}, rate: true, toks: true},
		{entries: []limit.Entry{{Key: "model", Value: "gpt-4o"}}, rate: true},
		{entries: []limit.Entry{{Key: "user", Value: "u-1"}}, rate: true},
	} {
		r := dom.Match(tc.entries)
		if r == nil {
			t.Errorf("%v matches no rule", tc.entries)
			continue
		}
		if (r.RateLimit != nil) != tc.rate || (r.TokenLimit != nil) != tc.toks {
			t.Errorf("%v matches %s with rate_limit=%v token_limit=%v, want %v and %v", tc.entries, r.ID, r.RateLimit != nil, r.TokenLimit != nil, tc.rate, tc.toks)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ---------------------------------------------------------------------------
// Negative tests: the checks above can fail

// base is a small, valid bootstrap with the same shape as envoy/envoy.yaml.
// Each case below changes one thing in it.
const base = `
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
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: backend}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}]
                    - actions: [{request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}, {request_headers: {header_name: x-model, descriptor_key: model}}]
                      apply_on_stream_done: true
                      hits_addend: {format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%"}
          http_filters:
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              response_rules:
              - header: x-usage-total-tokens
                on_header_present: {metadata_namespace: tollgate, key: usage_total_tokens, type: NUMBER}
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: inference
              stage: 0
              failure_mode_deny: false
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: tollgate}}
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

func TestBaseIsValid(t *testing.T) {
	if _, problems := check([]byte(base)); len(problems) > 0 {
		t.Fatalf("base bootstrap: %s", strings.Join(problems, "\n"))
	}
}

// TestCatches changes one thing in base per case and requires a problem
// containing every wanted string (the path and the message).
func TestCatches(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new string
		want     []string
	}{
		{
			name: "unknown field inside typed_config",
			old:  "failure_mode_deny: false", new: "failure_mode_denyy: false",
			want: []string{"protojson", `unknown field "failure_mode_denyy"`},
		},
		{
			name: "unknown top-level field",
			old:  "static_resources:", new: "static_resourcez:",
			want: []string{"protojson", `unknown field "static_resourcez"`},
		},
		{
			name: "unknown @type",
			old:  "ratelimit.v3.RateLimit\n", new: "ratelimit.v3.RateLimitX\n",
			want: []string{"protojson", "envoy.extensions.filters.http.ratelimit.v3.RateLimitX"},
		},
		{
			name: "stage out of range inside typed_config",
			old:  "stage: 0", new: "stage: 99",
			want: []string{"filters[0].typed_config<HttpConnectionManager>.http_filters[1].typed_config<RateLimit>", "RateLimit.Stage", "less than or equal to 10"},
		},
		{
			name: "empty domain inside typed_config",
			old:  "domain: inference", new: `domain: ""`,
			want: []string{"http_filters[1].typed_config<RateLimit>", "RateLimit.Domain", "at least 1"},
		},
		{
			name: "hits_addend over 1e9 inside typed_per_filter_config",
			old:  `hits_addend: {format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%"}`, new: "hits_addend: {number: 2000000000}",
			want: []string{`typed_per_filter_config["envoy.filters.http.ratelimit"]<RateLimitPerRoute>.rate_limits[1].hits_addend`, "Number", "1000000000"},
		},
		{
			name: "negative duration without a PGV rule",
			old:  "failure_mode_deny: false", new: "failure_mode_deny: false\n              timeout: -1s",
			want: []string{"typed_config<RateLimit>.timeout", "negative duration"},
		},
		{
			name: "top-level PGV violation",
			old:  "port_value: 9901", new: "port_value: 99999",
			want: []string{"admin.address.socket_address", "PortValue"},
		},
		{
			name: "hits_addend with format and number",
			old:  `hits_addend: {format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%"}`, new: `hits_addend: {format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%", number: 1}`,
			want: []string{"rate_limits[1]", "either a format or a number"},
		},
		{
			name: "hits_addend format with two commands",
			old:  `hits_addend: {format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%"}`, new: `hits_addend: {format: "%BYTES_RECEIVED%%BYTES_SENT%"}`,
			want: []string{"rate_limits[1]", "exactly one substitution command"},
		},
		{
			name: "hits_addend reads metadata nobody writes",
			old:  "key: usage_total_tokens", new: "key: usage_tokens",
			want: []string{"rate_limits[1]", "tollgate:usage_total_tokens", "no header_to_metadata"},
		},
		{
			name: "stage in RateLimitPerRoute",
			old:  "- actions: [{request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}]\n", new: "- actions: [{request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}]\n                      stage: 1\n",
			want: []string{"rate_limits[0]", "stage and disable_key are not supported"},
		},
		{
			name: "route-level rate_limits shadowed by per-route ones",
			old:  "route: {cluster: backend}", new: "route: {cluster: backend, rate_limits: [{actions: [{request_headers: {header_name: x-model, descriptor_key: model}}], hits_addend: {number: 5}}]}",
			want: []string{"route.rate_limits[0]", "hits_addend is ignored in route_action"},
		},
		{
			name: "rate limit service cluster missing",
			old:  "cluster_name: tollgate}}", new: "cluster_name: tolgate}}",
			want: []string{"rate_limit_service", `cluster "tolgate" is not defined`},
		},
		{
			name: "rate limit service cluster not HTTP/2",
			old:  "explicit_http_config: {http2_protocol_options: {}}", new: "explicit_http_config: {http_protocol_options: {}}",
			want: []string{"rate_limit_service", "must speak HTTP/2"},
		},
		{
			name: "x-ratelimit headers enabled",
			old:  "failure_mode_deny: false", new: "failure_mode_deny: false\n              enable_x_ratelimit_headers: DRAFT_VERSION_03",
			want: []string{"enable_x_ratelimit_headers", "must stay OFF"},
		},
		{
			name: "route cluster missing",
			old:  "route: {cluster: backend}", new: "route: {cluster: backendd}",
			want: []string{"route.cluster", `"backendd" is not defined`},
		},
		{
			name: "per-filter config under a wrong name",
			old:  "                  envoy.filters.http.ratelimit:\n", new: "                  envoy.filters.http.rate_limit:\n",
			want: []string{`typed_per_filter_config["envoy.filters.http.rate_limit"]`, "no HTTP filter has this name"},
		},
		{
			name: "router not last",
			old:  "          - name: envoy.filters.http.header_to_metadata\n", new: "          - name: envoy.filters.http.router\n            typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}\n          - name: envoy.filters.http.header_to_metadata\n",
			want: []string{"http_filters[0]", "router must be the last"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Count(base, tc.old) != 1 {
				t.Fatalf("%q occurs %d times in base, want once", tc.old, strings.Count(base, tc.old))
			}
			_, problems := check([]byte(strings.Replace(base, tc.old, tc.new, 1)))
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

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestShallowValidationMissesNestedErrors documents why the deep walk
// exists: PGV on the Bootstrap does not look inside Any, so a broken
// filter config passes Bootstrap.ValidateAll.
func TestShallowValidationMissesNestedErrors(t *testing.T) {
	bs, err := decode([]byte(strings.Replace(base, "stage: 0", "stage: 99", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("Bootstrap.ValidateAll() = %v; expected it to miss the error inside typed_config (if PGV now descends into Any, the deep walk reports duplicates)", err)
	}
	if problems := deepValidate(bs); len(problems) == 0 {
		t.Fatal("deepValidate found nothing")
	}
}

// TestTypedStructIsUnpacked checks that a TypedStruct is validated like an Any.
func TestTypedStructIsUnpacked(t *testing.T) {
	const asAny = `          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: inference
              stage: 0
              failure_mode_deny: false
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: tollgate}}
`
	const asTypedStruct = `          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/udpa.type.v1.TypedStruct
              type_url: type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              value:
                domain: inference
                stage: 99
                rate_limit_service: {transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: tollgate}}}
`
	if strings.Count(base, asAny) != 1 {
		t.Fatal("the ratelimit filter block is not in base")
	}
	bs, err := decode([]byte(strings.Replace(base, asAny, asTypedStruct, 1)))
	if err != nil {
		t.Fatal(err)
	}
	problems := deepValidate(bs)
	for _, p := range problems {
		if containsAll(p, []string{"http_filters[1].typed_config<TypedStruct><RateLimit>", "RateLimit.Stage"}) {
			return
		}
	}
	t.Fatalf("stage 99 inside a TypedStruct not reported; got:\n%s", strings.Join(problems, "\n"))
}

// TestEveryTypeResolves lists the @type of every file and checks that each
// resolves, so that a missing import shows up by name.
func TestEveryTypeResolves(t *testing.T) {
	re := regexp.MustCompile(`"?@type"?:\s*"?type\.googleapis\.com/([A-Za-z0-9_.]+)`)
	for _, file := range bootstrapFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, sm := range re.FindAllSubmatch(data, -1) {
			name := protoreflect.FullName(sm[1])
			if _, err := protoregistry.GlobalTypes.FindMessageByName(name); err != nil {
				t.Errorf("%s: @type %s is not registered: blank-import its go-control-plane package", file, name)
			}
		}
		if !bytes.Contains(data, []byte("type.googleapis.com/")) {
			t.Errorf("%s: no typed_config at all?", file)
		}
	}
}
