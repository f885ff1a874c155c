package istio

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
)

func mustEnv(t testing.TB) env {
	t.Helper()
	e, err := loadEnv()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustManifests(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := readManifests()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{meshConfigFile, "ext-authz.yaml", "access-log.yaml", "ratelimit.yaml", "ext-proc.yaml"} {
		if _, ok := files[want]; !ok {
			t.Fatalf("%s/%s is missing", manifestDir, want)
		}
	}
	return files
}

// TestManifests decodes, validates and lints istio/*.yaml as one set.
func TestManifests(t *testing.T) {
	t.Parallel()
	for _, p := range check(mustManifests(t), mustEnv(t)) {
		t.Error(p)
	}
}

// TestKinds pins what each file holds, so that a file that decodes into
// nothing (or the wrong kind) does not pass by being skipped.
func TestKinds(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	for _, tc := range []struct {
		give string
		want func(any) bool
	}{
		{give: "ext-authz.yaml", want: func(o any) bool { _, ok := o.(*securityv1.AuthorizationPolicy); return ok }},
		{give: "access-log.yaml", want: func(o any) bool { _, ok := o.(*telemetryv1.Telemetry); return ok }},
		{give: "ratelimit.yaml", want: func(o any) bool { _, ok := o.(*networkingv1alpha3.EnvoyFilter); return ok }},
		{give: "ext-proc.yaml", want: func(o any) bool { _, ok := o.(*networkingv1alpha3.EnvoyFilter); return ok }},
	} {
		t.Run(tc.give, func(t *testing.T) {
			t.Parallel()
			rs, err := decodeResources(tc.give, files[tc.give])
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != 1 || !tc.want(rs[0].obj) {
				t.Fatalf("got %d objects (%v), want one of the expected kind", len(rs), rs)
			}
		})
	}
	mc, err := decodeMeshConfig(meshConfigFile, files[meshConfigFile])
	if err != nil {
		t.Fatal(err)
	}
	if n := len(mc.GetExtensionProviders()); n != 2 {
		t.Fatalf("%s has %d extension providers, want 2 (ext_authz and access log)", meshConfigFile, n)
	}
}

// TestEnvoyFilterPatchesDecode pins that the rate limit EnvoyFilter's
// patches decode into the Envoy types the lint relies on.
func TestEnvoyFilterPatchesDecode(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	rs, err := decodeResources("ratelimit.yaml", files["ratelimit.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	ef := rs[0].obj.(*networkingv1alpha3.EnvoyFilter)
	patches, problems := decodePatches(rs[0], &ef.Spec)
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
	var got []string
	for _, p := range patches {
		got = append(got, string(p.value.ProtoReflect().Descriptor().FullName()))
	}
	want := []string{
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
		"envoy.config.route.v3.VirtualHost",
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("patch value types = %v, want %v", got, want)
	}
}

// TestEveryTypeResolves lists every @type and type_url in istio/*.yaml and
// checks each is registered, so that a missing import shows up by name.
func TestEveryTypeResolves(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`type\.googleapis\.com/([A-Za-z0-9_.]+)`)
	for name, data := range mustManifests(t) {
		for _, sm := range re.FindAllSubmatch(data, -1) {
			if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(sm[1])); err != nil {
				t.Errorf("%s: type %s is not registered: blank-import its go-control-plane package in decode_test.go", name, sm[1])
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Negative tests

// TestBrokenCopies: testdata/broken holds a copy of each manifest with one
// misspelt field. Each must fail the strict decode with a message naming
// the file, the line and the field, and differ from its manifest in
// exactly that one line, so that it fails for that reason alone.
func TestBrokenCopies(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	e := mustEnv(t)
	for _, tc := range []struct {
		give string
		want []string
	}{
		{give: meshConfigFile, want: []string{"MeshConfig", `unknown field "includeRequestBodyInChek"`}},
		{give: "ext-authz.yaml", want: []string{"AuthorizationPolicy inference/tollgate-ext-authz", `unknown field "actoin"`}},
		{give: "access-log.yaml", want: []string{"Telemetry inference/tollgate-access-log", `unknown field "provider"`}},
		{give: "ratelimit.yaml", want: []string{"configPatches[1] (HTTP_FILTER INSERT_BEFORE)", `unknown field "failure_mode_denyy"`}},
		{give: "ext-proc.yaml", want: []string{"configPatches[0] (HTTP_FILTER INSERT_AFTER)", `unknown field "observability_modee"`}},
		{give: callersFile, want: []string{"AuthorizationPolicy tollgate/tollgate-callers", `unknown field "notPrincipal"`}},
	} {
		t.Run(tc.give, func(t *testing.T) {
			t.Parallel()
			broken, err := os.ReadFile(filepath.Join("testdata", "broken", tc.give))
			if err != nil {
				t.Fatal(err)
			}
			n, line := differingLines(string(files[tc.give]), string(broken))
			if n != 1 {
				t.Fatalf("testdata/broken/%s differs from %s/%s in %d lines, want 1: copy the manifest again and misspell the one field", tc.give, manifestDir, tc.give, n)
			}
			// The problem names the line of the misspelt field in the YAML.
			want := append([]string{tc.give + ":" + strconv.Itoa(line) + ":"}, tc.want...)
			set := copyFiles(files)
			set[tc.give] = broken
			problems := check(set, e)
			for _, p := range problems {
				if containsAll(p, want) {
					t.Log(p)
					return
				}
			}
			t.Errorf("no problem contains all of %q; got:\n%s", want, strings.Join(problems, "\n"))
		})
	}
}

// TestCatches changes one thing in one real manifest per case and
// requires a problem containing every wanted string.
func TestCatches(t *testing.T) {
	t.Parallel()
	files := mustManifests(t)
	e := mustEnv(t)
	for _, tc := range []struct {
		name     string
		file     string
		old, new string
		want     []string
	}{
		// Istio types, strictly.
		{
			name: "bad enum", file: "ext-authz.yaml",
			old: "action: CUSTOM", new: "action: CUSTOMX",
			want: []string{"ext-authz.yaml", "AuthorizationPolicy", `"CUSTOMX"`},
		},
		{
			name: "unknown kind", file: "access-log.yaml",
			old: "apiVersion: telemetry.istio.io/v1", new: "apiVersion: telemetry.istio.io/v2",
			want: []string{"access-log.yaml:1:", `"telemetry.istio.io/v2"`, "Telemetry"},
		},
		{
			name: "unknown key in the envelope", file: "access-log.yaml",
			old: "spec:", new: "specs:",
			want: []string{"access-log.yaml", "envelope", `unknown field "specs"`},
		},
		{
			name: "no namespace", file: "ext-authz.yaml",
			old: "  namespace: inference\n", new: "",
			want: []string{"ext-authz.yaml", "metadata.namespace"},
		},
		{
			name: "bad patch operation", file: "ratelimit.yaml",
			old: "operation: MERGE", new: "operation: MERGEX",
			want: []string{"ratelimit.yaml", "EnvoyFilter", `"MERGEX"`},
		},
		// Envoy types inside the patch values.
		{
			name: "unknown field in a patch value", file: "ratelimit.yaml",
			old: "apply_on_stream_done: true", new: "apply_on_stream_dne: true",
			want: []string{"configPatches[2] (VIRTUAL_HOST MERGE)", "envoy.config.route.v3.VirtualHost", `unknown field "apply_on_stream_dne"`},
		},
		{
			name: "unknown @type in a patch value", file: "ratelimit.yaml",
			old: "ratelimit.v3.RateLimit\n", new: "ratelimit.v3.RateLimitX\n",
			want: []string{"configPatches[1]", "envoy.extensions.filters.http.ratelimit.v3.RateLimitX"},
		},
		{
			name: "PGV inside typed_config", file: "ratelimit.yaml",
			old: "          domain: inference\n", new: "          domain: inference\n          stage: 11\n",
			want: []string{"configPatches[1]", "typed_config<RateLimit>", "RateLimit.Stage", "less than or equal to 10"},
		},
		{
			name: "PGV inside typed_per_filter_config of a MERGE", file: "ratelimit.yaml",
			old: `format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%"`, new: "number: 2000000000",
			want: []string{`typed_per_filter_config["envoy.filters.http.ratelimit"]<RateLimitPerRoute>.rate_limits[3].hits_addend`, "Number"},
		},
		{
			name: "negative duration", file: "ratelimit.yaml",
			old: "timeout: 0.1s", new: "timeout: -1s",
			want: []string{"typed_config<RateLimit>.timeout", "negative duration"},
		},
		// Cross-references.
		{
			name: "domain not in config", file: "ratelimit.yaml",
			old: "domain: inference", new: "domain: inferenc",
			want: []string{"configPatches[1]", `domain "inferenc" is the domain: of no file`},
		},
		{
			name: "descriptor key in no rule", file: "ratelimit.yaml",
			old:  "- request_headers: {header_name: x-model, descriptor_key: model}\n              - request_headers: {header_name: x-tier, descriptor_key: tier, skip_if_absent: true}\n            # The cost",
			new:  "- request_headers: {header_name: x-model, descriptor_key: modle}\n              - request_headers: {header_name: x-tier, descriptor_key: tier, skip_if_absent: true}\n            # The cost",
			want: []string{"rate_limits[2]", "modle"},
		},
		{
			name: "tier without skip_if_absent", file: "ratelimit.yaml",
			old:  "              - request_headers: {header_name: x-tier, descriptor_key: tier, skip_if_absent: true}\n            # (tenant, model)",
			new:  "              - request_headers: {header_name: x-tier, descriptor_key: tier}\n            # (tenant, model)",
			want: []string{"rate_limits[0]", "skip_if_absent is false"},
		},
		{
			name: "cost report on a rule without token_limit", file: "ratelimit.yaml",
			old:  "- request_headers: {header_name: x-tenant-id, descriptor_key: tenant}\n              - request_headers: {header_name: x-model, descriptor_key: model}\n              - request_headers: {header_name: x-tier, descriptor_key: tier, skip_if_absent: true}\n              apply_on_stream_done",
			new:  "- request_headers: {header_name: x-model, descriptor_key: model}\n              - request_headers: {header_name: x-tier, descriptor_key: tier, skip_if_absent: true}\n              apply_on_stream_done",
			want: []string{"rate_limits[3]", "has no token_limit"},
		},
		{
			name: "cost report reads metadata nobody writes", file: "ratelimit.yaml",
			old: "key: usage_total_tokens", new: "key: usage_tokens",
			want: []string{"rate_limits[3]", "tollgate:usage_total_tokens", "no header_to_metadata"},
		},
		{
			name: "hits_addend with two commands", file: "ratelimit.yaml",
			old: `format: "%DYNAMIC_METADATA(tollgate:usage_total_tokens)%"`, new: `format: "%BYTES_RECEIVED%%BYTES_SENT%"`,
			want: []string{"rate_limits[3]", "exactly one substitution command"},
		},
		{
			name: "per-filter config under another name", file: "ratelimit.yaml",
			old: "          envoy.filters.http.ratelimit:\n", new: "          envoy.filters.http.rate_limit:\n",
			want: []string{`typed_per_filter_config["envoy.filters.http.rate_limit"]`, "ignores this one"},
		},
		{
			name: "filter after the router", file: "ratelimit.yaml",
			old: "      operation: INSERT_BEFORE\n      value:\n        # Patch 3", new: "      operation: INSERT_AFTER\n      value:\n        # Patch 3",
			want: []string{"configPatches[1]", "INSERT_BEFORE subFilter envoy.filters.http.router"},
		},
		{
			name: "legacy filter name", file: "ratelimit.yaml",
			old:  "            name: envoy.filters.network.http_connection_manager\n            subFilter:\n              name: envoy.filters.http.router\n    patch:\n      operation: INSERT_BEFORE\n      value:\n        # Patch 3",
			new:  "            name: envoy.http_connection_manager\n            subFilter:\n              name: envoy.filters.http.router\n    patch:\n      operation: INSERT_BEFORE\n      value:\n        # Patch 3",
			want: []string{"configPatches[1]", `"envoy.http_connection_manager"`},
		},
		{
			name: "outbound context", file: "ratelimit.yaml",
			old:  "      context: SIDECAR_INBOUND\n      proxy:\n        proxyVersion: '^1\\.(28\\.([6-9]|[1-9][0-9]+)|29\\.([2-9]|[1-9][0-9]+)|([3-9][0-9]|[1-9][0-9]{2,})(\\.[0-9]+)?)(-|$)'\n      listener:\n        # The backend's targetPort (container port), not its Service port.\n        portNumber: 8000\n        filterChain:\n          filter:\n            name: envoy.filters.network.http_connection_manager\n            subFilter:\n              name: envoy.filters.http.router\n    patch:\n      operation: INSERT_BEFORE\n      value:\n        # Patch 3",
			new:  "      context: SIDECAR_OUTBOUND\n      proxy:\n        proxyVersion: '^1\\.(28\\.([6-9]|[1-9][0-9]+)|29\\.([2-9]|[1-9][0-9]+)|([3-9][0-9]|[1-9][0-9]{2,})(\\.[0-9]+)?)(-|$)'\n      listener:\n        # The backend's targetPort (container port), not its Service port.\n        portNumber: 8000\n        filterChain:\n          filter:\n            name: envoy.filters.network.http_connection_manager\n            subFilter:\n              name: envoy.filters.http.router\n    patch:\n      operation: INSERT_BEFORE\n      value:\n        # Patch 3",
			want: []string{"configPatches[1]", "match.context is SIDECAR_OUTBOUND"},
		},
		{
			name: "cluster on the wrong port", file: "ratelimit.yaml",
			old: "cluster_name: outbound|8081||", new: "cluster_name: outbound|8080||",
			want: []string{"cluster_name", "port 8080, want 8081"},
		},
		{
			name: "cluster on another host", file: "ratelimit.yaml",
			old: "cluster_name: outbound|8081||tollgate.tollgate.svc", new: "cluster_name: outbound|8081||tollgate.default.svc",
			want: []string{"cluster_name", "tollgate.default.svc.cluster.local", "extension providers"},
		},
		{
			name: "cluster neither Istio's nor added", file: "ratelimit.yaml",
			old: "cluster_name: outbound|8081||tollgate.tollgate.svc.cluster.local", new: "cluster_name: tollgate",
			want: []string{"cluster_name \"tollgate\"", "CLUSTER ADD"},
		},
		{
			name: "x-ratelimit headers on", file: "ratelimit.yaml",
			old: "          rate_limited_as_resource_exhausted: true\n", new: "          rate_limited_as_resource_exhausted: true\n          enable_x_ratelimit_headers: DRAFT_VERSION_03\n",
			want: []string{"enable_x_ratelimit_headers must stay OFF"},
		},
		{
			name: "provider name mismatch in the policy", file: "ext-authz.yaml",
			old: "    name: tollgate-ext-authz\n", new: "    name: tollgate-extauthz\n",
			want: []string{"AuthorizationPolicy inference/tollgate-ext-authz", `"tollgate-extauthz" is not an extensionProviders name`},
		},
		{
			name: "policy without rules", file: "ext-authz.yaml",
			old: "  rules:\n  - {}\n", new: "",
			want: []string{"AuthorizationPolicy", "Tollgate is never asked"},
		},
		{
			name: "provider name mismatch in the telemetry", file: "access-log.yaml",
			old: "    - name: tollgate-als", new: "    - name: tollgate-access-log",
			want: []string{"Telemetry inference/tollgate-access-log", `"tollgate-access-log" is not an extensionProviders name`},
		},
		{
			name: "telemetry on another workload", file: "access-log.yaml",
			old: "app: inference-backend", new: "app: inference-gateway",
			want: []string{"AuthorizationPolicy inference/tollgate-ext-authz", "no Telemetry sends this workload's access log"},
		},
		{
			name: "telemetry with a filter", file: "access-log.yaml",
			old: "      mode: SERVER\n", new: "      mode: SERVER\n    filter: {expression: \"response.code >= 400\"}\n",
			want: []string{"Telemetry", "has a filter"},
		},
		{
			name: "telemetry on the client side", file: "access-log.yaml",
			old: "mode: SERVER", new: "mode: CLIENT",
			want: []string{"Telemetry", "match.mode is CLIENT"},
		},
		{
			name: "ext_authz on another port", file: meshConfigFile,
			old: "    port: 8081\n    # 250ms", new: "    port: 9000\n    # 250ms",
			want: []string{"envoyExtAuthzGrpc.port is 9000, want 8081"},
		},
		{
			name: "providers on different hosts", file: meshConfigFile,
			old: "    service: tollgate.tollgate.svc.cluster.local\n    port: 8081\n    # Sent", new: "    service: tollgate.default.svc.cluster.local\n    port: 8081\n    # Sent",
			want: []string{"different services"},
		},
		{
			name: "body larger than Tollgate takes", file: meshConfigFile,
			old: "maxRequestBytes: 1048576", new: "maxRequestBytes: 4194304",
			want: []string{"maxRequestBytes is 4194304, over estimate.max_body_bytes"},
		},
		{
			name: "body cut before Tollgate's limit", file: meshConfigFile,
			old: "maxRequestBytes: 1048576", new: "maxRequestBytes: 65536",
			want: []string{"maxRequestBytes is 65536, under estimate.max_body_bytes 1048576", "keep the two equal"},
		},
		{
			name: "no partial message", file: meshConfigFile,
			old: "allowPartialMessage: true", new: "allowPartialMessage: false",
			want: []string{"includeRequestBodyInCheck.allowPartialMessage is false", "plain-text 413"},
		},
		{
			name: "body as a string", file: meshConfigFile,
			old: "packAsBytes: true", new: "packAsBytes: false",
			want: []string{"packAsBytes is false"},
		},
		{
			name: "usage header not logged", file: meshConfigFile,
			old: "additionalResponseHeadersToLog: [x-usage-total-tokens]", new: "additionalResponseHeadersToLog: [x-llm-total-tokens]",
			want: []string{"additionalResponseHeadersToLog does not list x-usage-total-tokens"},
		},
		{
			name: "clearRouteCache that Istio ignores", file: meshConfigFile,
			old: "    statusOnError: \"503\"\n", new: "    statusOnError: \"503\"\n    clearRouteCache: true\n",
			want: []string{"clearRouteCache is set", "never reads it"},
		},
		{
			name: "telemetry replacing the mesh's access log", file: "access-log.yaml",
			old: "    - name: envoy\n", new: "",
			want: []string{"Telemetry inference/tollgate-access-log", "lists only Tollgate's", "list envoy"},
		},
		// The backend's ports, as Istio names them on its sidecar.
		{
			name: "vhost named after the targetPort", file: "ratelimit.yaml",
			old: "name: inbound|http|80\n", new: "name: inbound|http|8000\n",
			want: []string{"configPatches[2] (VIRTUAL_HOST MERGE)", `vhost.name "inbound|http|8000", want "inbound|http|80"`, "Service port"},
		},
		{
			name: "listener matched on the Service port", file: "ext-proc.yaml",
			old: "portNumber: 8000\n", new: "portNumber: 80\n",
			want: []string{"ext-proc.yaml", "configPatches[0]", "portNumber 80, want 8000", "targetPort"},
		},
		{
			name: "ports line changed without the patches", file: "ratelimit.yaml",
			old: "# Backend ports: Service port 80, targetPort (container port) 8000.", new: "# Backend ports: Service port 80, targetPort (container port) 8080.",
			want: []string{"ratelimit.yaml", "portNumber 8000, want 8080"},
		},
		{
			name: "files disagree on the backend's ports", file: "ext-proc.yaml",
			old:  "# Backend ports: Service port 80, targetPort (container port) 8000.",
			new:  "# Backend ports: Service port 8000, targetPort (container port) 8000.",
			want: []string{"backend ports", "same workload", "says", "8000 -> 8000", "80 -> 8000"},
		},
		{
			name: "no ports line", file: "ratelimit.yaml",
			old: "# Backend ports: Service port 80, targetPort (container port) 8000.", new: "# Backend ports: see the Service.",
			want: []string{"EnvoyFilter inference/tollgate-ratelimit", "0 lines", "Backend ports"},
		},
		{
			name: "API key logged", file: meshConfigFile,
			old: "    logName: tollgate\n", new: "    logName: tollgate\n    additionalRequestHeadersToLog: [Authorization]\n",
			want: []string{"additionalRequestHeadersToLog lists Authorization", "every API key"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runCatch(t, files, e, tc.file, [][2]string{{tc.old, tc.new}}, tc.want)
		})
	}
	t.Run("proxy version admitting proxies before the CVE fix", func(t *testing.T) {
		t.Parallel()
		set := copyFiles(files)
		// The regex before issue 18: Istio 1.28 and later.
		set["ratelimit.yaml"] = []byte(strings.ReplaceAll(string(files["ratelimit.yaml"]), shippedProxyVersion, `proxyVersion: '^1\.(2[89]|[3-9][0-9])(\.|-|$)'`))
		requireProblem(t, check(set, e), []string{"configPatches[0]", "admits", `"1.28.5"`, `"1.29.1"`, "CVE-2026-26330"})
	})
	t.Run("proxy version refusing fixed proxies", func(t *testing.T) {
		t.Parallel()
		set := copyFiles(files)
		set["ratelimit.yaml"] = []byte(strings.ReplaceAll(string(files["ratelimit.yaml"]), shippedProxyVersion, `proxyVersion: '^1\.(28\.([6-9]|[1-9][0-9]+)|29\.([2-9]|[1-9][0-9]+)|([3-9][0-9]|[1-9][0-9]{2,})(\.[0-9]+)?)$'`))
		requireProblem(t, check(set, e), []string{"configPatches[1]", "refuses", "1.28.6-distroless", "1.29.2-asm"})
	})
	t.Run("proxy version differs between patches", func(t *testing.T) {
		t.Parallel()
		// The third occurrence: the VIRTUAL_HOST patch's.
		data := string(files["ratelimit.yaml"])
		const old = shippedProxyVersion
		i := nthIndex(data, old, 3)
		if i < 0 {
			t.Fatalf("%q occurs fewer than 3 times in ratelimit.yaml", old)
		}
		set := copyFiles(files)
		set["ratelimit.yaml"] = []byte(data[:i] + `proxyVersion: '^1\.2.*'` + data[i+len(old):])
		requireProblem(t, check(set, e), []string{"configPatches[2]", "match.proxy differs"})
	})
}

// shippedProxyVersion is ratelimit.yaml's proxyVersion line.
const shippedProxyVersion = `proxyVersion: '^1\.(28\.([6-9]|[1-9][0-9]+)|29\.([2-9]|[1-9][0-9]+)|([3-9][0-9]|[1-9][0-9]{2,})(\.[0-9]+)?)(-|$)'`

func runCatch(t *testing.T, files map[string][]byte, e env, file string, edits [][2]string, want []string) {
	t.Helper()
	data := string(files[file])
	for _, ed := range edits {
		if n := strings.Count(data, ed[0]); n != 1 {
			t.Fatalf("%q occurs %d times in %s, want once", ed[0], n, file)
		}
		data = strings.Replace(data, ed[0], ed[1], 1)
	}
	set := copyFiles(files)
	set[file] = []byte(data)
	requireProblem(t, check(set, e), want)
}

func requireProblem(t *testing.T, problems []string, want []string) {
	t.Helper()
	for _, p := range problems {
		if containsAll(p, want) {
			t.Log(p)
			return
		}
	}
	t.Errorf("no problem contains all of %q; got:\n%s", want, strings.Join(problems, "\n"))
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func copyFiles(files map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(files))
	for k, v := range files {
		out[k] = v
	}
	return out
}

// differingLines counts the lines that differ between a and b, which must
// have the same number of lines (else n is -1), and returns the 1-based
// number of the last one.
func differingLines(a, b string) (n, line int) {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	if len(la) != len(lb) {
		return -1, 0
	}
	for i := range la {
		if la[i] != lb[i] {
			n, line = n+1, i+1
		}
	}
	return n, line
}

func nthIndex(s, sub string, n int) int {
	off := 0
	for i := 1; ; i++ {
		j := strings.Index(s[off:], sub)
		if j < 0 {
			return -1
		}
		if i == n {
			return off + j
		}
		off += j + len(sub)
	}
}
