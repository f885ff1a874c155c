package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestServeKeysReload checks through a real Check over gRPC that a keys
// file with a bad entry applies the rest, so a key it removes stops
// working; that a keys file that cannot be parsed keeps the keys in
// force; and that the metrics, the log and /readyz say which happened,
// without a key, with the replica ready throughout.
func TestServeKeysReload(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), authzRules)
	authzDir := filepath.Join(dir, "authz")
	if err := os.Mkdir(authzDir, 0o755); err != nil {
		t.Fatal(err)
	}
	authzPath := filepath.Join(authzDir, "authz.yaml")
	keysPath := filepath.Join(authzDir, "keys.yaml")
	writeFile(t, authzPath, authzSettings)
	bothKeys := authzKeys + "  - {key: \"" + anotherKey + "\", tenant: other}\n"
	writeFile(t, keysPath, bothKeys)

	stderr := &buffer{}
	addrs := make(chan Addrs, 1)
	a := &App{Stdout: io.Discard, Stderr: stderr, Listening: func(ad Addrs) { addrs <- ad }, LookupEnv: env(map[string]string{
		"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0", "TOLLGATE_AUTHZ_CONFIG": authzPath,
	})}
	runCtx, stop := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() { exit <- a.Run(runCtx, []string{"serve", "--config", dir}) }()
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
	client := authv3.NewAuthorizationClient(conn)
	// code is the HTTP status Check gives key: 200 admitted, else the
	// denial's (401 for a key refused).
	code := func(key string) int {
		t.Helper()
		resp, err := client.Check(ctx, authzCheck(key))
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if resp.GetOkResponse() != nil {
			return http.StatusOK
		}
		return int(resp.GetDeniedResponse().GetStatus().GetCode())
	}
	// metric is the value of one series, as /metrics prints it.
	metric := func(series string) string {
		t.Helper()
		_, body := e.get("/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				return v
			}
		}
		return "absent"
	}
	// ready is /readyz's body, failing the test unless it is 200.
	ready := func() string {
		t.Helper()
		status, body := e.get("/readyz")
		if status != http.StatusOK {
			t.Errorf("/readyz = %d %q, want 200", status, body)
		}
		for _, k := range []string{authzKey, anotherKey} {
			if strings.Contains(body, k) {
				t.Errorf("/readyz shows a key: %q", body)
			}
		}
		return body
	}
	if got := code(anotherKey); got != http.StatusOK {
		t.Fatalf("Check with the second key = %d, want 200", got)
	}
	if body := ready(); !strings.Contains(body, "authz keys: 2 in force since ") {
		t.Errorf("/readyz at start = %q, want the keys in force", body)
	}

	// The second key removed, and a bad entry added: the removal applies.
	edits := 0
	rewrite(t, keysPath, authzKeys+"  - {key: short, tenant: other}\n", &edits)
	// Polled by the metrics, not by Check: each admitted Check spends 400
	// of the tenant's 1,000 tokens. Either result ends the wait, so that
	// a reload refused whole fails on the Check below.
	e.poll("the reload", func() bool {
		return metric(`tollgate_authz_config_reloads_total{result="partial"}`) == "1" ||
			metric(`tollgate_authz_config_reloads_total{result="failure"}`) == "1"
	})
	if got := code(anotherKey); got != http.StatusUnauthorized {
		t.Errorf("Check with the removed key = %d, want 401", got)
	}
	if got := code(authzKey); got != http.StatusOK {
		t.Errorf("Check with the key kept = %d, want 200", got)
	}
	for series, want := range map[string]string{
		`tollgate_authz_config_reloads_total{result="partial"}`: "1",
		`tollgate_authz_config_reloads_total{result="failure"}`: "0",
		`tollgate_authz_keys_skipped_entries`:                   "1",
	} {
		if got := metric(series); got != want {
			t.Errorf("%s = %s, want %s", series, got, want)
		}
	}
	if body := ready(); !strings.Contains(body, "authz keys: 1 in force since ") ||
		!strings.Contains(body, "keys file entries left out, their keys refused: 1 (1 problem, at "+keysPath+":4, see the log)") {
		t.Errorf("/readyz after a partial reload = %q", body)
	}
	if log := stderr.String(); !strings.Contains(log, "keys file entry left out") || !strings.Contains(log, keysPath+":4: keys[1].key: is shorter than 16 bytes") {
		t.Errorf("the log does not say which entry was left out:\n%s", log)
	}

	// A keys file that is not YAML keeps the keys in force.
	rewrite(t, keysPath, "keys: [\n", &edits)
	e.poll("the failed reload in /readyz", func() bool { return strings.Contains(ready(), "\nauthz reload failed at ") })
	if body := ready(); !strings.Contains(body, "the settings in force keep serving: 1 problem, at "+keysPath+":2, see the log") {
		t.Errorf("/readyz after a failed reload = %q", body)
	}
	if got := code(authzKey); got != http.StatusOK {
		t.Errorf("Check after a failed reload = %d, want the keys in force", got)
	}
	if got := metric(`tollgate_authz_config_reloads_total{result="failure"}`); got != "1" {
		t.Errorf("failed reloads = %s, want 1", got)
	}

	// A good file clears both.
	rewrite(t, keysPath, bothKeys, &edits)
	e.poll("the good reload in /readyz", func() bool { return strings.Contains(ready(), "authz keys: 2 in force") })
	if body := ready(); strings.Contains(body, "left out") || strings.Contains(body, "failed") {
		t.Errorf("/readyz after a good reload = %q", body)
	}
	if got := code(anotherKey); got != http.StatusOK {
		t.Errorf("Check with the key added back = %d, want 200", got)
	}
	if got := metric("tollgate_authz_keys_skipped_entries"); got != "0" {
		t.Errorf("skipped entries after a good reload = %s, want 0", got)
	}
	for _, k := range []string{authzKey, anotherKey} {
		if strings.Contains(stderr.String(), k) {
			t.Errorf("the log holds a key:\n%s", stderr.String())
		}
	}
}
