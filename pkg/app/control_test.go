package app

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/pressure"
	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// controlRules controls model m with a capacity of 4, fast enough for a
// test: it decides every 50ms over half a second.
const controlRules = `domain: shed
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100000}
  - key: model
    value: m
    rate_limit: {unit: minute, requests_per_unit: 100000}
tiers:
  key: tier
  default: free
  plans: {premium: 3, free: 1}
shedding:
  control:
    capacity: {m: 4}
    sheddable: [free]
    interval: 50ms
    window: 500ms
`

// control reads r's controller state of model m from GET /v1/pressure.
func (r *replica) control() pressure.ControlView {
	r.t.Helper()
	code, body := r.pressure(http.MethodGet, "", r.token)
	var v pressureruntime.View
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		r.t.Fatalf("GET /v1/pressure = %d %s (%v)", code, body, err)
	}
	for _, c := range v.Control {
		if c.Domain == "shed" && c.Scope == "m" {
			return c
		}
	}
	r.t.Fatalf("GET /v1/pressure has no controller of model m: %s", body)
	return pressure.ControlView{}
}

// completion is the final access log entry of a request r admitted, with
// the ticket its answer carried.
func completion(resp *rlsv3.RateLimitResponse) *datav3.HTTPAccessLogEntry {
	return &datav3.HTTPAccessLogEntry{
		CommonProperties: &datav3.AccessLogCommon{
			UpstreamCluster: "llm", Duration: durationpb.New(100 * time.Millisecond),
			AccessLogType: datav3.AccessLogType_DownstreamEnd,
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				ticket.RateLimitNamespace: resp.GetDynamicMetadata(),
			}},
		},
		Response: &datav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200)},
	}
}

// TestControlAcrossReplicas: flights begun on one replica count on the
// other, end by the access log on either, and past capacity both shed
// free alike while premium passes.
func TestControlAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), controlRules)
	a := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--replica-id", "a")
	b := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--replica-id", "b")

	var admitted []*rlsv3.RateLimitResponse
	for range 6 {
		resp := a.decide("premium", "m")
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetDynamicMetadata() == nil {
			t.Fatalf("premium to m = %v, want admitted with a ticket", resp)
		}
		admitted = append(admitted, resp)
	}
	b.poll("B to count A's 6 flights", func() bool { return b.control().InFlight == 6 })
	// Forged and unverifiable completions end nothing.
	sendEntries(t, ctx, b.als, forged("m"), forged("m"))
	// In flight past capacity with nothing completing: free is shed, on
	// both replicas, premium is not.
	for _, r := range []*replica{a, b} {
		r.poll("free to be shed", func() bool {
			resp := r.decide("free", "m")
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				admitted = append(admitted, resp) // in flight until its completion
			}
			return resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT && reason(resp) == "shed"
		})
		resp := r.decide("premium", "m")
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("premium refused while free is shed: %v", resp)
		}
		admitted = append(admitted, resp)
	}
	if v := b.control(); v.Shed["free"] != 1 || v.InFlight < 6 {
		t.Errorf("B's controller = %+v, want free shed fully, 6 or more in flight", v)
	}
	if _, metrics := a.get("/metrics"); !strings.Contains(metrics, `tollgate_control_shed_fraction{domain="shed",scope="m",tier="free"} 1`) ||
		!strings.Contains(metrics, `tollgate_control_capacity{domain="shed",scope="m"} 4`) {
		t.Errorf("/metrics of A lacks the controller:\n%s", grepLines(metrics, "tollgate_control"))
	}
	// Completions reported to B end the flights A began.
	entries := make([]*datav3.HTTPAccessLogEntry, 0, len(admitted))
	for _, resp := range admitted {
		entries = append(entries, completion(resp))
	}
	sendEntries(t, ctx, b.als, entries...)
	a.poll("A to count no flight", func() bool { return a.control().InFlight == 0 })
	if _, cfg := a.get("/debug/config"); !strings.Contains(cfg, `"sheddable": [`) || !strings.Contains(cfg, `"dwell": "15s"`) {
		t.Errorf("/debug/config lacks the control with its defaults:\n%s", cfg)
	}
}
