package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/rls"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

func TestMetricFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		give          []string
		env           map[string]string
		want          int
		wantUsageText string // non-empty: a usage error containing it
	}{
		{name: "default", want: rls.DefaultDetailedSeriesCap},
		{name: "flag", give: []string{"--detailed-metric-series=50"}, want: 50},
		{name: "env", env: map[string]string{"TOLLGATE_DETAILED_METRIC_SERIES": "7"}, want: 7},
		{name: "flag wins", give: []string{"--detailed-metric-series=9"}, env: map[string]string{"TOLLGATE_DETAILED_METRIC_SERIES": "7"}, want: 9},
		{name: "zero", give: []string{"--detailed-metric-series=0"}, want: 0},
		{name: "negative", give: []string{"--detailed-metric-series=-1"}, wantUsageText: "--detailed-metric-series must be 0 or more"},
		{name: "not a number", give: []string{"--detailed-metric-series=many"}, wantUsageText: `--detailed-metric-series "many": want a whole number, such as 100`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			a := &App{Stderr: &stderr, LookupEnv: env(tt.env)}
			f, err := a.parseServeFlags(tt.give)
			if tt.wantUsageText != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantUsageText) {
					t.Errorf("parseServeFlags(%q) = %v, stderr %q; want a usage error with %q", tt.give, err, stderr.String(), tt.wantUsageText)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseServeFlags: %v\n%s", err, stderr.String())
			}
			if got := detailedCap(t, f.metrics.rlsOptions()); got != tt.want {
				t.Errorf("detailed series cap = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestMetricFlagsHelpShowsDefault: unset, the flag is zero and rls's
// default applies, so the help must say what that is.
func TestMetricFlagsHelpShowsDefault(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr, LookupEnv: env(nil)}
	_, _ = a.parseServeFlags([]string{"-h"})
	want := fmt.Sprintf("0 sends them all there (default %d)", rls.DefaultDetailedSeriesCap)
	if !strings.Contains(stderr.String(), "-detailed-metric-series") || !strings.Contains(stderr.String(), want) {
		t.Errorf("serve -h lacks -detailed-metric-series with %q:\n%s", want, stderr.String())
	}
}

// detailedCap is the cap opts give an RLS service, read back the way an
// operator would: from the series it keeps.
func detailedCap(t testing.TB, opts []rls.Option) int {
	t.Helper()
	reg := prometheus.NewRegistry()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Descriptors: []*limit.Rule{{Key: "k", Unlimited: true, DetailedMetric: true}}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(admission.NewLimiter(memstore.New(), nil, rs), nil, reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	const values = 2 * rls.DefaultDetailedSeriesCap
	for i := range values {
		_, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonrl.RateLimitDescriptor{{
			Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: strconv.Itoa(i)}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_rls_detailed_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "descriptor" && l.GetValue() != "overflow" {
					n++
				}
			}
		}
	}
	return n
}

const detailedRules = `domain: e2e
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// TestServeDetailedSeriesCap: --detailed-metric-series reaches the RLS
// service of a running `tollgate serve`, as /metrics shows.
func TestServeDetailedSeriesCap(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), detailedRules)

	stderr := &buffer{}
	addrs := make(chan Addrs, 1)
	a := &App{Stdout: io.Discard, Stderr: stderr, LookupEnv: env(map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0"}), Listening: func(ad Addrs) { addrs <- ad }}
	runCtx, stop := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() { exit <- a.Run(runCtx, []string{"serve", "--config", dir, "--detailed-metric-series", "2"}) }()
	defer func() {
		stop()
		<-exit
	}()
	e := &e2e{t: t, ctx: ctx, stderr: stderr}
	select {
	case e.addrs = <-addrs:
	case code := <-exit:
		exit <- code
		t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
	case <-ctx.Done():
		t.Fatalf("serve never listened:\n%s", stderr.String())
	}
	conn, err := grpc.NewClient("passthrough:///"+e.addrs.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)

	const users = 5
	for i := range users {
		_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*commonrl.RateLimitDescriptor{{
			Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%d", i)}},
		}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit(u%d): %v", i, err)
		}
	}
	_, metrics := e.get("/metrics")
	for _, want := range []string{
		`tollgate_rls_detailed_decisions_total{descriptor="user=u0",domain="e2e",result="ok",rule="user"} 1`,
		`tollgate_rls_detailed_decisions_total{descriptor="user=u1",domain="e2e",result="ok",rule="user"} 1`,
		`tollgate_rls_detailed_decisions_total{descriptor="overflow",domain="e2e",result="ok",rule="user"} 3`,
		`tollgate_rls_detailed_overflow_total{domain="e2e",rule="user"} 3`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n := strings.Count(metrics, "tollgate_rls_detailed_decisions_total{"); n != 3 {
		t.Errorf("/metrics has %d series of tollgate_rls_detailed_decisions_total, want 3 (2 and overflow)", n)
	}
}
