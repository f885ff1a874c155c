package envoysim

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	alsgrpcv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	extprocfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	h2mv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	rlfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	// Types the bootstraps name only in typed_config: importing them
	// registers them for protojson's "@type" resolution.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Filter and logger names the bootstraps use (the keys Envoy looks them
// up by; typed_per_filter_config is keyed by the filter's name).
const (
	filterExtAuthz  = "envoy.filters.http.ext_authz"
	filterExtProc   = "envoy.filters.http.ext_proc"
	filterRateLimit = "envoy.filters.http.ratelimit"
	filterH2M       = "envoy.filters.http.header_to_metadata"
	loggerHTTPGrpc  = "envoy.access_loggers.http_grpc"
)

// Envoy's defaults for fields a bootstrap may leave unset, each from the
// field's comment in go-control-plane v1.40.0.
const (
	defaultAuthzTimeout   = 200 * time.Millisecond // GrpcService.timeout on ext_authz ("Defaults to 200ms")
	defaultRLSTimeout     = 20 * time.Millisecond  // ratelimit.v3.RateLimit.timeout ("defaults to 20ms")
	defaultFlushInterval  = time.Second            // CommonGrpcAccessLogConfig.buffer_flush_interval (1s)
	defaultBufferSize     = 16384                  // CommonGrpcAccessLogConfig.buffer_size_bytes (16384)
	defaultRouteTimeout   = 15 * time.Second       // RouteAction.timeout (15s)
	defaultDeferredClose  = 5 * time.Second        // ExternalProcessor.deferred_close_timeout (5s)
	defaultMaxRequests    = 1024                   // CircuitBreakers.Thresholds.max_requests (1024)
	defaultMaxRetries     = 3                      // CircuitBreakers.Thresholds.max_retries (3)
	defaultRetryBase      = 25 * time.Millisecond  // RetryPolicy.retry_back_off.base_interval (25ms)
	defaultNumRetries     = 1                      // RetryPolicy.num_retries (1)
	defaultRLNamespace    = filterRateLimit        // ratelimit.v3.RateLimit.metadata_namespace default
	defaultDeniedStatus   = 403                    // DeniedHttpResponse.status ("Envoy sends 403 Forbidden")
	defaultRateLimitedSta = 429                    // ratelimit.v3.RateLimit.rate_limited_status (429)
	defaultRLSErrorStatus = 500                    // ratelimit.v3.RateLimit.status_on_error (500)
)

// settings is what the simulator takes from a bootstrap: one listener,
// its HTTP connection manager, its first route's cluster and policies,
// and that cluster's circuit breakers.
type settings struct {
	listenerPort uint32

	route        routeSettings
	missingRoute *directResponse // a later prefix route answering directly (envoy.yaml's missing_tenant)

	authz   *authzSettings   // nil: no ext_authz filter
	extProc *extProcSettings // nil: no ext_proc filter (or disabled)
	rls     *rlsSettings     // nil: no ratelimit filter
	als     *alsSettings     // nil: no http_grpc access logger

	maxRequests uint32 // the upstream cluster's circuit breaker
	maxRetries  uint32
	// retryBudget, when the cluster sets one, replaces maxRetries (as in
	// Envoy: a retry_budget overrides the max_retries threshold).
	retryBudget *retryBudget
}

// retryBudget is a circuit breaker's retry_budget: retries in flight at
// most percent of the requests in flight, and never fewer than
// minConcurrency.
type retryBudget struct {
	percent        float64
	minConcurrency uint32
}

// allows reports whether one more retry may start while retrying are in
// flight among active requests.
func (b *retryBudget) allows(retrying, active int64) bool {
	limit := max(int64(b.minConcurrency), int64(b.percent/100*float64(active)))
	return retrying < limit
}

type routeSettings struct {
	name, cluster string
	prefix        string
	present       []string // headers that must be present (HeaderMatcher present_match)
	timeout       time.Duration
	retry         *routev3.RetryPolicy // nil: none on the route
	perFilterRLS  *rlfv3.RateLimitPerRoute
}

type directResponse struct {
	status uint32
	body   string
}

type authzSettings struct {
	timeout          time.Duration
	maxRequestBytes  int
	allowPartial     bool
	packAsBytes      bool
	failureModeAllow bool
	statusOnError    int
}

type extProcSettings struct {
	observability bool
	mode          *extprocfv3.ProcessingMode
	namespaces    []string // metadata_options.forwarding_namespaces.untyped
	deferredClose time.Duration
}

type rlsSettings struct {
	domain            string
	timeout           time.Duration
	failureModeDeny   bool
	rateLimitedStatus int
	statusOnError     int
	namespace         string
	rateLimits        []*routev3.RateLimit
	h2m               []*h2mv3.Config_Rule // response rules of header_to_metadata
}

type alsSettings struct {
	logName               string
	flushInterval         time.Duration
	bufferSize            int
	requestHeadersToLog   []string
	responseHeadersToLog  []string
	responseTrailersToLog []string
}

// loadSettings decodes a bootstrap strictly into Envoy's own protos (as
// test/envoyconfig does) and takes the settings the simulation follows.
// A filter or setting the simulator does not implement is an error, so
// that a bootstrap it cannot mirror is never simulated wrongly in silence.
func loadSettings(path string) (*settings, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read bootstrap: %w", err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parse bootstrap %s: %w", path, err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, bs); err != nil {
		return nil, fmt.Errorf("decode bootstrap %s: %w", path, err)
	}
	s, err := fromBootstrap(bs)
	if err != nil {
		return nil, fmt.Errorf("bootstrap %s: %w", path, err)
	}
	return s, nil
}

func fromBootstrap(bs *bootstrapv3.Bootstrap) (*settings, error) {
	ls := bs.GetStaticResources().GetListeners()
	if len(ls) != 1 || len(ls[0].GetFilterChains()) != 1 {
		return nil, errors.New("want one listener with one filter chain")
	}
	s := &settings{listenerPort: ls[0].GetAddress().GetSocketAddress().GetPortValue()}
	var hcm hcmv3.HttpConnectionManager
	fs := ls[0].GetFilterChains()[0].GetFilters()
	if len(fs) != 1 || fs[0].GetTypedConfig().UnmarshalTo(&hcm) != nil {
		return nil, errors.New("want one http_connection_manager filter")
	}
	if err := s.takeRoute(hcm.GetRouteConfig()); err != nil {
		return nil, err
	}
	for _, f := range hcm.GetHttpFilters() {
		if f.GetDisabled() {
			continue
		}
		if err := s.takeFilter(f); err != nil {
			return nil, fmt.Errorf("filter %s: %w", f.GetName(), err)
		}
	}
	for _, l := range hcm.GetAccessLog() {
		if l.GetName() != loggerHTTPGrpc {
			continue // stdout: nothing to simulate
		}
		var c alsgrpcv3.HttpGrpcAccessLogConfig
		if err := l.GetTypedConfig().UnmarshalTo(&c); err != nil {
			return nil, fmt.Errorf("access logger: %w", err)
		}
		cc := c.GetCommonConfig()
		s.als = &alsSettings{
			logName:               cc.GetLogName(),
			flushInterval:         durationOr(cc.GetBufferFlushInterval().AsDuration(), cc.GetBufferFlushInterval() != nil, defaultFlushInterval),
			bufferSize:            defaultBufferSize,
			requestHeadersToLog:   lower(c.GetAdditionalRequestHeadersToLog()),
			responseHeadersToLog:  lower(c.GetAdditionalResponseHeadersToLog()),
			responseTrailersToLog: lower(c.GetAdditionalResponseTrailersToLog()),
		}
		if b := cc.GetBufferSizeBytes(); b != nil {
			s.als.bufferSize = int(b.GetValue())
		}
	}
	if s.rls != nil {
		s.rls.rateLimits = s.route.perFilterRLS.GetRateLimits()
		if d := s.route.perFilterRLS.GetDomain(); d != "" {
			s.rls.domain = d
		}
	}
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == s.route.cluster {
			s.takeCluster(c)
			return s, nil
		}
	}
	return nil, fmt.Errorf("route cluster %q is not defined", s.route.cluster)
}

func (s *settings) takeRoute(rc *routev3.RouteConfiguration) error {
	vhs := rc.GetVirtualHosts()
	if len(vhs) != 1 || len(vhs[0].GetRoutes()) == 0 {
		return errors.New("want one virtual host with routes")
	}
	routes := vhs[0].GetRoutes()
	r := routes[0]
	ra := r.GetRoute()
	if ra == nil || r.GetMatch().GetPrefix() == "" {
		return errors.New("the first route must forward on a prefix")
	}
	s.route = routeSettings{
		name:    r.GetName(),
		cluster: ra.GetCluster(),
		prefix:  r.GetMatch().GetPrefix(),
		timeout: durationOr(ra.GetTimeout().AsDuration(), ra.GetTimeout() != nil, defaultRouteTimeout),
		retry:   ra.GetRetryPolicy(),
	}
	for _, h := range r.GetMatch().GetHeaders() {
		if !h.GetPresentMatch() {
			return fmt.Errorf("route %s: only present_match header matchers are simulated", r.GetName())
		}
		s.route.present = append(s.route.present, strings.ToLower(h.GetName()))
	}
	if a, ok := r.GetTypedPerFilterConfig()[filterRateLimit]; ok {
		s.route.perFilterRLS = &rlfv3.RateLimitPerRoute{}
		if err := a.UnmarshalTo(s.route.perFilterRLS); err != nil {
			return fmt.Errorf("route %s: %w", r.GetName(), err)
		}
	}
	if len(routes) > 1 {
		dr := routes[1].GetDirectResponse()
		if dr == nil || len(routes) > 2 {
			return errors.New("only a direct_response may follow the first route")
		}
		s.missingRoute = &directResponse{status: dr.GetStatus(), body: dr.GetBody().GetInlineString()}
	}
	return nil
}

func (s *settings) takeFilter(f *hcmv3.HttpFilter) error {
	switch f.GetName() {
	case filterExtAuthz:
		var c extauthzv3.ExtAuthz
		if err := f.GetTypedConfig().UnmarshalTo(&c); err != nil {
			return err
		}
		gs := c.GetGrpcService()
		a := &authzSettings{
			timeout:          durationOr(gs.GetTimeout().AsDuration(), gs.GetTimeout() != nil, defaultAuthzTimeout),
			maxRequestBytes:  int(c.GetWithRequestBody().GetMaxRequestBytes()),
			allowPartial:     c.GetWithRequestBody().GetAllowPartialMessage(),
			packAsBytes:      c.GetWithRequestBody().GetPackAsBytes(),
			failureModeAllow: c.GetFailureModeAllow(),
			statusOnError:    int(c.GetStatusOnError().GetCode()),
		}
		if a.statusOnError == 0 {
			a.statusOnError = defaultDeniedStatus // ExtAuthz.status_on_error: "Defaults to 403 Forbidden"
		}
		if c.GetAllowedHeaders() != nil || c.GetDisallowedHeaders() != nil || c.GetEncodeRawHeaders() || c.GetIncludePeerCertificate() {
			return errors.New("allowed_headers, disallowed_headers, encode_raw_headers and include_peer_certificate are not simulated")
		}
		s.authz = a
	case filterExtProc:
		var c extprocfv3.ExternalProcessor
		if err := f.GetTypedConfig().UnmarshalTo(&c); err != nil {
			return err
		}
		pm := c.GetProcessingMode()
		if pm.GetRequestHeaderMode() != extprocfv3.ProcessingMode_SKIP || pm.GetRequestBodyMode() != extprocfv3.ProcessingMode_NONE {
			return errors.New("only response processing is simulated")
		}
		if !c.GetObservabilityMode() {
			return errors.New("only observability_mode is simulated")
		}
		s.extProc = &extProcSettings{
			observability: true,
			mode:          pm,
			namespaces:    c.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(),
			deferredClose: durationOr(c.GetDeferredCloseTimeout().AsDuration(), c.GetDeferredCloseTimeout() != nil, defaultDeferredClose),
		}
	case filterRateLimit:
		var c rlfv3.RateLimit
		if err := f.GetTypedConfig().UnmarshalTo(&c); err != nil {
			return err
		}
		r := &rlsSettings{
			domain:            c.GetDomain(),
			timeout:           durationOr(c.GetTimeout().AsDuration(), c.GetTimeout() != nil, defaultRLSTimeout),
			failureModeDeny:   c.GetFailureModeDeny(),
			rateLimitedStatus: int(c.GetRateLimitedStatus().GetCode()),
			statusOnError:     int(c.GetStatusOnError().GetCode()),
			namespace:         c.GetMetadataNamespace(),
		}
		if r.rateLimitedStatus < 400 {
			r.rateLimitedStatus = defaultRateLimitedSta // rate_limited_status: "a value < 400 ... 429"
		}
		if r.statusOnError == 0 {
			r.statusOnError = defaultRLSErrorStatus
		}
		if r.namespace == "" {
			r.namespace = defaultRLNamespace
		}
		if c.GetEnableXRatelimitHeaders() != rlfv3.RateLimit_OFF || c.GetEnableRetryAfterHeader() {
			return errors.New("Envoy-made x-ratelimit or retry-after headers are not simulated")
		}
		if s.rls != nil {
			r.h2m = s.rls.h2m // header_to_metadata came first
		}
		s.rls = r
	case filterH2M:
		var c h2mv3.Config
		if err := f.GetTypedConfig().UnmarshalTo(&c); err != nil {
			return err
		}
		if len(c.GetRequestRules()) > 0 {
			return errors.New("request_rules are not simulated")
		}
		if s.rls == nil {
			s.rls = &rlsSettings{}
		}
		s.rls.h2m = c.GetResponseRules()
	case "envoy.filters.http.router":
	default:
		return errors.New("not simulated")
	}
	return nil
}

func (s *settings) takeCluster(c *clusterv3.Cluster) {
	s.maxRequests, s.maxRetries = defaultMaxRequests, defaultMaxRetries
	for _, t := range c.GetCircuitBreakers().GetThresholds() {
		if t.GetPriority() != corev3.RoutingPriority_DEFAULT {
			continue
		}
		if v := t.GetMaxRequests(); v != nil {
			s.maxRequests = v.GetValue()
		}
		if v := t.GetMaxRetries(); v != nil {
			s.maxRetries = v.GetValue()
		}
		if b := t.GetRetryBudget(); b != nil {
			// Envoy's defaults: 20% and 3.
			s.retryBudget = &retryBudget{percent: 20, minConcurrency: 3}
			if v := b.GetBudgetPercent(); v != nil {
				s.retryBudget.percent = v.GetValue()
			}
			if v := b.GetMinRetryConcurrency(); v != nil {
				s.retryBudget.minConcurrency = v.GetValue()
			}
		}
	}
}

// durationOr returns d when the field was set, else def.
func durationOr(d time.Duration, set bool, def time.Duration) time.Duration {
	if set {
		return d
	}
	return def
}

func lower(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.ToLower(s)
	}
	return out
}
