package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestMakeRunPassesArgs: `make run ARGS=...` hands ARGS to tollgate serve,
// and `make help` says so.
func TestMakeRunPassesArgs(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	out, err := exec.Command("make", "-s", "-n", "-C", "../..", "run", "ARGS=--grpc-addr :9081 --log-level debug").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	cmd := string(out)[strings.LastIndex(string(out), "bin/tollgate serve"):]
	if !strings.HasSuffix(strings.TrimSpace(cmd), "--grpc-addr :9081 --log-level debug") {
		t.Errorf("make run runs:\n%s\nwant ARGS at the end", cmd)
	}
	help, err := exec.Command("make", "-s", "-C", "../..", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, help)
	}
	for _, line := range strings.Split(string(help), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "run ") {
			if !strings.Contains(line, "ARGS=") {
				t.Errorf("make help does not say run takes ARGS: %q", line)
			}
			return
		}
	}
	t.Errorf("make help lists no run:\n%s", help)
}
