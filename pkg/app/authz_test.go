package app

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const (
	authzRules = `domain: e2e
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 1000, name: tokens}
`
	authzSettings = `domain: e2e
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
estimate: {default_max_tokens: 400}
usage_header: x-usage-total-tokens
`
	authzKey   = "sk-e2e-key-0123456789"
	authzKeys  = "keys:\n  - {key: \"" + authzKey + "\", tenant: acme}\n"
	anotherKey = "sk-e2e-another-0123456789"
)

// startServe runs `tollgate serve` with args and env until the test ends
// and returns a connection to its gRPC port, or the exit code when it
// stops before listening.
func startServe(ctx context.Context, t *testing.T, stderr *buffer, vars map[string]string, args ...string) (*grpc.ClientConn, int) {
	t.Helper()
	ad, code := serveAddrs(ctx, t, stderr, vars, args...)
	if ad.GRPC == nil {
		return nil, code
	}
	conn, err := grpc.NewClient("passthrough:///"+ad.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, 0
}

// serveAddrs runs `tollgate serve` in-process with args and env (vars;
// nil for none), on ports of its choosing, until the test ends, and
// returns the addresses it listens on, or the exit code when it stops
// before listening.
func serveAddrs(ctx context.Context, t *testing.T, stderr *buffer, vars map[string]string, args ...string) (Addrs, int) {
	t.Helper()
	if vars == nil {
		vars = map[string]string{}
	}
	vars["TOLLGATE_GRPC_ADDR"] = "127.0.0.1:0"
	vars["TOLLGATE_ADMIN_ADDR"] = "127.0.0.1:0"
	addrs := make(chan Addrs, 1)
	a := &App{Stdout: io.Discard, Stderr: stderr, LookupEnv: env(vars), Listening: func(ad Addrs) { addrs <- ad }}
	runCtx, stop := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() { exit <- a.Run(runCtx, append([]string{"serve"}, args...)) }()
	t.Cleanup(func() {
		stop()
		<-exit
	})
	select {
	case ad := <-addrs:
		return ad, 0
	case code := <-exit:
		exit <- code
		return Addrs{}, code
	case <-ctx.Done():
		t.Fatalf("serve never listened:\n%s", stderr.String())
		return Addrs{}, 0
	}
}

func authzCheck(key string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/v1/chat/completions",
			Headers: map[string]string{"authorization": "Bearer " + key}, Body: `{"model":"m","prompt":"hi"}`},
	}}}
}

func TestServeAuthz(t *testing.T) {
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
	writeFile(t, keysPath, authzKeys)

	stderr := &buffer{}
	conn, code := startServe(ctx, t, stderr, map[string]string{"TOLLGATE_AUTHZ_CONFIG": authzPath, "TOLLGATE_LOG_LEVEL": "debug"}, "--config", dir)
	if conn == nil {
		t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
	}
	e := &e2e{t: t, ctx: ctx, stderr: stderr}
	client := authv3.NewAuthorizationClient(conn)

	// 400 tokens each (the default max_tokens, and a 2-character prompt):
	// two fit the hour's 1,000, the third does not.
	for i := range 2 {
		resp, err := client.Check(ctx, authzCheck(authzKey))
		if err != nil || resp.GetOkResponse() == nil {
			t.Fatalf("Check %d = %v, %v", i, resp, err)
		}
	}
	resp, err := client.Check(ctx, authzCheck(authzKey))
	if err != nil || resp.GetDeniedResponse().GetStatus().GetCode() != 429 {
		t.Fatalf("third Check = %v, %v; want 429", resp, err)
	}
	if resp, err := client.Check(ctx, authzCheck(anotherKey)); err != nil || resp.GetDeniedResponse().GetStatus().GetCode() != 401 {
		t.Fatalf("Check with an unknown key = %v, %v; want 401", resp, err)
	}

	// The access log service is on the same port.
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("StreamAccessLogs: %v", err)
	}

	// A key added to the keys file is accepted without a restart.
	edits := 0
	e.poll("the new key", func() bool {
		rewrite(t, keysPath, authzKeys+"  - {key: \""+anotherKey+"\", tenant: other}\n", &edits)
		resp, err := client.Check(ctx, authzCheck(anotherKey))
		return err == nil && resp.GetOkResponse() != nil
	})
	// A bad config is reported and changes nothing.
	rewrite(t, authzPath, "domain: e2e\nkeys_file: keys.yaml\ndescriptorz: []\n", &edits)
	e.poll("the reload failure", func() bool {
		return strings.Contains(stderr.String(), "authz config reload rejected")
	})
	if resp, err := client.Check(ctx, authzCheck(anotherKey)); err != nil || resp.GetOkResponse() == nil {
		t.Errorf("Check after a bad reload = %v, %v; want the previous settings", resp, err)
	}
	for _, k := range []string{authzKey, anotherKey} {
		if strings.Contains(stderr.String(), k) {
			t.Errorf("the log holds a key:\n%s", stderr.String())
		}
	}
}

func TestServeWithoutAuthzConfig(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), authzRules)
	stderr := &buffer{}
	conn, code := startServe(ctx, t, stderr, map[string]string{}, "--config", dir)
	if conn == nil {
		t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
	}
	if _, err := authv3.NewAuthorizationClient(conn).Check(ctx, authzCheck(authzKey)); status.Code(err) != codes.Unimplemented {
		t.Errorf("Check without --authz-config = %v, want Unimplemented", err)
	}
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Errorf("StreamAccessLogs without --authz-config: %v", err)
	}
}

func TestServeBadAuthzConfig(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), authzRules)
	authzPath := filepath.Join(dir, "authz", "authz.yaml")
	if err := os.Mkdir(filepath.Dir(authzPath), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, authzPath, "domain: e2e\nkeys_file: keys.yaml\ndescriptors: [[{key: t, from: nobody}]]\n")
	stderr := &buffer{}
	conn, code := startServe(ctx, t, stderr, map[string]string{}, "--config", dir, "--authz-config", authzPath)
	if conn != nil || code != ExitError {
		t.Fatalf("serve with a bad authz config: exit %d, want %d", code, ExitError)
	}
	if want := authzPath + `:3: descriptors[0][0].from: \"nobody\" is not one of`; !strings.Contains(stderr.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, stderr.String())
	}
}
