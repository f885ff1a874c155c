package runtime

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/pressure"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const shedding = `
shedding:
  steps:
    - above: 0.7
      shed: [free]
  hold: 300ms
`

const breakers = `
breakers:
  - key: model
    failure_threshold: 3
    window: 1m
    open_for: 1m
`

// rules is domain d with a model rule for m1, tiers, and the extra YAML.
func rules(tb testing.TB, extra string) *limit.RuleSet {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "rules.yaml")
	yaml := `domain: d
descriptors:
  - key: model
    value: m1
    rate_limit: {unit: minute, requests_per_unit: 100}
tiers:
  key: tier
  default: free
  plans: {premium: 2, free: 1}
` + extra
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	rs, err := config.Load(path)
	if err != nil {
		tb.Fatal(err)
	}
	return rs
}

// newRuntime is a Runtime on in-memory shared state, stopped at the end.
func newRuntime(tb testing.TB, tokenFile string) *Runtime {
	tb.Helper()
	rt, err := New(context.Background(), Config{
		Replica: "r1", Interval: time.Hour, TTL: time.Hour, Combine: pressure.CombineMax, TokenFile: tokenFile,
	}, Shared{
		Board: memstore.NewBoard(), Cells: memstore.NewCells(), Breakers: memstore.NewBreakers(),
		Flights: memstore.NewFlights(), Meters: memstore.NewMeters(),
	}, zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(rt.Stop)
	return rt
}

func TestApplyView(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		give         string
		wantDomains  []string
		wantBreakers []string // domain/key
	}{
		{name: "neither", give: ""},
		{name: "shedding", give: shedding, wantDomains: []string{"d"}},
		{name: "breakers", give: breakers, wantBreakers: []string{"d/model"}},
		{name: "both", give: shedding + breakers, wantDomains: []string{"d"}, wantBreakers: []string{"d/model"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt := newRuntime(t, "")
			var told [][]breaker.SetEntry
			rt.OnBreakers(func(b []breaker.SetEntry) { told = append(told, b) })
			if err := rt.Apply(rules(t, tt.give)); err != nil {
				t.Fatal(err)
			}
			v := rt.View()
			var domains, brs []string
			for _, d := range v.Domains {
				domains = append(domains, d.Domain)
			}
			for _, b := range v.Breakers {
				brs = append(brs, b.Domain+"/"+b.Key)
			}
			if strings.Join(domains, ",") != strings.Join(tt.wantDomains, ",") || strings.Join(brs, ",") != strings.Join(tt.wantBreakers, ",") {
				t.Errorf("View domains %v breakers %v, want %v %v", domains, brs, tt.wantDomains, tt.wantBreakers)
			}
			if v.Replica != "r1" || v.Combine != "max" {
				t.Errorf("View replica %q combine %q, want r1 max", v.Replica, v.Combine)
			}
			if len(told) != 1 || len(told[0]) != len(tt.wantBreakers) {
				t.Errorf("OnBreakers told %d times, last with %v; want once with %d breakers", len(told), told, len(tt.wantBreakers))
			}
		})
	}
}

// TestApplyKeepsUnchangedBreakers: a reload that does not change a
// breaker's configuration keeps the Breaker, and with it its state.
func TestApplyKeepsUnchangedBreakers(t *testing.T) {
	t.Parallel()
	rt := newRuntime(t, "")
	var told [][]breaker.SetEntry
	rt.OnBreakers(func(b []breaker.SetEntry) { told = append(told, b) })
	for range 2 {
		if err := rt.Apply(rules(t, shedding+breakers)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Apply(rules(t, shedding+strings.Replace(breakers, "failure_threshold: 3", "failure_threshold: 4", 1))); err != nil {
		t.Fatal(err)
	}
	if len(told) != 3 || len(told[0]) != 1 || len(told[1]) != 1 || len(told[2]) != 1 {
		t.Fatalf("OnBreakers told %v", told)
	}
	if told[0][0].Breaker != told[1][0].Breaker {
		t.Error("an unchanged breaker was rebuilt by a reload")
	}
	if told[1][0].Breaker == told[2][0].Breaker {
		t.Error("a changed breaker was kept by a reload")
	}
}

func TestApplyAfterStop(t *testing.T) {
	t.Parallel()
	rt := newRuntime(t, "")
	rt.Stop()
	if err := rt.Apply(rules(t, shedding)); err == nil {
		t.Error("Apply after Stop = nil, want an error")
	}
}

func TestHandler(t *testing.T) {
	t.Parallel()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret-token-of-enough-length-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		give     string // rules' extra YAML
		method   string
		auth     string
		body     string
		wantCode int
		wantBody string
	}{
		{name: "no shedding domain", give: breakers, method: http.MethodGet, wantCode: http.StatusNotFound, wantBody: "no domain has a shedding policy"},
		{name: "no token", give: shedding, method: http.MethodGet, wantCode: http.StatusUnauthorized},
		{name: "get lists domains", give: shedding, method: http.MethodGet, auth: "Bearer s3cret-token-of-enough-length-0123456789", wantCode: http.StatusOK, wantBody: `"domain":"d"`},
		{name: "put pushes", give: shedding, method: http.MethodPut, auth: "Bearer s3cret-token-of-enough-length-0123456789", body: `{"scope":"global","pressure":0.8}`, wantCode: http.StatusNoContent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt := newRuntime(t, token)
			if err := rt.Apply(rules(t, tt.give)); err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(tt.method, "/v1/pressure", strings.NewReader(tt.body))
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			rt.Handler().ServeHTTP(rec, req)
			if rec.Code != tt.wantCode || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("%s = %d %q, want %d containing %q", tt.method, rec.Code, rec.Body.String(), tt.wantCode, tt.wantBody)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	t.Parallel()
	rt := newRuntime(t, "")
	if err := rt.Apply(rules(t, shedding+breakers)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(rt.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{"tollgate_pressure_score", "tollgate_pressure_level", "tollgate_breaker_untracked_total", "tollgate_pressure_prom_errors_total", "tollgate_control_flights_dropped_total"} {
		if !got[name] {
			t.Errorf("gathered %v, lacks %s", got, name)
		}
	}
}

func TestModelsOf(t *testing.T) {
	t.Parallel()
	rs := rules(t, "")
	if got := ModelsOf(rs.Domain("d").Descriptors); strings.Join(got, ",") != "m1" {
		t.Errorf("ModelsOf = %v, want [m1]", got)
	}
}
