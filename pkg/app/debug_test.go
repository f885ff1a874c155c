package app

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
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
