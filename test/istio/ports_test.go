package istio

// The backend's ports as Istio names them on its sidecar, and the proxy
// version floor of the rate limit EnvoyFilter.

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// backendPortsLine is the comment by which a SIDECAR_INBOUND EnvoyFilter
// states the backend's ports; the patches must use them as Istio does.
var backendPortsLine = regexp.MustCompile(`(?m)^# Backend ports: Service port (\d+), targetPort \(container port\) (\d+)\.$`)

// inboundPortMatch is the listener.portNumber that selects a workload's
// inbound filter chain for a Service port: its targetPort. Istio sets the
// chain's FilterChainMatch.destination_port to cc.port.TargetPort
// (pilot/pkg/networking/core/listener_inbound.go, ToFilterChainMatch) and
// compares portNumber with it on the virtualInbound listener
// (envoyfilter/listener_patch.go, filterChainMatch); the same on
// release-1.28, release-1.29 and master.
func inboundPortMatch(_, targetPort int) uint32 { return uint32(targetPort) }

// inboundVirtualHost is the name of that chain's virtual host:
// "inbound|http|" and the Service port, cc.port.Port
// (pilot/pkg/networking/core/httproute.go,
// buildSidecarInboundHTTPRouteConfig), not the targetPort.
func inboundVirtualHost(servicePort, _ int) string {
	return "inbound|http|" + strconv.Itoa(servicePort)
}

// backendPorts is what one EnvoyFilter says of its workload's ports.
type backendPorts struct {
	r                       resource
	servicePort, targetPort int
}

// lintInboundPorts checks that each SIDECAR_INBOUND patch of r matches the
// ports its backendPortsLine states, in the form Istio generates.
func lintInboundPorts(r resource, patches []envoyPatch) (*backendPorts, []string) {
	var inbound []envoyPatch
	for _, p := range patches {
		m := p.cp.GetMatch()
		if m.GetContext() == networkingapi.EnvoyFilter_SIDECAR_INBOUND &&
			(m.GetListener().GetPortNumber() != 0 || m.GetRouteConfiguration().GetVhost().GetName() != "") {
			inbound = append(inbound, p)
		}
	}
	if len(inbound) == 0 {
		return nil, nil
	}
	sm := backendPortsLine.FindAllSubmatch(r.doc, -1)
	if len(sm) != 1 {
		return nil, []string{fmt.Sprintf("%s: %d lines %q, want 1: say which of the backend's ports the patches match (its Service port and its targetPort differ in most charts, and Istio uses each in one place)", r, len(sm), "# Backend ports: Service port N, targetPort (container port) M.")}
	}
	bp := &backendPorts{r: r}
	bp.servicePort, _ = strconv.Atoi(string(sm[0][1]))
	bp.targetPort, _ = strconv.Atoi(string(sm[0][2]))
	var problems []string
	for _, p := range inbound {
		m := p.cp.GetMatch()
		if n := m.GetListener().GetPortNumber(); n != 0 && n != inboundPortMatch(bp.servicePort, bp.targetPort) {
			problems = append(problems, fmt.Sprintf("%s: match.listener.portNumber %d, want %d: on a sidecar's inbound listener Istio matches the targetPort (container port), and the backend's is %d (its Service port is %d)", p.path, n, bp.targetPort, bp.targetPort, bp.servicePort))
		}
		if v := m.GetRouteConfiguration().GetVhost().GetName(); v != "" && v != inboundVirtualHost(bp.servicePort, bp.targetPort) {
			problems = append(problems, fmt.Sprintf("%s: match.routeConfiguration.vhost.name %q, want %q: Istio names the inbound virtual host after the Service port (%d), not the targetPort (%d)", p.path, v, inboundVirtualHost(bp.servicePort, bp.targetPort), bp.servicePort, bp.targetPort))
		}
	}
	return bp, problems
}

// lintBackendPortsAgree: EnvoyFilters on one workload state one set of
// ports.
func lintBackendPortsAgree(all []*backendPorts) []string {
	var problems []string
	seen := map[string]*backendPorts{}
	for _, bp := range all {
		ef := bp.r.obj.(*networkingv1alpha3.EnvoyFilter)
		key := bp.r.meta().GetNamespace() + " " + fmt.Sprint(ef.Spec.GetWorkloadSelector().GetLabels())
		first, ok := seen[key]
		if !ok {
			seen[key] = bp
			continue
		}
		if first.servicePort != bp.servicePort || first.targetPort != bp.targetPort {
			problems = append(problems, fmt.Sprintf("%s: backend ports %d -> %d, but %s (same workload) says %d -> %d", bp.r, bp.servicePort, bp.targetPort, first.r, first.servicePort, first.targetPort))
		}
	}
	return problems
}

// Istio proxy versions around the fix for CVE-2026-26330 (Envoy 1.36.5 and
// 1.37.1, shipped in Istio 1.28.6 and 1.29.2). proxyVersion is matched
// against the proxy's Istio version (node metadata ISTIO_VERSION:
// pilot/pkg/model/envoyfilter.go, proxyMatch), suffixes included.
var (
	fixedIstioVersions = []string{
		"1.28.6", "1.28.7", "1.28.10", "1.28.6-distroless", "1.28.12-asm.1",
		"1.29.2", "1.29.3", "1.29.10", "1.29.2-distroless", "1.29.2-asm", "1.29.2-asm.1",
		"1.30.0", "1.30", "1.30-dev", "1.30.1-distroless", "1.31.0", "1.39.4", "1.99.0", "1.100.0",
	}
	vulnerableIstioVersions = []string{
		"", "1.28.5", "1.28.5-distroless", "1.28.0", "1.28.1", "1.28", "1.28-dev",
		"1.29.1", "1.29.1-asm.3", "1.29.0", "1.29", "1.29-dev", "1.27.9", "1.23.0",
		"1.2.9", "1.3.0", "1.9.9", "0.28.6", "11.28.6",
	}
)

// lintProxyFloor: an EnvoyFilter that adds the rate limit filter must not
// apply to a proxy without the fix for CVE-2026-26330, which its
// request-phase plus stream-done rate limits would expose.
func lintProxyFloor(patches []envoyPatch) []string {
	addsRateLimit := false
	for _, p := range patches {
		if f, ok := p.value.(*hcmv3.HttpFilter); ok {
			if inner, err := typedConfig(f.GetTypedConfig()); err == nil {
				_, addsRateLimit = inner.(*rlv3.RateLimit)
			}
		}
		if addsRateLimit {
			break
		}
	}
	if !addsRateLimit {
		return nil
	}
	var problems []string
	for _, p := range patches {
		pv := p.cp.GetMatch().GetProxy().GetProxyVersion()
		if pv == "" {
			problems = append(problems, p.path+": match.proxy.proxyVersion is not set: the patch applies to proxies without the fix for CVE-2026-26330 (Istio before 1.28.6, 1.29.0 and 1.29.1)")
			continue
		}
		re, err := regexp.Compile(pv)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: match.proxy.proxyVersion %q: %v", p.path, pv, err))
			continue
		}
		var admits, refuses []string
		for _, v := range vulnerableIstioVersions {
			if re.MatchString(v) {
				admits = append(admits, strconv.Quote(v))
			}
		}
		for _, v := range fixedIstioVersions {
			if !re.MatchString(v) {
				refuses = append(refuses, v)
			}
		}
		if len(admits) > 0 {
			problems = append(problems, fmt.Sprintf("%s: match.proxy.proxyVersion %q admits %s: proxies without the fix for CVE-2026-26330 (Istio 1.28.6, 1.29.2)", p.path, pv, strings.Join(admits, ", ")))
		}
		if len(refuses) > 0 {
			problems = append(problems, fmt.Sprintf("%s: match.proxy.proxyVersion %q refuses %s, which have the fix: those proxies get no rate limiting", p.path, pv, strings.Join(refuses, ", ")))
		}
	}
	return problems
}

// TestProxyVersionTable runs the shipped rate limit EnvoyFilter's
// proxyVersion over the version table, one case each, so that a regex
// edit shows which version it lets in or out.
func TestProxyVersionTable(t *testing.T) {
	t.Parallel()
	rs, err := decodeResources("ratelimit.yaml", mustManifests(t)["ratelimit.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	ef := rs[0].obj.(*networkingv1alpha3.EnvoyFilter)
	pv := ef.Spec.GetConfigPatches()[0].GetMatch().GetProxy().GetProxyVersion()
	re := regexp.MustCompile(pv) // Istio compiles it with Go's regexp too
	type tc struct {
		name string
		give string
		want bool
	}
	var tcs []tc
	for _, v := range fixedIstioVersions {
		tcs = append(tcs, tc{name: "fixed " + v, give: v, want: true})
	}
	for _, v := range vulnerableIstioVersions {
		tcs = append(tcs, tc{name: "vulnerable " + v, give: v, want: false})
	}
	for _, tc := range tcs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := re.MatchString(tc.give); got != tc.want {
				t.Errorf("proxyVersion %q matches %q = %v, want %v", pv, tc.give, got, tc.want)
			}
		})
	}
}

// TestInboundNames pins the two Istio names against the example ports of
// istio/ratelimit.yaml, where they differ.
func TestInboundNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                    string
		servicePort, targetPort int
		wantPort                uint32
		wantVhost               string
	}{
		{name: "ports differ", servicePort: 80, targetPort: 8000, wantPort: 8000, wantVhost: "inbound|http|80"},
		{name: "ports equal", servicePort: 8000, targetPort: 8000, wantPort: 8000, wantVhost: "inbound|http|8000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := inboundPortMatch(tc.servicePort, tc.targetPort); got != tc.wantPort {
				t.Errorf("inboundPortMatch = %d, want %d", got, tc.wantPort)
			}
			if got := inboundVirtualHost(tc.servicePort, tc.targetPort); got != tc.wantVhost {
				t.Errorf("inboundVirtualHost = %q, want %q", got, tc.wantVhost)
			}
		})
	}
}
