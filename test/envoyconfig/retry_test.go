package envoyconfig

import (
	"fmt"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
)

// safeRetryOn are the retry_on conditions under which an attempt never
// reached the backend, so a retry cannot run a completion twice.
var safeRetryOn = map[string]bool{"connect-failure": true, "refused-stream": true, "reset-before-request": true}

// lintRetries checks what makes Tollgate's x-envoy-max-retries work and
// safe (docs/retry-budget.md): Envoy's router reads the header only on a
// route with a retry_policy (or a request with x-envoy-retry-on), and a
// cluster's max_retries of 0 without a retry_budget would refuse every
// retry it allows. A route's retry_on may name only conditions where the
// backend never saw the attempt.
func lintRetries(bs *bootstrapv3.Bootstrap) []string {
	var problems []string
	retrying := map[string]bool{} // cluster -> some route retries to it
	m, _ := buildModel(bs)
	for _, site := range m.hcms {
		for vi, vh := range site.hcm.GetRouteConfig().GetVirtualHosts() {
			for ri, r := range vh.GetRoutes() {
				path := fmt.Sprintf("%s.route_config.virtual_hosts[%d].routes[%d]", site.path, vi, ri)
				ra := r.GetRoute()
				if ra == nil || ra.GetCluster() == "" {
					continue
				}
				rp := ra.GetRetryPolicy()
				if rp == nil {
					problems = append(problems, path+": no retry_policy, so Envoy ignores Tollgate's x-envoy-max-retries")
					continue
				}
				for _, on := range strings.Split(rp.GetRetryOn(), ",") {
					if !safeRetryOn[strings.TrimSpace(on)] {
						problems = append(problems, fmt.Sprintf("%s.retry_policy.retry_on: %q may retry an attempt the backend already ran", path, on))
					}
				}
				retrying[ra.GetCluster()] = true
			}
		}
	}
	for i, c := range bs.GetStaticResources().GetClusters() {
		if !retrying[c.GetName()] {
			continue
		}
		for ti, th := range c.GetCircuitBreakers().GetThresholds() {
			if th.GetRetryBudget() == nil && th.GetMaxRetries() != nil && th.GetMaxRetries().GetValue() == 0 {
				problems = append(problems, fmt.Sprintf("static_resources.clusters[%d].circuit_breakers.thresholds[%d]: max_retries 0 without a retry_budget refuses every retry the routes allow", i, ti))
			}
		}
	}
	return problems
}

// TestBootstrapRetries lints every shipped bootstrap's retries.
func TestBootstrapRetries(t *testing.T) {
	t.Parallel()
	for _, file := range bootstrapFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := decode(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, p := range lintRetries(bs) {
			t.Errorf("%s: %s", file, p)
		}
	}
}

// TestLintRetriesCatches: each mistake the lint is for is reported.
func TestLintRetriesCatches(t *testing.T) {
	t.Parallel()
	const base = `
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 127.0.0.1, port_value: 1}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: s
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: b
%s
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: b
    circuit_breakers:
      thresholds:
      - %s
`
	tests := []struct {
		name       string
		giveRoute  string
		giveBreak  string
		wantSubstr string // "" for no problem
	}{
		{name: "safe", giveRoute: "                  retry_policy: {retry_on: connect-failure, num_retries: 1}", giveBreak: "retry_budget: {min_retry_concurrency: 3}"},
		{name: "no retry policy", giveBreak: "max_requests: 1", wantSubstr: "no retry_policy"},
		{name: "5xx", giveRoute: "                  retry_policy: {retry_on: \"5xx,connect-failure\"}", giveBreak: "max_requests: 1", wantSubstr: `"5xx" may retry`},
		{name: "max_retries 0", giveRoute: "                  retry_policy: {retry_on: refused-stream}", giveBreak: "max_retries: 0", wantSubstr: "max_retries 0 without a retry_budget"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bs, err := decode([]byte(fmt.Sprintf(base, tt.giveRoute, tt.giveBreak)))
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(lintRetries(bs), "\n")
			if (tt.wantSubstr == "") != (got == "") || !strings.Contains(got, tt.wantSubstr) {
				t.Errorf("problems:\n%s\nwant one containing %q", got, tt.wantSubstr)
			}
		})
	}
}
