package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buffer is a bytes.Buffer safe to read while the app writes to it.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// env is a fixed environment for LookupEnv.
func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := kv[k]
		return v, ok
	}
}

func writeFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

const goodRules = `domain: e2e
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
`

const badRules = `domain: e2e
descriptors:
  - key: tenant
    rate_limit: {unit: dya, requests_per_unit: 3}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: -1}
`

func TestCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, goodRules)
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, badRules)
	tests := []struct {
		name       string
		give       []string
		version    string
		wantCode   int
		wantStdout string
		// wantStderr lines must appear, in order, as whole lines.
		wantStderr []string
	}{
		{name: "version default", give: []string{"version"}, wantCode: ExitOK, wantStdout: "dev\n"},
		{name: "version set", give: []string{"version"}, version: "v1.2.3", wantCode: ExitOK, wantStdout: "v1.2.3\n"},
		{name: "version extra argument", give: []string{"version", "x"}, wantCode: ExitUsage},
		{name: "no command", give: nil, wantCode: ExitUsage, wantStderr: []string{"Usage: tollgate <command> [arguments]"}},
		{name: "unknown command", give: []string{"frobnicate"}, wantCode: ExitUsage, wantStderr: []string{`tollgate: unknown command "frobnicate"`}},
		{name: "help", give: []string{"help"}, wantCode: ExitOK},
		{name: "validate good file", give: []string{"validate", good}, wantCode: ExitOK, wantStdout: "ok: 1 domains\n"},
		{
			name: "validate bad file", give: []string{"validate", bad}, wantCode: ExitError,
			wantStderr: []string{
				bad + `:4: descriptors[0].rate_limit.unit: "dya" is not one of second|minute|hour|day|week|month|year`,
				bad + `:6: descriptors[1].rate_limit.requests_per_unit: -1 is negative`,
			},
		},
		{name: "validate missing path", give: []string{"validate", filepath.Join(dir, "nope.yaml")}, wantCode: ExitError},
		{name: "validate without a path", give: []string{"validate"}, wantCode: ExitUsage},
		{name: "validate two paths", give: []string{"validate", good, bad}, wantCode: ExitUsage},
		{name: "serve unknown flag", give: []string{"serve", "--nope"}, wantCode: ExitUsage},
		{name: "serve stray argument", give: []string{"serve", "extra"}, wantCode: ExitUsage},
		{name: "serve bad log format", give: []string{"serve", "--log-format", "xml"}, wantCode: ExitUsage, wantStderr: []string{`tollgate serve: --log-format "xml": want json or console`}},
		{name: "serve help", give: []string{"serve", "-h"}, wantCode: ExitOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, Version: tt.version}
			if got := a.Run(context.Background(), tt.give); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d\nstderr:\n%s", got, tt.wantCode, stderr.String())
			}
			if tt.wantStdout != "" && stdout.String() != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", stdout.String(), tt.wantStdout)
			}
			lines := strings.Split(stderr.String(), "\n")
			for _, want := range tt.wantStderr {
				i := indexOf(lines, want)
				if i < 0 {
					t.Errorf("stderr lacks the line %q:\n%s", want, stderr.String())
					continue
				}
				lines = lines[i+1:]
			}
		})
	}
}

func indexOf(lines []string, want string) int {
	for i, l := range lines {
		if l == want {
			return i
		}
	}
	return -1
}

// defaultPressure are the pressure flags' defaults.
var defaultPressure = pressureFlags{interval: time.Second, ttl: 5 * time.Second, combine: "max", maxErrorRate: 0.2, promInterval: 15 * time.Second,
	window: 10 * time.Second, maxOverload: 0.1}

// defaultRedis are the Redis flags' defaults.
var defaultRedis = redisFlags{batch: DefaultRedisBatch}

// defaultLease are the lease flags' defaults.
var defaultLease = leaseFlags{minLimit: 1000, fraction: 0.1, maxLife: time.Second}

func TestServeFlagsFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    []string
		env     map[string]string
		want    serveFlags
		wantErr bool
	}{
		{
			name: "defaults",
			want: serveFlags{config: "config", grpcAddr: ":8081", adminAddr: ":8080", logLevel: "info", logFormat: "json", redis: defaultRedis, pressure: defaultPressure, lease: defaultLease, failure: defaultFailure},
		},
		{
			name: "every flag from the environment",
			env: map[string]string{
				"TOLLGATE_CONFIG": "/etc/tollgate", "TOLLGATE_GRPC_ADDR": ":9001", "TOLLGATE_ADMIN_ADDR": ":9000",
				"TOLLGATE_REDIS_URL": "redis://r:6379", "TOLLGATE_LOG_LEVEL": "debug", "TOLLGATE_LOG_FORMAT": "console",
			},
			want: serveFlags{config: "/etc/tollgate", grpcAddr: ":9001", adminAddr: ":9000", redisURL: "redis://r:6379", logLevel: "debug", logFormat: "console", redis: defaultRedis, pressure: defaultPressure, lease: defaultLease, failure: defaultFailure},
		},
		{
			name: "a flag beats its variable",
			give: []string{"--grpc-addr", "127.0.0.1:7000", "--redis-url="},
			env:  map[string]string{"TOLLGATE_GRPC_ADDR": ":9001", "TOLLGATE_REDIS_URL": "redis://r:6379", "TOLLGATE_LOG_LEVEL": "warn"},
			want: serveFlags{config: "config", grpcAddr: "127.0.0.1:7000", adminAddr: ":8080", logLevel: "warn", logFormat: "json", redis: defaultRedis, pressure: defaultPressure, lease: defaultLease, failure: defaultFailure},
		},
		{
			name: "pressure flags from the environment",
			env: map[string]string{
				"TOLLGATE_REPLICA_ID": "pod-1", "TOLLGATE_PRESSURE_INTERVAL": "2s", "TOLLGATE_PRESSURE_TTL": "10s",
				"TOLLGATE_PRESSURE_COMBINE": "mean", "TOLLGATE_PRESSURE_CAPACITY": "64", "TOLLGATE_PRESSURE_LATENCY_SLA": "3s",
				"TOLLGATE_PRESSURE_MAX_ERROR_RATE": "0.5", "TOLLGATE_PRESSURE_ERRORS": "true",
				"TOLLGATE_PRESSURE_WINDOW": "5s", "TOLLGATE_PRESSURE_MAX_OVERLOAD_RATE": "0.3",
				"TOLLGATE_PRESSURE_PROM_URL": "http://p:9090", "TOLLGATE_PRESSURE_PROM_QUERY": "vector(0)", "TOLLGATE_PRESSURE_PROM_INTERVAL": "30s",
			},
			want: serveFlags{config: "config", grpcAddr: ":8081", adminAddr: ":8080", logLevel: "info", logFormat: "json", redis: defaultRedis, pressure: pressureFlags{
				replicaID: "pod-1", interval: 2 * time.Second, ttl: 10 * time.Second, combine: "mean", capacity: 64, latencySLA: 3 * time.Second,
				maxErrorRate: 0.5, errors: true, promURL: "http://p:9090", promQuery: "vector(0)", promInterval: 30 * time.Second,
				window: 5 * time.Second, maxOverload: 0.3,
			}, lease: defaultLease, failure: defaultFailure},
		},
		{
			name: "lease flags from the environment",
			env:  map[string]string{"TOLLGATE_LEASE_MIN_LIMIT": "50", "TOLLGATE_LEASE_FRACTION": "0.25", "TOLLGATE_LEASE_MAX_LIFE": "200ms"},
			want: serveFlags{config: "config", grpcAddr: ":8081", adminAddr: ":8080", logLevel: "info", logFormat: "json", redis: defaultRedis, pressure: defaultPressure,
				lease: leaseFlags{minLimit: 50, fraction: 0.25, maxLife: 200 * time.Millisecond}, failure: defaultFailure},
		},
		{
			name: "other variables are ignored",
			env:  map[string]string{"GRPC_ADDR": ":1", "TOLLGATE_GRPC-ADDR": ":2", "tollgate_grpc_addr": ":3"},
			want: serveFlags{config: "config", grpcAddr: ":8081", adminAddr: ":8080", logLevel: "info", logFormat: "json", redis: defaultRedis, pressure: defaultPressure, lease: defaultLease, failure: defaultFailure},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr buffer
			a := &App{Stderr: &stderr, LookupEnv: env(tt.env)}
			got, err := a.parseServeFlags(tt.give)
			if err != nil {
				t.Fatalf("parseServeFlags: %v\n%s", err, stderr.String())
			}
			if *got != tt.want {
				t.Errorf("flags = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestServeEnvErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, badRules)
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, goodRules)
	tests := []struct {
		name       string
		env        map[string]string
		wantCode   int
		wantStderr []string // substrings
	}{
		{
			name:       "bad log level from the environment",
			env:        map[string]string{"TOLLGATE_LOG_LEVEL": "loud"},
			wantCode:   ExitUsage,
			wantStderr: []string{`--log-level "loud"`},
		},
		{
			name:       "initial rules fail: every problem is reported",
			env:        map[string]string{"TOLLGATE_CONFIG": bad},
			wantCode:   ExitError,
			wantStderr: []string{bad + `:4: descriptors[0].rate_limit.unit`, bad + `:6: descriptors[1].rate_limit.requests_per_unit`},
		},
		{
			name:       "missing rules",
			env:        map[string]string{"TOLLGATE_CONFIG": filepath.Join(dir, "none")},
			wantCode:   ExitError,
			wantStderr: []string{"none"},
		},
		{
			name:       "bad redis URL, password not echoed",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_REDIS_URL": "http://user:hunter2@r:6379"},
			wantCode:   ExitError,
			wantStderr: []string{"--redis-url"},
		},
		{
			name:       "bad pressure combine",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_PRESSURE_COMBINE": "median"},
			wantCode:   ExitUsage,
			wantStderr: []string{`--pressure-combine: combine: "median" is not one of max|mean`},
		},
		{
			name:       "pressure ttl under the interval",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_PRESSURE_TTL": "500ms"},
			wantCode:   ExitUsage,
			wantStderr: []string{"--pressure-ttl 500ms is under --pressure-interval 1s"},
		},
		{
			name:       "pressure window too short",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_PRESSURE_WINDOW": "5ms"},
			wantCode:   ExitUsage,
			wantStderr: []string{"--pressure-window: 5ms is under 10ms"},
		},
		{
			name:       "overload rate out of range",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_PRESSURE_MAX_OVERLOAD_RATE": "0"},
			wantCode:   ExitUsage,
			wantStderr: []string{"--pressure-max-overload-rate: 0 is not in (0,1]"},
		},
		{
			name:       "prom url without a query",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_PRESSURE_PROM_URL": "http://p:9090"},
			wantCode:   ExitUsage,
			wantStderr: []string{"--pressure-prom-url and --pressure-prom-query must be given together"},
		},
		{
			name:       "missing pressure token file",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_PRESSURE_TOKEN_FILE": filepath.Join(dir, "no-token")},
			wantCode:   ExitUsage,
			wantStderr: []string{"--pressure-token-file"},
		},
		{
			name:       "grpc address invalid",
			env:        map[string]string{"TOLLGATE_CONFIG": good, "TOLLGATE_GRPC_ADDR": "256.0.0.1:0"},
			wantCode:   ExitError,
			wantStderr: []string{"listen --grpc-addr"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, LookupEnv: env(tt.env)}
			if got := a.Run(context.Background(), []string{"serve", "--admin-addr", "127.0.0.1:0"}); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d\nstderr:\n%s", got, tt.wantCode, stderr.String())
			}
			for _, want := range tt.wantStderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
			if strings.Contains(stderr.String(), "hunter2") {
				t.Errorf("stderr shows the Redis password:\n%s", stderr.String())
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ give, want string }{
		{"", ""},
		{"redis://r:6379/0", "redis://r:6379/0"},
		{"redis://user@r:6379", "redis://user@r:6379"},
		{"redis://:pw@r:6379", "redis://:xxxxx@r:6379"},
		{"rediss://u:p/w?x@y@r:6379/1?dial_timeout=1s", "rediss://u:xxxxx@r:6379/1?dial_timeout=1s"},
		{"u:pw@r", "xxxxx"},
	}
	for _, tt := range tests {
		if got := redactURL(tt.give); got != tt.want {
			t.Errorf("redactURL(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}
