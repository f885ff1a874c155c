package dashboards

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

const (
	dashboardPath = "../../deploy/grafana/tollgate.json"
	alertsPath    = "../../deploy/prometheus/alerts.yaml"
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want []string
	}{
		{"selector", `tollgate_a_total{domain=~"$domain",x="}{by(y)"}`, []string{"tollgate_a_total"}},
		{"rate and sum by", `sum by (result, tier) (rate(tollgate_a_total[$__rate_interval]))`, []string{"tollgate_a_total"}},
		{"aggregation clause after", `sum(rate(a_total[5m])) by (le) / on (job) group_left (x) b`, []string{"a_total", "b"}},
		{"quantile", `histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket{i=~"${instance}"}[1m])))`, []string{"x_seconds_bucket"}},
		{"keywords and numbers", `a > bool 1e3 and b unless c or vector(0) offset 5m`, []string{"a", "b", "c"}},
		{"time and topk", `topk(10, time() - max(ts_seconds))`, []string{"ts_seconds"}},
		{"recording rule name", `job:requests:rate5m > 0.5`, []string{"job:requests:rate5m"}},
		{"nothing", `vector(1)`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := MetricNames(tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	for _, bad := range []string{`a{x="y`, `a[5m`, `sum by (x`} {
		if _, err := MetricNames(bad); err == nil {
			t.Errorf("MetricNames(%q): no error", bad)
		}
	}
}

// FuzzMetricNames: the tokenizer reads files a person edits; it must not
// panic or loop on any input.
func FuzzMetricNames(f *testing.F) {
	for _, s := range []string{`sum by (a) (rate(m{x="y"}[5m]))`, `a{`, `"`, `$`, `${`, "by (", `x[1m:]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := MetricNames(s)
		if err != nil {
			return
		}
		for _, n := range names {
			if n == "" || !isIdentStart(n[0]) {
				t.Fatalf("%q: name %q", s, n)
			}
		}
	})
}

// TestDeployFilesParse parses the dashboard and the rules, and checks
// every expression's syntax with promtool.
func TestDeployFilesParse(t *testing.T) {
	t.Parallel()
	dash, err := DashboardQueries(readFile(t, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := AlertQueries(readFile(t, alertsPath))
	if err != nil {
		t.Fatal(err)
	}
	if len(dash) < 20 || len(alerts) < 5 {
		t.Fatalf("%d dashboard queries, %d alert rules: the files lost their content", len(dash), len(alerts))
	}
	var d struct {
		Panels []struct {
			ID         int             `json:"id"`
			Type       string          `json:"type"`
			Title      string          `json:"title"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, dashboardPath), &d); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	for _, p := range d.Panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type != "row" && !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
		}
	}
	for _, q := range append(dash, alerts...) {
		if names, err := MetricNames(q.Expr); err != nil || len(names) == 0 {
			t.Errorf("%s: %q: names %v, err %v", q.Where, q.Expr, names, err)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found (Debian's prometheus package has it; make prometheus installs it): syntax not checked")
	}
	// The dashboard's expressions as recording rules, with Grafana's
	// variables given values, so that promtool parses them.
	vars := strings.NewReplacer("$__rate_interval", "5m", "${datasource}", "prom")
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, q := range dash {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:expr_%d", i), Expr: vars.Replace(q.Expr)})
	}
	b, err := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	asRules := filepath.Join(t.TempDir(), "dashboard-rules.json")
	if err := os.WriteFile(asRules, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{alertsPath, asRules} {
		out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
		if err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", f, err, out)
		}
	}
}

// TestDeployMetricsExist runs tollgate as `make run` does, on Redis (for
// the lease and local denial metrics), makes a few calls of each kind,
// then kills Redis and makes more (for the store failure policy's
// metrics), and checks that every metric the dashboard and the alerts use
// is in /metrics. No name is exempt: a metric that appears only once
// counted is made to count here.
func TestDeployMetricsExist(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts redis-server and tollgate")
	}
	dash, err := DashboardQueries(readFile(t, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := AlertQueries(readFile(t, alertsPath))
	if err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)
	tg := startTollgate(t, redis.URL())
	conn, err := grpc.NewClient(tg.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	exercise(ctx, t, conn)

	// Breaker transitions are exported once there is one: the access log
	// entries above (5xx) open the gpt-4o breaker.
	waitExported(ctx, t, tg.adminAddr, "tollgate_breaker_transitions_total", nil)
	// The store failure policy's counter is exported once a decision is
	// degraded: with Redis gone, each ShouldRateLimit is answered by the
	// local policy (config/ keeps --store-failure at its default, local).
	redis.Kill()
	exported := waitExported(ctx, t, tg.adminAddr, "tollgate_store_degraded_decisions_total", func() {
		shouldRateLimit(ctx, t, conn)
	})

	for _, c := range []struct {
		what    string
		queries []Query
	}{{"dashboard", dash}, {"alerts", alerts}} {
		missing, err := Missing(c.queries, exported)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range missing {
			t.Errorf("%s: %s is not in /metrics", c.what, m)
		}
	}

	// A dashboard that names a metric tollgate does not have fails.
	broken := strings.Replace(string(readFile(t, dashboardPath)), "tollgate_rls_decisions_total{", "tollgate_rls_decisionz_total{", 1)
	bq, err := DashboardQueries([]byte(broken))
	if err != nil {
		t.Fatal(err)
	}
	missing, err := Missing(bq, exported)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || !strings.HasSuffix(missing[0], ": tollgate_rls_decisionz_total") {
		t.Errorf("broken dashboard: missing %q, want the one unknown name", missing)
	}
}

// waitExported scrapes /metrics until name is in it or exportWait has
// passed, calling each (when not nil) before every scrape, and returns
// the last scrape: when name never came, the checks that follow report
// it missing.
func waitExported(ctx context.Context, t *testing.T, adminAddr, name string, each func()) Exported {
	t.Helper()
	deadline := time.Now().Add(exportWait)
	for {
		if each != nil {
			each()
		}
		exported := ParseExposition(scrape(ctx, t, adminAddr))
		if exported.Has(name) || time.Now().After(deadline) {
			return exported
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exportWait bounds how long waitExported waits for a metric: the breaker
// opens and a decision is degraded within a second or two of the calls
// that cause them, on a busy machine too.
const exportWait = 10 * time.Second

// shouldRateLimit makes one ShouldRateLimit call of the demo tenant; it
// must be answered, whatever the store does.
func shouldRateLimit(ctx context.Context, t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "inference", Descriptors: []*rlpb.RateLimitDescriptor{{
		Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}, {Key: "model", Value: "gpt-4o"}, {Key: "tier", Value: "premium"}},
	}}}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
}

// exercise makes calls of each kind: ShouldRateLimit, Check with the demo
// key, and an access log entry for each Check, reporting a 500 so that
// the breaker on gpt-4o opens.
func exercise(ctx context.Context, t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	entries := func(kv ...string) *rlpb.RateLimitDescriptor {
		d := &rlpb.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	for range 3 {
		if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "inference", Descriptors: []*rlpb.RateLimitDescriptor{
			entries("tenant", "acme", "model", "gpt-4o", "tier", "premium"), entries("model", "gpt-4o"),
		}}); err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
	}
	authz := authv3.NewAuthorizationClient(conn)
	als := alsv3.NewAccessLogServiceClient(conn)
	stream, err := als.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatalf("StreamAccessLogs: %v", err)
	}
	// inference.yaml opens the breaker after 5 failures.
	for i := range 6 {
		resp, err := authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{
				Id: fmt.Sprintf("dash-%d", i), Method: "POST", Path: "/v1/chat/completions",
				Headers: map[string]string{"authorization": "Bearer demo-acme-key-0123456789", "content-type": "application/json"},
				Body:    `{"model": "gpt-4o", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}`,
			},
		}}})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		meta := resp.GetDynamicMetadata()
		if resp.GetOkResponse() == nil || meta == nil {
			// The breaker is open already: the rest is refused.
			continue
		}
		err = stream.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*datav3.HTTPAccessLogEntry{{
				CommonProperties: &datav3.AccessLogCommon{Metadata: &corev3.Metadata{
					FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.ext_authz": meta},
				}},
				Response: &datav3.HTTPResponseProperties{
					ResponseCode:    wrapperspb.UInt32(500),
					ResponseHeaders: map[string]string{"x-usage-total-tokens": "50"},
				},
			}}},
		}})
		if err != nil {
			t.Fatalf("send access log: %v", err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("close access log stream: %v", err)
	}
}

func scrape(ctx context.Context, t *testing.T, adminAddr string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	return string(b)
}

type tollgate struct{ grpcAddr, adminAddr string }

// startTollgate builds cmd/tollgate from the working tree and serves
// config/ with the ext_authz demo settings, as `make run` does, on Redis.
func startTollgate(t *testing.T, redisURL string) tollgate {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "tollgate")
	bctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// go test puts its own GOROOT/bin first on PATH: the same toolchain.
	if out, err := exec.CommandContext(bctx, "go", "build", "-o", bin, "github.com/tollgate-dev/tollgate/cmd/tollgate").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/tollgate: %v\n%s", err, out)
	}
	var lastErr error
	for range 3 { // a port picked free may be taken before tollgate binds it
		tg := tollgate{grpcAddr: freeAddr(t), adminAddr: freeAddr(t)}
		log := &redistest.TailBuffer{Max: 16 << 10}
		cmd := exec.Command(bin, "serve",
			"--config", filepath.Join(root, "config"),
			"--authz-config", filepath.Join(root, "config/authz/authz.yaml"),
			"--pressure-token-file", filepath.Join(root, "config/authz/pressure.token"),
			"--redis-url", redisURL,
			"--grpc-addr", tg.grpcAddr, "--admin-addr", tg.adminAddr, "--log-format", "console")
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		if lastErr = waitReady(t.Context(), tg.adminAddr, exited); lastErr == nil {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("tollgate log tail:\n%s", log)
				}
			})
			return tg
		}
		stop()
		lastErr = fmt.Errorf("%w; log:\n%s", lastErr, log)
	}
	t.Fatalf("start tollgate: %v", lastErr)
	return tollgate{}
}

func waitReady(ctx context.Context, adminAddr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("tollgate exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("tollgate not ready within 15s")
		case <-tick.C:
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestBrokenAlertsFail: a copy of the alert rules with a syntax error in
// one expression, or a misspelt field, fails promtool, so the check above
// can fail.
func TestBrokenAlertsFail(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found (make prometheus installs it)")
	}
	good := string(readFile(t, alertsPath))
	tests := []struct {
		name, old, new string
	}{
		{"unbalanced parenthesis", "rate(tollgate_store_errors_total", "rate((tollgate_store_errors_total"},
		{"misspelt field", "annotations:", "anotations:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !strings.Contains(good, tt.old) {
				t.Fatalf("%s no longer holds %q: pick another place to break", alertsPath, tt.old)
			}
			f := filepath.Join(t.TempDir(), "alerts.yaml")
			if err := os.WriteFile(f, []byte(strings.Replace(good, tt.old, tt.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
			if err == nil {
				t.Fatalf("promtool accepted the broken copy:\n%s", out)
			}
			t.Logf("promtool: %s", strings.TrimSpace(string(out)))
		})
	}
}
