package replicas

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// busyRules is issue 5's round-trip case: 100,000 requests a minute for
// one tenant, a sliding window, spread over three replicas.
const busyRules = `domain: replicas
descriptors:
  - key: tenant
    value: acme
    rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 100000}
`

// maxCommandsPerDecision is issue 5's target 4.
const maxCommandsPerDecision = 0.2

// TestLeasesFewRedisCommands loads three replicas sharing a limit of
// 100,000 a minute and counts every command Redis ran (INFO
// commandstats, the pressure board's included) against the decisions
// answered. With leases, most decisions never reach Redis. The window
// test (TestReplicasShareOneLimit/Leases) shows the same leases do not
// over-admit.
func TestLeasesFewRedisCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and three tollgate processes for about 10s; skipped with -short")
	}
	t.Parallel()
	bin := tollgatetest.Build(t)
	rdb := redistest.Start(t)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(busyRules), 0o600); err != nil {
		t.Fatal(err)
	}
	reps := make([]*tollgatetest.Process, replicas)
	for i := range reps {
		reps[i] = startReplica(t, bin, i, rdb.URL(), rulesPath)
	}
	client := rdb.Client(t)
	if err := client.ConfigResetStat(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	run := drive(t, reps)
	info, err := client.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var decisions, over, failed int
	for _, w := range run.workers {
		decisions += len(w.ok) + w.over
		over += w.over
		failed += len(w.errs)
	}
	if failed > 0 {
		t.Errorf("%d calls failed", failed)
	}
	commands, byName := countCommands(t, info)
	perDecision := float64(commands) / float64(max(1, decisions))
	t.Logf("%d decisions (%d over limit) in %v; Redis ran %d commands %v: %.4f per decision",
		decisions, over, run.span.Round(1e6), commands, byName, perDecision)
	if decisions < 1000 {
		t.Fatalf("only %d decisions: the load shows nothing", decisions)
	}
	if perDecision > maxCommandsPerDecision {
		t.Errorf("%.4f Redis commands per decision, want <= %v", perDecision, maxCommandsPerDecision)
	}
}

// countCommands sums the calls in INFO commandstats, but for the INFO
// that reads them, and returns them by command too.
func countCommands(t *testing.T, info string) (int, map[string]int) {
	t.Helper()
	total, byName := 0, map[string]int{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.Atoi(calls)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		if name == "info" {
			continue
		}
		byName[name] = n
		total += n
	}
	return total, byName
}
