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
			kv := map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0", "TOLLGATE_LOG_LEVEL": "debug", "TOLLGATE_DEBUG": "true"}
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
			body := pollReadyz(ctx, t, ad.Admin.String(), tt.wantReady, tt.want)
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

// TestRedisPasswordSources runs serve against a redis-server with an ACL
// user whose password is given in the URL, in --redis-password-file or
// in TOLLGATE_REDIS_PASSWORD: each authenticates, and the password is in
// none of /readyz, /debug/config, /debug/pprof/cmdline or the log.
func TestRedisPasswordSources(t *testing.T) {
	t.Parallel()
	const secret = "pw-9f2c7e1a-in-no-output"
	srv := redistest.Start(t, redistest.WithArgs("--user", "tollgate", "on", ">"+secret, "~*", "&*", "+@all"))
	// Without its password a client would get in as the default user.
	if err := srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	rules := t.TempDir()
	writeFile(t, filepath.Join(rules, "rules.yaml"), goodRules)
	files := t.TempDir()
	good, wrong, empty := filepath.Join(files, "good"), filepath.Join(files, "wrong"), filepath.Join(files, "empty")
	writeFile(t, good, secret+"\n")
	writeFile(t, wrong, "not-the-password\n")
	writeFile(t, empty, " \n")
	plain := "redis://tollgate@" + srv.Addr()
	withPass := "redis://tollgate:" + secret + "@" + srv.Addr()

	tests := []struct {
		name      string
		give      []string
		env       map[string]string
		wantReady bool
		wantExit  int
		want      string // in /readyz, or in stderr when serve stops
	}{
		{name: "in the URL", give: []string{"--redis-url=" + withPass}, wantReady: true},
		{name: "from a file", give: []string{"--redis-url", plain, "--redis-password-file", good}, wantReady: true},
		{name: "from the environment", give: []string{"--redis-url", plain}, env: map[string]string{"TOLLGATE_REDIS_PASSWORD": secret}, wantReady: true},
		{name: "the URL from the environment too", env: map[string]string{"TOLLGATE_REDIS_URL": plain, "TOLLGATE_REDIS_PASSWORD": secret}, wantReady: true},
		{name: "a wrong one from a file", give: []string{"--redis-url", plain, "--redis-password-file", wrong, "--store-failure=deny"}, want: "WRONGPASS"},
		{name: "in the URL and a file", give: []string{"--redis-url", withPass, "--redis-password-file", good},
			wantExit: ExitUsage, want: "the Redis password is given twice"},
		{name: "in a file and the environment", give: []string{"--redis-url", plain, "--redis-password-file", good},
			env: map[string]string{"TOLLGATE_REDIS_PASSWORD": secret}, wantExit: ExitUsage, want: "the Redis password is given twice"},
		{name: "an empty file", give: []string{"--redis-url", plain, "--redis-password-file", empty}, wantExit: ExitUsage, want: "is empty"},
		{name: "without Redis", give: []string{"--redis-password-file", good}, wantExit: ExitUsage, want: "need --redis-url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stderr := &buffer{}
			addrs := make(chan Addrs, 1)
			kv := map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0", "TOLLGATE_LOG_LEVEL": "debug", "TOLLGATE_DEBUG": "true", "TOLLGATE_PPROF": "true"}
			for k, v := range tt.env {
				kv[k] = v
			}
			a := &App{Stdout: io.Discard, Stderr: stderr, LookupEnv: env(kv), Listening: func(ad Addrs) { addrs <- ad }}
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			exit := make(chan int, 1)
			go func() { exit <- a.Run(runCtx, append([]string{"serve", "--config", rules}, tt.give...)) }()
			defer func() {
				if out := stderr.String(); strings.Contains(out, secret) {
					t.Errorf("the output holds the password:\n%s", out)
				}
			}()
			var ad Addrs
			select {
			case ad = <-addrs:
			case code := <-exit:
				if tt.wantExit == 0 || code != tt.wantExit || !strings.Contains(stderr.String(), tt.want) {
					t.Fatalf("serve exited with %d, want %d saying %q:\n%s", code, tt.wantExit, tt.want, stderr)
				}
				return
			case <-ctx.Done():
				t.Fatal("serve neither listened nor exited")
			}
			if tt.wantExit != 0 {
				t.Fatalf("serve listens, want it to exit with %d", tt.wantExit)
			}
			pollReadyz(ctx, t, ad.Admin.String(), tt.wantReady, tt.want)
			for _, path := range []string{"/readyz", "/debug/config", "/debug/pprof/cmdline"} {
				code, body := httpGet(ctx, "http://"+ad.Admin.String()+path)
				if code != http.StatusOK && path != "/readyz" || strings.Contains(body, secret) {
					t.Errorf("%s = %d %q, want 200 without the password", path, code, body)
				}
			}
			stop()
			if code := <-exit; code != ExitOK {
				t.Errorf("serve exited with %d after its context ended:\n%s", code, stderr)
			}
		})
	}
}

// TestPprofCmdlineRedacted is the command line /debug/pprof/cmdline
// shows: serve's own arguments, with the password of --redis-url
// replaced (net/http/pprof's handler showed os.Args whole).
func TestPprofCmdlineRedacted(t *testing.T) {
	t.Parallel()
	const secret = "pw-3b1d-cmdline"
	srv := redistest.Start(t, redistest.WithArgs("--user", "tollgate", "on", ">"+secret, "~*", "&*", "+@all"))
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), goodRules)
	admin := serveAdmin(t, map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0"},
		"--config", dir, "--admin-addr", "127.0.0.1:0", "--pprof", "--redis-url=redis://tollgate:"+secret+"@"+srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code, body := httpGet(ctx, "http://"+admin+"/debug/pprof/cmdline")
	want := "tollgate\x00serve\x00--config\x00" + dir + "\x00--admin-addr\x00127.0.0.1:0\x00--pprof\x00--redis-url=redis://tollgate:xxxxx@" + srv.Addr()
	if code != http.StatusOK || body != want {
		t.Errorf("/debug/pprof/cmdline = %d %q, want %q", code, body, want)
	}
}

// pollReadyz reads admin's /readyz until it is ready (or not, as
// wantReady says) and says want, or ctx ends, and returns the last body;
// it reports an error when it never does.
func pollReadyz(ctx context.Context, t *testing.T, admin string, wantReady bool, want string) string {
	t.Helper()
	var code int
	var body string
	for ctx.Err() == nil {
		code, body = httpGet(ctx, "http://"+admin+"/readyz")
		if (code == http.StatusOK) == wantReady && strings.Contains(body, want) {
			return body
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Errorf("/readyz = %d %q, want ready %v saying %q", code, body, wantReady, want)
	return body
}
