package envoyconfig

// The ext_proc filters: the usage reader (observability mode, after
// ext_authz) that lets Tollgate read the usage from each response, and the
// optional request-phase filter that adds stream_options.include_usage.
// Like the ext_authz lints, these look only at ext_proc filters, and at
// HCMs with an ext_authz filter, so envoy/envoy.yaml passes them
// trivially.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// extAuthzNamespace is where Envoy's ext_authz filter writes Check's
// dynamic metadata, the ticket among it; the ext_proc filters must
// forward it (extproc.DefaultNamespace).
const extAuthzNamespace = "envoy.filters.http.ext_authz"

// extProc is one ext_proc HTTP filter of an HCM.
type extProc struct {
	index    int
	path     string // ...http_filters[i].typed_config<ExternalProcessor>
	disabled bool   // HttpFilter.disabled: off unless a route enables it
	cfg      *extprocv3.ExternalProcessor
}

func (f extProc) cluster() string { return f.cfg.GetGrpcService().GetEnvoyGrpc().GetClusterName() }

func extProcFilters(base string, hcm *hcmv3.HttpConnectionManager) ([]extProc, []string) {
	var out []extProc
	var problems []string
	for i, f := range hcm.GetHttpFilters() {
		c := &extprocv3.ExternalProcessor{}
		if !f.GetTypedConfig().MessageIs(c) {
			continue
		}
		path := fmt.Sprintf("%s.http_filters[%d].typed_config<ExternalProcessor>", base, i)
		if err := f.GetTypedConfig().UnmarshalTo(c); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		out = append(out, extProc{index: i, path: path, disabled: f.GetDisabled(), cfg: c})
	}
	return out, problems
}

// headerMode and bodyMode resolve DEFAULT to what Envoy does for it in a
// filter's processing_mode: headers are sent, trailers skipped, bodies
// not sent.
func headerMode(m extprocv3.ProcessingMode_HeaderSendMode, trailer bool) extprocv3.ProcessingMode_HeaderSendMode {
	if m != extprocv3.ProcessingMode_DEFAULT {
		return m
	}
	if trailer {
		return extprocv3.ProcessingMode_SKIP
	}
	return extprocv3.ProcessingMode_SEND
}

// lintExtProcPath checks one HCM's ext_proc filters against what
// Tollgate's Process expects, and that an HCM with ext_authz has a usage
// reader.
func lintExtProcPath(m *model, site httpFilterSite) []string {
	base := site.path + "<HttpConnectionManager>"
	authz, problems := extAuthzFilters(base, site.hcm)
	procs, more := extProcFilters(base, site.hcm)
	problems = append(problems, more...)
	if len(authz) == 0 && len(procs) == 0 {
		return problems
	}
	tollgate := map[string]bool{}
	firstAuthz := -1
	for _, a := range authz {
		if c := a.cluster(); c != "" {
			tollgate[c] = true
		}
		if firstAuthz < 0 {
			firstAuthz = a.index
		}
	}
	readers := 0
	for _, p := range procs {
		problems = append(problems, lintExtProc(m, p, firstAuthz, tollgate)...)
		if p.cfg.GetObservabilityMode() && !p.disabled {
			readers++
		}
	}
	if len(authz) > 0 && readers == 0 {
		problems = append(problems, base+".http_filters: ext_authz reserves tokens, but no enabled ext_proc filter in observability_mode reads the usage from the responses: every reservation settles at its estimate (model servers report usage only in the body)")
	}
	return problems
}

// lintExtProc checks one ext_proc filter: the reader if it is in
// observability mode, else the request-phase filter.
func lintExtProc(m *model, f extProc, firstAuthz int, tollgate map[string]bool) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, f.path+fmt.Sprintf(format, args...))
	}
	c := f.cfg
	switch {
	case c.GetGrpcService() == nil:
		add(": want grpc_service (Tollgate serves ext_proc over gRPC; http_service cannot send bodies)")
	case f.cluster() == "":
		add(".grpc_service: want envoy_grpc with a cluster_name")
	default:
		if p := grpcClusterProblem(m, f.cluster()); p != "" {
			add(".grpc_service: %s", p)
		}
		if !tollgate[f.cluster()] {
			add(".grpc_service: cluster %q is not Tollgate's (the cluster ext_authz sends Check to: %v)", f.cluster(), keys(tollgate))
		}
	}
	if firstAuthz < 0 || f.index < firstAuthz {
		add(": must come after the ext_authz filter, whose dynamic metadata (the reservation ticket) it forwards")
	}
	if !slices.Contains(c.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), extAuthzNamespace) {
		add(".metadata_options.forwarding_namespaces.untyped does not list %s: Tollgate gets no ticket and reads nothing", extAuthzNamespace)
	}
	if !c.GetFailureModeAllow() {
		add(".failure_mode_allow is false: a Tollgate outage would fail requests that ext_authz already admitted; the access log or expiry still ends the reservation")
	}
	pm := c.GetProcessingMode()
	want := func(field string, got, wantV fmt.Stringer) {
		if got.String() != wantV.String() {
			add(".processing_mode.%s is %v, want %v", field, got, wantV)
		}
	}
	if c.GetObservabilityMode() {
		if f.disabled {
			add(": the usage reader is disabled")
		}
		// Request phases: Tollgate reads only the response.
		want("request_header_mode", headerMode(pm.GetRequestHeaderMode(), false), extprocv3.ProcessingMode_SKIP)
		want("request_body_mode", pm.GetRequestBodyMode(), extprocv3.ProcessingMode_NONE)
		want("request_trailer_mode", headerMode(pm.GetRequestTrailerMode(), true), extprocv3.ProcessingMode_SKIP)
		want("response_header_mode", headerMode(pm.GetResponseHeaderMode(), false), extprocv3.ProcessingMode_SEND)
		// STREAMED is the body mode observability mode supports (with
		// GRPC and NONE); a buffered mode would send no body at all.
		want("response_body_mode", pm.GetResponseBodyMode(), extprocv3.ProcessingMode_STREAMED)
		want("response_trailer_mode", headerMode(pm.GetResponseTrailerMode(), true), extprocv3.ProcessingMode_SEND)
		return problems
	}
	// The request-phase filter: Envoy waits for each answer.
	want("request_header_mode", headerMode(pm.GetRequestHeaderMode(), false), extprocv3.ProcessingMode_SEND)
	want("request_body_mode", pm.GetRequestBodyMode(), extprocv3.ProcessingMode_BUFFERED)
	want("response_header_mode", headerMode(pm.GetResponseHeaderMode(), false), extprocv3.ProcessingMode_SKIP)
	want("response_body_mode", pm.GetResponseBodyMode(), extprocv3.ProcessingMode_NONE)
	want("response_trailer_mode", headerMode(pm.GetResponseTrailerMode(), true), extprocv3.ProcessingMode_SKIP)
	if d := c.GetMessageTimeout(); d == nil || d.AsDuration() > maxRequestPhaseTimeout {
		add(".message_timeout is %v: set it, at most %v; each request waits for Tollgate's answer up to it", d.AsDuration(), maxRequestPhaseTimeout)
	}
	return problems
}

// maxRequestPhaseTimeout is the longest message_timeout the request-phase
// filter may have: the answer takes microseconds, and every request waits.
const maxRequestPhaseTimeout = 500 * time.Millisecond

// ---------------------------------------------------------------------------
// Negative tests

const (
	readerPath  = "filters[0].typed_config<HttpConnectionManager>.http_filters[1].typed_config<ExternalProcessor>"
	requestPath = "filters[0].typed_config<HttpConnectionManager>.http_filters[2].typed_config<ExternalProcessor>"
)

// requestPhaseFilter is the optional request-phase filter, inserted after
// the reader in baseAuthz for the cases about it.
const requestPhaseFilter = `          - name: tollgate.include_usage
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {envoy_grpc: {cluster_name: tollgate}}
              failure_mode_allow: true
              processing_mode: {request_header_mode: SEND, request_body_mode: BUFFERED, response_header_mode: SKIP}
              metadata_options: {forwarding_namespaces: {untyped: [envoy.filters.http.ext_authz]}}
              message_timeout: 0.1s
`

// TestExtProcRequestPhaseIsValid: baseAuthz with the request-phase
// filter has no problem.
func TestExtProcRequestPhaseIsValid(t *testing.T) {
	in := strings.Replace(baseAuthz, routerFilter, requestPhaseFilter+routerFilter, 1)
	if _, problems := check([]byte(in)); len(problems) > 0 {
		t.Fatalf("%s", strings.Join(problems, "\n"))
	}
}

// routerFilter starts the router in baseAuthz.
const routerFilter = "          - name: envoy.filters.http.router\n"

// TestExtProcCatches changes one thing in baseAuthz (with the
// request-phase filter added, for the cases about it) and requires a
// problem containing every wanted string.
func TestExtProcCatches(t *testing.T) {
	const (
		reader    = "          - name: envoy.filters.http.ext_proc\n"
		readerEnd = "              stat_prefix: tollgate_usage\n"
	)
	readerBlock := baseAuthz[strings.Index(baseAuthz, reader) : strings.Index(baseAuthz, readerEnd)+len(readerEnd)]
	authzHeader := "          - name: envoy.filters.http.ext_authz\n"
	for _, tt := range []struct {
		name    string
		request bool        // add the request-phase filter first
		edits   [][2]string // old -> new, in order; each old must occur once
		want    []string
	}{
		{
			name:  "no usage reader",
			edits: [][2]string{{readerBlock, ""}},
			want:  []string{"http_filters: ext_authz reserves tokens, but no enabled ext_proc filter in observability_mode"},
		},
		{
			name:  "reader disabled",
			edits: [][2]string{{reader, reader + "            disabled: true\n"}},
			want:  []string{readerPath + ": the usage reader is disabled"},
		},
		{
			name:  "reader before ext_authz",
			edits: [][2]string{{readerBlock, ""}, {authzHeader, readerBlock + authzHeader}},
			want:  []string{"http_filters[0].typed_config<ExternalProcessor>: must come after the ext_authz filter"},
		},
		{
			name:  "observability mode off",
			edits: [][2]string{{"observability_mode: true", "observability_mode: false"}},
			want:  []string{readerPath + ".processing_mode.request_header_mode is SKIP, want SEND"},
		},
		{
			name:  "request headers sent to the reader",
			edits: [][2]string{{"request_header_mode: SKIP, response_body_mode: STREAMED", "request_header_mode: SEND, response_body_mode: STREAMED"}},
			want:  []string{readerPath + ".processing_mode.request_header_mode is SEND, want SKIP"},
		},
		{
			name:  "response body buffered",
			edits: [][2]string{{"response_body_mode: STREAMED", "response_body_mode: BUFFERED"}},
			want:  []string{readerPath + ".processing_mode.response_body_mode is BUFFERED, want STREAMED"},
		},
		{
			name:  "response headers skipped",
			edits: [][2]string{{"response_body_mode: STREAMED", "response_header_mode: SKIP, response_body_mode: STREAMED"}},
			want:  []string{readerPath + ".processing_mode.response_header_mode is SKIP, want SEND"},
		},
		{
			name:  "response trailers skipped",
			edits: [][2]string{{"response_trailer_mode: SEND", "response_trailer_mode: SKIP"}},
			want:  []string{readerPath + ".processing_mode.response_trailer_mode is SKIP, want SEND"},
		},
		{
			name:  "ext_authz namespace not forwarded",
			edits: [][2]string{{"{untyped: [envoy.filters.http.ext_authz]}}\n              stat_prefix", "{typed: [envoy.filters.http.ext_authz]}}\n              stat_prefix"}},
			want:  []string{readerPath + ".metadata_options.forwarding_namespaces.untyped does not list envoy.filters.http.ext_authz"},
		},
		{
			name:  "reader fails closed",
			edits: [][2]string{{"failure_mode_allow: true\n              observability_mode", "failure_mode_allow: false\n              observability_mode"}},
			want:  []string{readerPath + ".failure_mode_allow is false"},
		},
		{
			name:  "reader on another cluster",
			edits: [][2]string{{"envoy_grpc: {cluster_name: tollgate}\n              failure_mode_allow: true\n              observability_mode", "envoy_grpc: {cluster_name: backend}\n              failure_mode_allow: true\n              observability_mode"}},
			want:  []string{readerPath + `.grpc_service: cluster "backend" is not Tollgate's`},
		},
		{
			name:  "unknown field (strict decode)",
			edits: [][2]string{{"observability_mode: true", "observability_modee: true"}},
			want:  []string{"protojson", `unknown field "observability_modee"`},
		},
		{
			name:  "PGV inside the ext_proc typed_config",
			edits: [][2]string{{"response_body_mode: STREAMED", "response_body_mode: STREAMED, request_trailer_mode: 7"}},
			want:  []string{readerPath + ".processing_mode", "RequestTrailerMode", "defined enum"},
		},
		{
			name: "request phase: body streamed", request: true,
			edits: [][2]string{{"request_body_mode: BUFFERED", "request_body_mode: STREAMED"}},
			want:  []string{requestPath + ".processing_mode.request_body_mode is STREAMED, want BUFFERED"},
		},
		{
			name: "request phase: response body sent", request: true,
			edits: [][2]string{{"response_header_mode: SKIP}", "response_header_mode: SKIP, response_body_mode: STREAMED}"}},
			want:  []string{requestPath + ".processing_mode.response_body_mode is STREAMED, want NONE"},
		},
		{
			name: "request phase: no message_timeout", request: true,
			edits: [][2]string{{"              message_timeout: 0.1s\n", ""}},
			want:  []string{requestPath + ".message_timeout is 0s: set it"},
		},
		{
			name: "request phase: fails closed", request: true,
			edits: [][2]string{{"failure_mode_allow: true\n              processing_mode: {request_header_mode: SEND", "failure_mode_allow: false\n              processing_mode: {request_header_mode: SEND"}},
			want:  []string{requestPath + ".failure_mode_allow is false"},
		},
		{
			name: "request phase: no ticket forwarded", request: true,
			edits: [][2]string{{"{untyped: [envoy.filters.http.ext_authz]}}\n              message_timeout", "{}}\n              message_timeout"}},
			want:  []string{requestPath + ".metadata_options.forwarding_namespaces.untyped does not list"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := baseAuthz
			if tt.request {
				in = strings.Replace(in, routerFilter, requestPhaseFilter+routerFilter, 1)
			}
			for _, e := range tt.edits {
				if n := strings.Count(in, e[0]); n != 1 {
					t.Fatalf("%q occurs %d times, want once", e[0], n)
				}
				in = strings.Replace(in, e[0], e[1], 1)
			}
			_, problems := check([]byte(in))
			for _, p := range problems {
				if containsAll(p, tt.want) {
					t.Log(p)
					return
				}
			}
			t.Errorf("no problem contains all of %q; got:\n%s", tt.want, strings.Join(problems, "\n"))
		})
	}
}
