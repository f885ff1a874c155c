package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
)

// reloadRules is domain shed with its tiers; region adds an unrelated
// descriptor rule, shedding and breakers are appended as given.
func reloadRules(region bool, shedding, breakers string) string {
	var b strings.Builder
	b.WriteString(`domain: shed
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100000}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 100000}
`)
	if region {
		b.WriteString(`  - key: region
    rate_limit: {unit: minute, requests_per_unit: 100000}
`)
	}
	b.WriteString(`tiers:
  key: tier
  default: free
  plans: {premium: 3, standard: 2, free: 1}
`)
	b.WriteString(shedding)
	b.WriteString(breakers)
	return b.String()
}

// shedAbove is a one-step policy shedding free from above. Its
// hysteresis lets a test tell a kept Evaluator from a new one: at 0.68 a
// kept one stays on the step entered at 0.75, a new one never enters it.
func shedAbove(above string) string {
	return `shedding:
  steps:
    - above: ` + above + `
      shed: [free]
  hysteresis: 0.05
  hold: 100ms
`
}

func breakerWithThreshold(n int) string {
	return fmt.Sprintf(`breakers:
  - key: model
    failure_threshold: %d
    window: 1m
    open_for: 1m
`, n)
}

var reloadsRE = regexp.MustCompile(`(?m)^tollgate_config_reloads_total\{result="(success|failure)"\} (\d+)$`)

// reloads reads tollgate_config_reloads_total of result.
func (r *replica) reloads(result string) int {
	r.t.Helper()
	_, metrics := r.get("/metrics")
	for _, m := range reloadsRE.FindAllStringSubmatch(metrics, -1) {
		if m[1] == result {
			n, _ := strconv.Atoi(m[2])
			return n
		}
	}
	r.t.Fatalf("/metrics lacks tollgate_config_reloads_total{result=%q}", result)
	return 0
}

// reloader rewrites the rules file and waits for serve to have acted on
// each rewrite: the reload counter moves after sh.apply returns.
type reloader struct {
	r               *replica
	path            string
	edits           int
	success, failed int
}

// newReloader waits for the watcher's first report, which shows it
// watches: from then on each rewrite is exactly one more reload.
func newReloader(r *replica, path string) *reloader {
	r.t.Helper()
	r.watching()
	return &reloader{r: r, path: path, success: r.reloads("success"), failed: r.reloads("failure")}
}

func (l *reloader) apply(what, rules string) {
	l.r.t.Helper()
	rewrite(l.r.t, l.path, rules, &l.edits)
	l.success++
	l.r.poll("reload: "+what, func() bool { return l.r.reloads("success") >= l.success })
	if n := l.r.reloads("failure"); n != l.failed {
		l.r.t.Fatalf("after %s: %d failed reloads, want %d\n%s", what, n, l.failed, l.r.stderr.String())
	}
}

func (l *reloader) reject(what, rules string) {
	l.r.t.Helper()
	rewrite(l.r.t, l.path, rules, &l.edits)
	l.failed++
	l.r.poll("rejected reload: "+what, func() bool { return l.r.reloads("failure") >= l.failed })
	if n := l.r.reloads("success"); n != l.success {
		l.r.t.Fatalf("after %s: %d successful reloads, want %d", what, n, l.success)
	}
}

// steady checks ok on every poll until the global scope of domain shed
// has been read by several Combiner ticks (50ms apart) taken after now,
// failing at the first poll where ok does not hold.
func (r *replica) steady(what string, ok func() bool) {
	r.t.Helper()
	after := time.Now().Add(200 * time.Millisecond)
	r.poll(what+" over several ticks", func() bool {
		if !ok() {
			r.t.Fatalf("%s: broke (global scope %+v)", what, r.global())
		}
		return r.global().At.After(after)
	})
}

func (r *replica) sheds(tier string) func() bool {
	return func() bool { return !r.admitted(tier)[tier] }
}

func (r *replica) admits(tier string) func() bool {
	return func() bool { return r.admitted(tier)[tier] }
}

func TestPressureReload(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, reloadRules(false, shedAbove("0.7"), ""))
	r := startReplica(t, ctx, dir)
	l := newReloader(r, path)

	r.push("0.75")
	r.poll("free shed at 0.75", r.sheds("free"))
	// Into the hysteresis band: the active step holds, a fresh
	// Evaluator's would not be entered.
	r.push("0.68")
	r.poll("the combiner to read 0.68", func() bool { return r.global().Combined == 0.68 })
	r.steady("free shed at 0.68 by hysteresis", r.sheds("free"))

	// Same shedding, another rule: the Evaluator and its step are kept.
	l.apply("same shedding, a new descriptor", reloadRules(true, shedAbove("0.7"), ""))
	if _, body := r.get("/debug/config"); !strings.Contains(body, `"id": "region"`) {
		t.Fatalf("/debug/config after the reload lacks rule region: %s", body)
	}
	r.steady("free shed at 0.68 after a reload with the same shedding", r.sheds("free"))
	if s := r.global(); s.Level != 0 || s.Combined != 0.68 {
		t.Errorf("global scope after the same-shedding reload = %+v, want level 0 at 0.68", s)
	}
	if _, metrics := r.get("/metrics"); !strings.Contains(metrics, `tollgate_pressure_level{domain="shed",scope="global"} 0`) {
		t.Errorf("/metrics after the same-shedding reload:\n%s", grepLines(metrics, "tollgate_pressure"))
	}

	// A broken shedding policy is rejected whole: the rules, the
	// Evaluator and its step keep serving.
	l.reject("an invalid shedding policy", reloadRules(false, shedAbove("1.5"), ""))
	if _, body := r.get("/debug/config"); !strings.Contains(body, `"id": "region"`) {
		t.Errorf("/debug/config after a rejected reload lost rule region: %s", body)
	}
	r.steady("free shed at 0.68 after a rejected reload", r.sheds("free"))

	// Another threshold: a new Evaluator, at 0.75 below its 0.8.
	r.push("0.75")
	r.poll("the combiner to read 0.75", func() bool { return r.global().Combined == 0.75 })
	l.apply("shedding above 0.8", reloadRules(true, shedAbove("0.8"), ""))
	r.steady("free admitted at 0.75 under shedding above 0.8", r.admits("free"))
	if s := r.global(); s.Level != -1 || len(s.Shed) != 0 {
		t.Errorf("global scope under shedding above 0.8 at 0.75 = %+v, want level -1, nothing shed", s)
	}
	r.push("0.85")
	r.poll("free shed at 0.85 under shedding above 0.8", r.sheds("free"))

	// No shedding: nothing is shed, the domain leaves /v1/pressure,
	// /debug/pressure and the pressure series.
	l.apply("no shedding", reloadRules(true, "", ""))
	if got := r.admitted("premium", "standard", "free"); !got["premium"] || !got["standard"] || !got["free"] {
		t.Errorf("admitted without shedding at 0.85 = %v, want all", got)
	}
	if code, body := r.pressure(http.MethodPut, `{"scope":"global","pressure":0.1}`, r.token); code != http.StatusNotFound {
		t.Errorf("PUT /v1/pressure without shedding = %d %s, want 404", code, body)
	}
	if code, body := r.pressure(http.MethodGet, "", r.token); code != http.StatusNotFound {
		t.Errorf("GET /v1/pressure without shedding = %d %s, want 404", code, body)
	}
	code, body := r.get("/debug/pressure")
	var v pressureruntime.View
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil || len(v.Domains) != 0 {
		t.Errorf("/debug/pressure without shedding = %d %s (%v), want no domains", code, body, err)
	}
	_, metrics := r.get("/metrics")
	for _, series := range []string{"tollgate_pressure_score{", "tollgate_pressure_local_score{", "tollgate_pressure_level{", "tollgate_pressure_factor{", "tollgate_pressure_board_stale{"} {
		if strings.Contains(metrics, series) {
			t.Errorf("/metrics without shedding still has %s:\n%s", series, grepLines(metrics, series))
		}
	}
	if !strings.Contains(metrics, "tollgate_pressure_prom_errors_total 0") {
		t.Errorf("/metrics without shedding lacks tollgate_pressure_prom_errors_total")
	}

	// Shedding back: the score pushed before (0.85, a minute's TTL) is
	// the scope's on the board, not the policy's, so it sheds again
	// without a new push.
	l.apply("shedding back", reloadRules(true, shedAbove("0.7"), ""))
	r.poll("free shed again by the earlier push", r.sheds("free"))
	if s := r.global(); s.Pushed == nil || *s.Pushed != 0.85 || s.Level != 0 {
		t.Errorf("global scope with shedding back = %+v, want pushed 0.85 at level 0", s)
	}
	if _, metrics := r.get("/metrics"); !strings.Contains(metrics, `tollgate_pressure_score{domain="shed",scope="global"} 0.85`) {
		t.Errorf("/metrics with shedding back:\n%s", grepLines(metrics, "tollgate_pressure"))
	}
}

func TestBreakerReload(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, reloadRules(false, "", breakerWithThreshold(3)))
	r := startReplica(t, ctx, dir)
	l := newReloader(r, path)

	refused := func(model string) bool {
		resp := r.decide("premium", model)
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			return false
		}
		if reason(resp) != "breaker" {
			t.Fatalf("model %s refused with reason %q, want breaker", model, reason(resp))
		}
		return true
	}
	const mOpen = `tollgate_breaker_state{breaker="m",domain="shed",key="model"} 2`
	const opened = `tollgate_breaker_transitions_total{from="closed",to="open"} 1`

	sendEntries(t, ctx, r.als, r.failure("m"), r.failure("m"), r.failure("m"))
	r.poll("model m refused", func() bool { return refused("m") })
	if _, metrics := r.get("/metrics"); !strings.Contains(metrics, mOpen) || !strings.Contains(metrics, opened) {
		t.Fatalf("/metrics lacks the open breaker m:\n%s", grepLines(metrics, "tollgate_breaker"))
	}

	// Unchanged breakers, another rule: the Breaker is kept, with what it
	// saw (before any new decision on m) and its counts.
	l.apply("same breakers, a new descriptor", reloadRules(true, "", breakerWithThreshold(3)))
	if _, metrics := r.get("/metrics"); !strings.Contains(metrics, mOpen) || !strings.Contains(metrics, opened) {
		t.Errorf("/metrics after a same-breakers reload lacks the open breaker m:\n%s", grepLines(metrics, "tollgate_breaker"))
	}
	if !refused("m") {
		t.Error("model m admitted after a same-breakers reload, want still refused")
	}

	// Another threshold: a new Breaker. Its view starts empty, the
	// transition counts carry over, and the state of m, which lives in the
	// breaker store that every replica shares, stays open.
	l.apply("failure_threshold 5", reloadRules(true, "", breakerWithThreshold(5)))
	if _, metrics := r.get("/metrics"); strings.Contains(metrics, `tollgate_breaker_state{breaker="m"`) || !strings.Contains(metrics, opened) {
		t.Errorf("/metrics after a changed-breaker reload = \n%s\nwant no view of m yet and the transition kept", grepLines(metrics, "tollgate_breaker"))
	}
	if !refused("m") {
		t.Error("model m admitted after a changed-breaker reload, want still open in the store")
	}
	if _, metrics := r.get("/metrics"); !strings.Contains(metrics, mOpen) {
		t.Errorf("/metrics after a decision on m lacks its open state:\n%s", grepLines(metrics, "tollgate_breaker"))
	}
	// The new threshold is in force: three failures no longer open n.
	sendEntries(t, ctx, r.als, r.failure("n"), r.failure("n"), r.failure("n"))
	if refused("n") {
		t.Error("model n refused after 3 failures under failure_threshold 5")
	}
	sendEntries(t, ctx, r.als, r.failure("n"), r.failure("n"))
	r.poll("model n refused after 5 failures", func() bool { return refused("n") })
	if _, metrics := r.get("/metrics"); !strings.Contains(metrics, `tollgate_breaker_transitions_total{from="closed",to="open"} 2`) {
		t.Errorf("/metrics after n opened:\n%s", grepLines(metrics, "tollgate_breaker_transitions"))
	}
}
