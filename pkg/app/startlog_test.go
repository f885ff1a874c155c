package app

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// watchingRules is the line watchRules logs once the rules watch runs.
const watchingRules = `"msg":"watching rules"`

// watching waits for the rules watch to run: from then on a rewrite of
// the rules is a reload.
func (e *e2e) watching() {
	e.t.Helper()
	e.poll("the rules watch", func() bool { return strings.Contains(e.stderr.String(), watchingRules) })
}

// TestServeStartIsNoReload: the watches load their files once as they
// start; the log and the reload counter must not call that a reload. A
// rewrite afterwards is one.
func TestServeStartIsNoReload(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	writeFile(t, rulesPath, goodRules)
	keyFile := filepath.Join(dir, "ticket.keys")
	writeFile(t, keyFile, keyLine('a')+"\n")

	stderr := &buffer{}
	ad, code := serveAddrs(ctx, t, stderr, nil, "--config", rulesPath, "--ticket-key-file", keyFile)
	if ad.GRPC == nil {
		t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
	}
	e := &e2e{t: t, ctx: ctx, stderr: stderr, addrs: ad}
	// The rules watch reports its first load either way: as a reload
	// without the fix, as "watching rules" with it.
	e.poll("the rules watch's first load", func() bool {
		return strings.Contains(stderr.String(), watchingRules) || strings.Contains(stderr.String(), "reloaded")
	})
	if strings.Contains(stderr.String(), "reloaded") {
		t.Fatalf("the start logs a reload:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"rules loaded"`) {
		t.Errorf("the start does not log the rules loaded:\n%s", stderr.String())
	}
	if _, metrics := e.get("/metrics"); !strings.Contains(metrics, `tollgate_config_reloads_total{result="success"} 0`) {
		t.Errorf("the start counts as a reload:\n%s", metrics)
	}

	edits := 0
	rewrite(t, rulesPath, goodRules, &edits)
	e.poll("the reload", func() bool { return strings.Contains(stderr.String(), `"msg":"rules reloaded"`) })
	if n := strings.Count(stderr.String(), `"msg":"rules reloaded"`); n != 1 {
		t.Errorf("%d rules reloaded lines after one rewrite, want 1:\n%s", n, stderr.String())
	}
	if _, metrics := e.get("/metrics"); !strings.Contains(metrics, `tollgate_config_reloads_total{result="success"} 1`) {
		t.Errorf("one rewrite is not one reload:\n%s", metrics)
	}
}
