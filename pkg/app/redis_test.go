package app

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestServeRedisTLS runs serve against a TLS redis-server that requires a
// client certificate and has an ACL user: the right files and password
// make it ready; a wrong password or CA leave it unready, with
// --store-failure=deny, with a reason that names the problem; settings that cannot work stop it. The
// password is in none of its output.
func TestServeRedisTLS(t *testing.T) {
	t.Parallel()
	const secret = "S3cret-pw/x"
	certs := redistest.NewCerts(t)
	other := redistest.NewCerts(t)
	srv := redistest.Start(t, redistest.WithTLS(certs, redistest.ClientCertRequired),
		redistest.WithArgs("--user", "tollgate", "on", ">"+secret, "~tg:*", "+@all"))
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), goodRules)
	good := "rediss://tollgate:" + url.PathEscape(secret) + "@" + srv.Addr()
	files := []string{"--redis-tls-cert", certs.ClientCertFile, "--redis-tls-key", certs.ClientKeyFile}

	tests := []struct {
		name      string
		give      []string
		env       map[string]string
		wantReady bool
		wantExit  int    // when serve must stop by itself
		want      string // in /readyz's body, or in stderr when it stops
	}{
		{name: "ready", give: append([]string{"--redis-url", good}, files...),
			env: map[string]string{"TOLLGATE_REDIS_TLS_CA": certs.CAFile}, wantReady: true},
		{name: "server name", give: append([]string{"--redis-url", good, "--redis-tls-ca", certs.CAFile, "--redis-tls-server-name", "localhost"}, files...),
			wantReady: true},
		{name: "wrong password", give: append([]string{"--redis-url", strings.Replace(good, "S3cret", "Wrong", 1), "--redis-tls-ca", certs.CAFile, "--store-failure=deny"}, files...),
			want: "WRONGPASS"},
		{name: "unknown CA", give: append([]string{"--redis-url", good, "--redis-tls-ca", other.CAFile, "--store-failure=deny"}, files...),
			want: "certificate signed by unknown authority"},
		{name: "missing CA file", give: []string{"--redis-url", good, "--redis-tls-ca", filepath.Join(dir, "nope.pem")},
			wantExit: ExitError, want: "TLS CA file"},
		{name: "CA on a plain URL", give: []string{"--redis-url", strings.Replace(good, "rediss", "redis", 1), "--redis-tls-ca", certs.CAFile},
			wantExit: ExitError, want: "need a rediss://"},
		{name: "cert without key", give: []string{"--redis-url", good, "--redis-tls-cert", certs.ClientCertFile},
			wantExit: ExitUsage, want: "--redis-tls-cert and --redis-tls-key must be given together"},
		{name: "TLS without Redis", give: []string{"--redis-tls-ca", certs.CAFile},
			wantExit: ExitUsage, want: "need --redis-url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stderr := &buffer{}
			addrs := make(chan Addrs, 1)
			kv := map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0", "TOLLGATE_LOG_LEVEL": "debug"}
			for k, v := range tt.env {
				kv[k] = v
			}
			a := &App{Stdout: io.Discard, Stderr: stderr, LookupEnv: env(kv), Listening: func(ad Addrs) { addrs <- ad }}
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			exit := make(chan int, 1)
			go func() { exit <- a.Run(runCtx, append([]string{"serve", "--config", dir}, tt.give...)) }()
			defer func() {
				if out := stderr.String(); strings.Contains(out, secret) || strings.Contains(out, url.PathEscape(secret)) {
					t.Errorf("the output holds the password:\n%s", out)
				}
			}()

			var ad Addrs
			select {
			case ad = <-addrs:
			case code := <-exit:
				if tt.wantExit == 0 || code != tt.wantExit {
					t.Fatalf("serve exited with %d, want %d:\n%s", code, tt.wantExit, stderr)
				}
				if !strings.Contains(stderr.String(), tt.want) {
					t.Errorf("stderr does not say %q:\n%s", tt.want, stderr)
				}
				return
			case <-ctx.Done():
				t.Fatal("serve neither listened nor exited")
			}
			if tt.wantExit != 0 {
				t.Fatalf("serve listens, want it to exit with %d", tt.wantExit)
			}
			var code int
			var body string
			for ctx.Err() == nil {
				code, body = httpGet(ctx, "http://"+ad.Admin.String()+"/readyz")
				if (code == http.StatusOK) == tt.wantReady && strings.Contains(body, tt.want) {
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
			if (code == http.StatusOK) != tt.wantReady || !strings.Contains(body, tt.want) {
				t.Errorf("/readyz = %d %q, want ready %v saying %q", code, body, tt.wantReady, tt.want)
			}
			if strings.Contains(body, secret) {
				t.Errorf("/readyz %q holds the password", body)
			}
			if _, cfg := httpGet(ctx, "http://"+ad.Admin.String()+"/debug/config"); strings.Contains(cfg, secret) || !strings.Contains(cfg, "xxxxx") {
				t.Errorf("/debug/config does not hide the password: %s", cfg)
			}
			stop()
			if code := <-exit; code != ExitOK {
				t.Errorf("serve exited with %d after its context ended:\n%s", code, stderr)
			}
		})
	}
}

func httpGet(ctx context.Context, u string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
