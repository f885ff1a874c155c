package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPprofFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	tests := []struct {
		name string
		give []string
		env  map[string]string
		want int // status of GET /debug/pprof/cmdline on the admin port
	}{
		{name: "off by default", want: http.StatusNotFound},
		{name: "flag", give: []string{"--pprof"}, want: http.StatusOK},
		{name: "variable", env: map[string]string{"TOLLGATE_PPROF": "true"}, want: http.StatusOK},
		{name: "flag beats variable", give: []string{"--pprof=false"}, env: map[string]string{"TOLLGATE_PPROF": "true"}, want: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0", "TOLLGATE_CONFIG": dir}
			for k, v := range tt.env {
				vars[k] = v
			}
			admin := serveAdmin(t, vars, tt.give...)
			resp, err := (&http.Client{Timeout: wait}).Get("http://" + admin + "/debug/pprof/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("GET /debug/pprof/cmdline = %d, want %d", resp.StatusCode, tt.want)
			}
		})
	}
}

// serveAdmin runs `tollgate serve` with args and env until the test ends
// and returns its admin address.
func serveAdmin(t *testing.T, vars map[string]string, args ...string) string {
	t.Helper()
	stderr := &buffer{}
	addrs := make(chan Addrs, 1)
	a := &App{Stdout: io.Discard, Stderr: stderr, LookupEnv: env(vars), Listening: func(ad Addrs) { addrs <- ad }}
	ctx, stop := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() { exit <- a.Run(ctx, append([]string{"serve"}, args...)) }()
	t.Cleanup(func() {
		stop()
		<-exit
	})
	select {
	case ad := <-addrs:
		return ad.Admin.String()
	case code := <-exit:
		exit <- code
		t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
	case <-time.After(wait):
		t.Fatalf("serve never listened:\n%s", stderr.String())
	}
	return ""
}

func TestAdminDebugSurface(t *testing.T) {
	t.Parallel()
	rules, dir := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(rules, "rules.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	const token = "0123456789abcdef0123456789abcdef" // 32 bytes
	writeFile(t, good, token+"\n")
	writeFile(t, short, "x\n")
	tests := []struct {
		name       string
		give       []string
		auth       string         // Authorization header of the GETs
		want       map[string]int // path -> status, when serve must start
		wantExit   int            // when it must refuse to start
		wantStderr string
	}{
		{name: "off by default", give: []string{"--admin-addr", "127.0.0.1:0"},
			want: map[string]int{"/debug/config": 404, "/debug/pressure": 404, "/debug/pprof/": 404, "/metrics": 200, "/healthz": 200}},
		{name: "debug on loopback", give: []string{"--admin-addr", "127.0.0.1:0", "--debug"},
			want: map[string]int{"/debug/config": 200, "/debug/pressure": 200, "/debug/pprof/": 404}},
		{name: "debug on every interface", give: []string{"--admin-addr", ":0", "--debug"},
			wantExit: ExitUsage, wantStderr: "--debug and --pprof need --admin-addr on loopback"},
		{name: "pprof on every interface", give: []string{"--admin-addr", "0.0.0.0:0", "--pprof"},
			wantExit: ExitUsage, wantStderr: "--debug and --pprof need --admin-addr on loopback"},
		{name: "debug on a host name", give: []string{"--admin-addr", "tollgate.example:0", "--debug"},
			wantExit: ExitUsage, wantStderr: "is reachable from other hosts"},
		{name: "a short admin token", give: []string{"--admin-addr", "127.0.0.1:0", "--debug", "--admin-token-file", short},
			wantExit: ExitUsage, wantStderr: "the token is 1 bytes, want at least 32"},
		{name: "a short pressure token", give: []string{"--admin-addr", "127.0.0.1:0", "--pressure-token-file", short},
			wantExit: ExitUsage, wantStderr: "--pressure-token-file " + `"` + short + `": the token is 1 bytes, want at least 32`},
		{name: "token on every interface, none sent", give: []string{"--admin-addr", ":0", "--debug", "--pprof", "--admin-token-file", good},
			want: map[string]int{"/debug/config": 401, "/debug/pressure": 401, "/debug/pprof/cmdline": 401, "/metrics": 200, "/healthz": 200, "/readyz": 200}},
		{name: "token on every interface, sent", give: []string{"--admin-addr", ":0", "--debug", "--pprof", "--admin-token-file", good},
			auth: "Bearer " + token, want: map[string]int{"/debug/config": 200, "/debug/pressure": 200, "/debug/pprof/cmdline": 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stderr := &buffer{}
			addrs := make(chan Addrs, 1)
			a := &App{Stdout: io.Discard, Stderr: stderr, Listening: func(ad Addrs) { addrs <- ad }}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			exit := make(chan int, 1)
			go func() {
				exit <- a.Run(ctx, append([]string{"serve", "--config", rules, "--grpc-addr", "127.0.0.1:0"}, tt.give...))
			}()
			var ad Addrs
			select {
			case ad = <-addrs:
			case code := <-exit:
				if tt.wantExit == 0 || code != tt.wantExit || !strings.Contains(stderr.String(), tt.wantStderr) {
					t.Fatalf("serve exited with %d, want %d saying %q:\n%s", code, tt.wantExit, tt.wantStderr, stderr)
				}
				return
			case <-time.After(wait):
				t.Fatalf("serve neither listened nor exited:\n%s", stderr)
			}
			defer func() {
				stop()
				<-exit
			}()
			if tt.wantExit != 0 {
				t.Fatalf("serve listens on %v, want it to refuse with %q", ad.Admin, tt.wantStderr)
			}
			_, port, err := net.SplitHostPort(ad.Admin.String())
			if err != nil {
				t.Fatal(err)
			}
			for path, want := range tt.want {
				req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				if tt.auth != "" {
					req.Header.Set("Authorization", tt.auth)
				}
				resp, err := (&http.Client{Timeout: wait}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, want)
				}
			}
			if strings.Contains(stderr.String(), token) {
				t.Errorf("the log holds the admin token:\n%s", stderr)
			}
		})
	}
}

func TestRedactArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []string
		want []string
	}{
		{name: "no secrets", give: []string{"serve", "--pprof", "--config", "/etc/r"}, want: []string{"serve", "--pprof", "--config", "/etc/r"}},
		{name: "URL as the next argument", give: []string{"--redis-url", "redis://u:pw@r:6379/0"}, want: []string{"--redis-url", "redis://u:xxxxx@r:6379/0"}},
		{name: "URL after =", give: []string{"--redis-url=rediss://:p@ss/w@r:6379"}, want: []string{"--redis-url=rediss://:xxxxx@r:6379"}},
		{name: "single dash", give: []string{"-redis-url=redis://:pw@r"}, want: []string{"-redis-url=redis://:xxxxx@r"}},
		{name: "URL without a password", give: []string{"--redis-url=redis://u@r"}, want: []string{"--redis-url=redis://u@r"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := redactArgs(tt.give); !slices.Equal(got, tt.want) {
				t.Errorf("redactArgs(%q) = %q, want %q", tt.give, got, tt.want)
			}
		})
	}
}
