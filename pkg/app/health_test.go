package app

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHealth runs tollgate health against an admin port stand-in that
// answers as serve's does.
func TestHealth(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready: store ping: connection refused\nstore: redis", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("GET /slow", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	closed := closedPort(t)

	tests := []struct {
		name       string
		give       []string
		env        map[string]string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "not ready", give: []string{"--admin-addr", ":" + port}, wantCode: ExitError,
			wantStdout: "http://127.0.0.1:" + port + "/readyz: 503 not ready: store ping: connection refused\n"},
		{name: "healthz", give: []string{"--admin-addr", "0.0.0.0:" + port, "--path", "/healthz"}, wantCode: ExitOK,
			wantStdout: "http://127.0.0.1:" + port + "/healthz: 200 ok\n"},
		{name: "admin address from serve's variable", give: []string{"--path", "/healthz"},
			env: map[string]string{"TOLLGATE_ADMIN_ADDR": "127.0.0.1:" + port}, wantCode: ExitOK,
			wantStdout: "http://127.0.0.1:" + port + "/healthz: 200 ok\n"},
		{name: "no such path", give: []string{"--admin-addr", ":" + port, "--path", "/nope"}, wantCode: ExitError},
		{name: "nothing listening", give: []string{"--admin-addr", closed}, wantCode: ExitError, wantStderr: "connection refused"},
		{name: "timeout", give: []string{"--admin-addr", ":" + port, "--path", "/slow", "--timeout", "50ms"}, wantCode: ExitError,
			wantStderr: "context deadline exceeded"},
		{name: "address without a port", give: []string{"--admin-addr", "8080"}, wantCode: ExitUsage, wantStderr: `--admin-addr "8080"`},
		{name: "relative path", give: []string{"--path", "readyz"}, wantCode: ExitUsage, wantStderr: `--path "readyz"`},
		{name: "stray argument", give: []string{"now"}, wantCode: ExitUsage},
		{name: "help", give: []string{"-h"}, wantCode: ExitOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, LookupEnv: func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }}
			if got := a.Run(context.Background(), append([]string{"health"}, tt.give...)); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d\nstdout: %s\nstderr: %s", got, tt.wantCode, stdout.String(), stderr.String())
			}
			if tt.wantStdout != "" && stdout.String() != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestHealthURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, give, want string
	}{
		{name: "no host", give: ":8080", want: "http://127.0.0.1:8080/readyz"},
		{name: "ipv4 any", give: "0.0.0.0:8080", want: "http://127.0.0.1:8080/readyz"},
		{name: "ipv6 any", give: "[::]:8080", want: "http://[::1]:8080/readyz"},
		{name: "a host", give: "10.0.0.7:9090", want: "http://10.0.0.7:9090/readyz"},
		{name: "a name", give: "localhost:8080", want: "http://localhost:8080/readyz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := healthURL(tt.give, "/readyz")
			if err != nil || got != tt.want {
				t.Errorf("healthURL(%q) = %q, %v; want %q", tt.give, got, err, tt.want)
			}
		})
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
