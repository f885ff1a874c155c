package app

import (
	"context"
	"encoding/json"
	"github.com/tollgate-dev/tollgate/pkg/pressure"
	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/accesslog"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

const shedRules = `domain: shed
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100000}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 100000}
tiers:
  key: tier
  default: free
  plans: {premium: 3, standard: 2, free: 1}
shedding:
  steps:
    - above: 0.7
      shed: [free]
    - above: 0.9
      admit_only: [premium]
  hysteresis: 0.05
  hold: 300ms
breakers:
  - key: model
    failure_threshold: 3
    window: 1m
    open_for: 1m
`

// replica is one in-process tollgate serve.
type replica struct {
	*e2e
	token string
	als   alsv3.AccessLogServiceClient
	stop  func()
	exit  chan int
}

// startReplica serves rules with the pressure endpoint (token pressureToken)
// and /debug/
// a fast pressure tick; extra are more flags.
// pressureToken is the bearer token of startReplica's /v1/pressure: 32
// bytes, the shortest accepted.
const pressureToken = "s3cret-s3cret-s3cret-s3cret-s3cr"

func startReplica(t *testing.T, ctx context.Context, dir string, extra ...string) *replica {
	t.Helper()
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, pressureToken+"\n")
	addrs := make(chan Addrs, 1)
	stderr := &buffer{}
	a := &App{
		Stdout:    io.Discard,
		Stderr:    stderr,
		LookupEnv: env(map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_LOG_LEVEL": "debug"}),
		Listening: func(ad Addrs) { addrs <- ad },
	}
	runCtx, stop := context.WithCancel(context.Background())
	r := &replica{e2e: &e2e{t: t, ctx: ctx, stderr: stderr}, token: pressureToken, stop: stop, exit: make(chan int, 1)}
	args := append([]string{"serve", "--config", dir, "--admin-addr", "127.0.0.1:0", "--debug",
		"--pressure-token-file", tokenFile, "--pressure-interval", "50ms", "--pressure-ttl", "500ms"}, extra...)
	go func() { r.exit <- a.Run(runCtx, args) }()
	t.Cleanup(r.shutdown)
	select {
	case r.addrs = <-addrs:
	case code := <-r.exit:
		t.Fatalf("serve exited with %d before listening:\n%s", code, stderr.String())
	case <-ctx.Done():
		t.Fatal("serve never listened")
	}
	conn, err := grpc.NewClient("passthrough:///"+r.addrs.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r.client = rlsv3.NewRateLimitServiceClient(conn)
	r.als = alsv3.NewAccessLogServiceClient(conn)
	return r
}

// shutdown stops the replica and waits for it to exit; it may be called
// again.
func (r *replica) shutdown() {
	r.stop()
	if r.exit == nil {
		return
	}
	select {
	case code := <-r.exit:
		if code != ExitOK {
			r.t.Errorf("serve exited with %d\n%s", code, r.stderr.String())
		}
	case <-time.After(wait):
		r.t.Error("serve did not exit after cancel")
	}
	r.exit = nil
}

// decide asks ShouldRateLimit for a tenant of tier, naming model if set.
func (r *replica) decide(tier, model string) *rlsv3.RateLimitResponse {
	r.t.Helper()
	entries := []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme-" + tier}, {Key: "tier", Value: tier}}
	descs := []*commonrl.RateLimitDescriptor{{Entries: entries}}
	if model != "" {
		descs = append(descs, &commonrl.RateLimitDescriptor{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "model", Value: model}}})
	}
	resp, err := r.client.ShouldRateLimit(r.ctx, &rlsv3.RateLimitRequest{Domain: "shed", Descriptors: descs})
	if err != nil {
		r.t.Fatalf("ShouldRateLimit(%s, %s): %v", tier, model, err)
	}
	return resp
}

func reason(resp *rlsv3.RateLimitResponse) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "x-tollgate-reason" {
			return h.GetValue()
		}
	}
	return ""
}

// admitted reports, for each tier, whether it is admitted now.
func (r *replica) admitted(tiers ...string) map[string]bool {
	out := map[string]bool{}
	for _, tier := range tiers {
		resp := r.decide(tier, "")
		ok := resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
		if !ok && reason(resp) != "shed" {
			r.t.Fatalf("%s refused with reason %q, want shed: %v", tier, reason(resp), resp)
		}
		out[tier] = ok
	}
	return out
}

// pressure sends method /v1/pressure with body and token (none if empty).
func (r *replica) pressure(method, body, token string) (int, string) {
	r.t.Helper()
	req, err := http.NewRequestWithContext(r.ctx, method, "http://"+r.addrs.Admin.String()+"/v1/pressure", strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s /v1/pressure: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *replica) push(score string) {
	r.t.Helper()
	if code, body := r.pressure(http.MethodPut, `{"scope":"global","pressure":`+score+`}`, r.token); code != http.StatusNoContent {
		r.t.Fatalf("PUT pressure %s = %d %s, want 204", score, code, body)
	}
}

// global reads the global scope of domain shed from GET /v1/pressure.
func (r *replica) global() pressure.ScopeView {
	r.t.Helper()
	code, body := r.pressure(http.MethodGet, "", r.token)
	var v pressureruntime.View
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		r.t.Fatalf("GET /v1/pressure = %d %s (%v)", code, body, err)
	}
	for _, d := range v.Domains {
		for _, s := range d.Scopes {
			if d.Domain == "shed" && s.Scope == "global" {
				return s
			}
		}
	}
	r.t.Fatalf("GET /v1/pressure has no global scope of domain shed: %s", body)
	return pressure.ScopeView{}
}

func TestPressureShedsTiers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), shedRules)
	r := startReplica(t, ctx, dir)
	all := []string{"premium", "standard", "free"}
	want := func(m map[string]bool) func() bool {
		return func() bool { got := r.admitted(all...); return sameAdmitted(got, m) }
	}

	if got := r.admitted(all...); !got["premium"] || !got["standard"] || !got["free"] {
		t.Fatalf("admitted at pressure 0 = %v, want all", got)
	}
	if code, _ := r.pressure(http.MethodPut, `{"scope":"global","pressure":0.75}`, ""); code != http.StatusUnauthorized {
		t.Errorf("PUT without a token = %d, want 401", code)
	}
	if code, _ := r.pressure(http.MethodGet, "", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("GET with a wrong token = %d, want 401", code)
	}
	if code, _ := r.pressure(http.MethodPut, `{"scope":"nowhere","pressure":0.75}`, r.token); code != http.StatusBadRequest {
		t.Errorf("PUT to an unknown scope = %d, want 400", code)
	}

	r.push("0.75")
	r.poll("free shed at 0.75", want(map[string]bool{"premium": true, "standard": true, "free": false}))
	if s := r.global(); s.Level != 0 || s.Pushed == nil || *s.Pushed != 0.75 || !slices.Equal(s.Shed, []string{"free"}) {
		t.Errorf("GET at 0.75 = %+v, want level 0, pushed 0.75, shed [free]", s)
	}
	// Hold counts from the last change of step, which this push makes.
	lastChange := time.Now()
	r.push("0.95")
	r.poll("only premium at 0.95", want(map[string]bool{"premium": true, "standard": false, "free": false}))

	_, metrics := r.get("/metrics")
	for _, w := range []string{
		`tollgate_pressure_score{domain="shed",scope="global"} 0.95`,
		`tollgate_pressure_level{domain="shed",scope="global"} 1`,
		`tollgate_pressure_local_score{domain="shed",scope="global"} 0`,
		`tollgate_pressure_board_stale{domain="shed",scope="global"} 0`,
		`tollgate_pressure_steps_fallbacks_total{domain="shed",scope="global"} 0`,
		`tollgate_pressure_factor{domain="shed",scope="global"} 1`,
		`tollgate_pressure_prom_errors_total 0`,
		`tollgate_breaker_transitions_total{from="closed",to="open"} 0`,
	} {
		if !strings.Contains(metrics, w) {
			t.Errorf("/metrics lacks %q", w)
		}
	}
	for _, tier := range []string{"free", "standard"} {
		if !strings.Contains(grepLines(grepLines(metrics, `tollgate_rls_decisions_total{domain="shed",result="shed"`), `tier="`+tier+`"`), "shed") {
			t.Errorf("/metrics counts no shed %s decision:\n%s", tier, grepLines(metrics, "tollgate_rls_decisions_total"))
		}
	}
	code, body := r.get("/debug/config")
	var view configView
	if err := json.Unmarshal([]byte(body), &view); code != http.StatusOK || err != nil {
		t.Fatalf("/debug/config = %d %q (%v)", code, body, err)
	}
	if d := view.Domains[0]; d.Shedding == nil || len(d.Shedding.Steps) != 2 || d.Shedding.Hold != "300ms" ||
		len(d.Breakers) != 1 || d.Breakers[0].Key != "model" || d.Breakers[0].HalfOpenProbes != 1 {
		t.Errorf("/debug/config domain = %s, want its shedding and breaker", body)
	}
	if code, body := r.get("/debug/pressure"); code != http.StatusOK || !strings.Contains(body, `"combined": 0.95`) || strings.Contains(body, pressureToken) {
		t.Errorf("/debug/pressure = %d %s, want the combined score and no token", code, body)
	}

	// Back to 0: everyone again once hold has passed.
	r.push("0")
	r.poll("recovery", want(map[string]bool{"premium": true, "standard": true, "free": true}))
	if d := time.Since(lastChange); d < 300*time.Millisecond {
		t.Errorf("recovered %v after the last change of step, before the hold of 300ms", d)
	}
	if code, body := r.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %s, want 200 whatever the pressure", code, body)
	}
}

func sameAdmitted(got, want map[string]bool) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func TestPressureAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), shedRules)
	a := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--replica-id", "a")
	b := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--replica-id", "b")

	b.poll("B to see A's published score", func() bool {
		_, ok := b.global().Replicas["a"]
		return ok
	})
	a.push("0.75")
	b.poll("B to shed free", func() bool {
		got := b.admitted("premium", "free")
		return got["premium"] && !got["free"]
	})
	// The step and its hold are one record on Redis: both replicas hold
	// the same step, entered at the same instant by one of them.
	a.poll("A and B to share the step and its hold", func() bool {
		sa, sb := a.global(), b.global()
		return sa.Level == 0 && sb.Level == 0 && sa.Since.Equal(sb.Since) && sa.StepBy != "" && sa.StepBy == sb.StepBy
	})
	if _, metrics := a.get("/metrics"); !strings.Contains(metrics, `tollgate_pressure_steps_fallbacks_total{domain="shed",scope="global"} 0`) {
		t.Errorf("/metrics counts fallbacks with Redis up: %s", grepLines(metrics, "tollgate_pressure_steps_fallbacks_total"))
	}
	a.push("0")
	// On Redis the over-limit cache sits in front of the store.
	if _, metrics := b.get("/metrics"); !strings.Contains(metrics, "tollgate_store_local_denials_total ") {
		t.Errorf("/metrics on a Redis replica lacks tollgate_store_local_denials_total")
	}

	// A dead replica stops counting once its TTL (500ms) has run out.
	a.shutdown()
	stopped := time.Now()
	b.poll("A to leave B's view", func() bool {
		_, ok := b.global().Replicas["a"]
		return !ok
	})
	if d := time.Since(stopped); d > 5*time.Second {
		t.Errorf("A left B's view %v after it stopped, want about the TTL", d)
	}
}

func TestBreakerAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), shedRules)
	a := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--replica-id", "a")
	b := startReplica(t, ctx, dir, "--redis-url", srv.URL(), "--replica-id", "b")

	if resp := b.decide("premium", "m"); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("model m before failures = %v, want OK", resp)
	}
	// Failures without a ticket are nobody's: they open nothing.
	sendEntries(t, ctx, a.als, forged("m"), forged("m"), forged("m"), forged("m"))
	if resp := b.decide("premium", "m"); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("model m after forged failures = %v, want OK", resp)
	}
	// One genuine failure delivered three times (a replay, or Envoy
	// resending a batch) counts once.
	replayed := b.failure("m")
	sendEntries(t, ctx, a.als, replayed, replayed, replayed)
	// A's own record calls would have made the transition: none.
	if _, metrics := a.get("/metrics"); !strings.Contains(metrics, `tollgate_breaker_transitions_total{from="closed",to="open"} 0`) {
		t.Fatalf("one failure replayed three times opened the breaker:\n%s", grepLines(metrics, "tollgate_breaker"))
	}
	// Two more 5xx for model m, of requests B admitted, reported to A,
	// make three and open the breaker for B: the replicas share the
	// ticket key through Redis.
	sendEntries(t, ctx, a.als, b.failure("m"), b.failure("m"))
	var resp *rlsv3.RateLimitResponse
	b.poll("B to refuse model m", func() bool {
		resp = b.decide("premium", "m")
		return resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	})
	if reason(resp) != "breaker" {
		t.Errorf("model m refused with reason %q, want breaker", reason(resp))
	}
	if resp := b.decide("premium", "other"); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("another model = %v, want OK", resp)
	}
	_, metrics := a.get("/metrics")
	if !strings.Contains(metrics, `tollgate_breaker_state{breaker="m",domain="shed",key="model"} 2`) ||
		!strings.Contains(metrics, `tollgate_breaker_transitions_total{from="closed",to="open"} 1`) {
		t.Errorf("/metrics of A lacks the open breaker m:\n%s", grepLines(metrics, "tollgate_breaker"))
	}
	// Five deliveries classified (the replays too), no overload among them.
	if !strings.Contains(metrics, `tollgate_breaker_outcomes_total{class="failure",key="model"} 5`) ||
		!strings.Contains(metrics, `tollgate_breaker_outcomes_total{class="overload",key="model"} 0`) {
		t.Errorf("/metrics of A lacks the outcome classes:\n%s", grepLines(metrics, "tollgate_breaker"))
	}
	if _, body := b.get("/debug/pressure"); !strings.Contains(body, `"name": "m"`) || !strings.Contains(body, `"state": "open"`) {
		t.Errorf("/debug/pressure of B = %s, want breaker m open", body)
	}
}

// failure is a final access log entry of a 500 from the upstream for a
// request to model that r admitted: it carries the ticket r's answer
// gave, as Envoy's rate limit filter hands it to the access log.
func (r *replica) failure(model string) *datav3.HTTPAccessLogEntry {
	r.t.Helper()
	resp := r.decide("premium", model)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetDynamicMetadata() == nil {
		r.t.Fatalf("a request to %s before its failure: %v, want admitted with a ticket", model, resp)
	}
	return &datav3.HTTPAccessLogEntry{
		CommonProperties: &datav3.AccessLogCommon{
			UpstreamCluster: "llm", Duration: durationpb.New(100 * time.Millisecond),
			AccessLogType: datav3.AccessLogType_DownstreamEnd,
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				ticket.RateLimitNamespace: resp.GetDynamicMetadata(),
			}},
		},
		Response: &datav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(500)},
	}
}

// forged is failure's entry without a ticket of Tollgate's: the model
// named in metadata anyone can write.
func forged(model string) *datav3.HTTPAccessLogEntry {
	return &datav3.HTTPAccessLogEntry{
		CommonProperties: &datav3.AccessLogCommon{
			UpstreamCluster: "llm", Duration: durationpb.New(100 * time.Millisecond),
			AccessLogType: datav3.AccessLogType_DownstreamEnd,
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				ticket.MetadataNamespace: {Fields: map[string]*structpb.Value{ticket.FieldModel: structpb.NewStringValue(model)}},
			}},
		},
		Response: &datav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(500)},
	}
}

// sendEntries streams entries as Envoy's http_grpc logger does and waits
// for the service to have handled them.
func sendEntries(t *testing.T, ctx context.Context, c alsv3.AccessLogServiceClient, entries ...*datav3.HTTPAccessLogEntry) {
	t.Helper()
	stream, err := c.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&alsv3.StreamAccessLogsMessage{
		Identifier: &alsv3.StreamAccessLogsMessage_Identifier{Node: &corev3.Node{Id: "envoy-1"}, LogName: "tollgate"},
		LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestOutcomeObserverClasses: the pressure signals count each access log
// outcome as the breakers classify it: a busy upstream's 503 and the
// vendor's 429 are overloads, not errors; the same 503 with the upstream
// under capacity is an error; Envoy's overflow counts though no upstream
// was reached; Tollgate's own denial counts nothing.
func TestOutcomeObserverClasses(t *testing.T) {
	t.Parallel()
	via := func(status uint32) breaker.Facts {
		return breaker.Facts{Status: status, Details: breaker.DetailsViaUpstream, Upstream: "llm", Received: true, Sent: true, Answered: true}
	}
	tests := []struct {
		name string
		give accesslog.Outcome
		busy bool
		want pressure.OutcomeStats
	}{
		{name: "success", give: accesslog.Outcome{Facts: via(200), UpstreamCluster: "llm", Model: "m"}, want: pressure.OutcomeStats{Count: 1}},
		{name: "503 busy", give: accesslog.Outcome{Facts: via(503), UpstreamCluster: "llm", Model: "m"}, busy: true, want: pressure.OutcomeStats{Count: 1, Overloads: 1}},
		{name: "503 not busy", give: accesslog.Outcome{Facts: via(503), UpstreamCluster: "llm", Model: "m"}, want: pressure.OutcomeStats{Count: 1, Errors: 1}},
		{name: "503 busy without a model", give: accesslog.Outcome{Facts: via(503), UpstreamCluster: "llm"}, busy: true, want: pressure.OutcomeStats{Count: 1, Errors: 1}},
		{name: "vendor 429", give: accesslog.Outcome{Facts: via(429), UpstreamCluster: "llm", Model: "m"}, want: pressure.OutcomeStats{Count: 1, Overloads: 1}},
		{name: "client 400", give: accesslog.Outcome{Facts: via(400), UpstreamCluster: "llm", Model: "m"}, want: pressure.OutcomeStats{Count: 1}},
		{name: "envoy overflow", give: accesslog.Outcome{Facts: breaker.Facts{Status: 503, Flags: breaker.FlagUpstreamOverflow}, Model: "m"}, want: pressure.OutcomeStats{Count: 1, Overloads: 1}},
		{name: "tollgate denial", give: accesslog.Outcome{Facts: breaker.Facts{Status: 503, Details: "ext_authz_denied", Flags: breaker.FlagOther}, Model: "m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := pressure.NewOutcomes(pressure.OutcomeConfig{SLA: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			now := time.UnixMilli(1_700_000_000_000)
			var asked []string
			obs := outcomeObserver{o: o, clock: storetest.NewFakeClock(now), busy: func(domain, name string) bool {
				asked = append(asked, domain+"/"+name)
				return tt.busy
			}}
			tt.give.Domain = "d"
			obs.Observe(context.Background(), &tt.give)
			if got := o.Global().Stats(now); got.Count != tt.want.Count || got.Errors != tt.want.Errors || got.Overloads != tt.want.Overloads {
				t.Errorf("Stats = %+v, want %+v", got, tt.want)
			}
			for _, a := range asked {
				if a != "d/m" {
					t.Errorf("busy asked for %q, want d/m", a)
				}
			}
		})
	}
}
