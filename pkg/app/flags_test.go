package app

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
)

// TestBadFlagIsOneLine: a mistake on the command line is one line that
// names the flag, and a pointer to --help, not the whole usage; -h and
// --help still print the usage.
func TestBadFlagIsOneLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []string
		want string // the first line of stderr
	}{
		{name: "serve unknown flag", give: []string{"serve", "--nope"}, want: "tollgate serve: flag provided but not defined: -nope"},
		{name: "serve missing value", give: []string{"serve", "--config"}, want: "tollgate serve: flag needs an argument: -config"},
		{name: "explain unknown flag", give: []string{"explain", "--nope"}, want: "tollgate explain: flag provided but not defined: -nope"},
		{name: "health unknown flag", give: []string{"health", "-x"}, want: "tollgate health: flag provided but not defined: -x"},
		{name: "validate unknown flag", give: []string{"validate", "--nope", "rules.yaml"}, want: "tollgate validate: flag provided but not defined: -nope"},
		{name: "health bad timeout", give: []string{"health", "--timeout", "2"}, want: `tollgate health: --timeout "2": a duration needs a unit: 15ms, 2s, 1m`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, LookupEnv: env(nil)}
			if got := a.Run(context.Background(), tt.give); got != ExitUsage {
				t.Errorf("exit code = %d, want %d", got, ExitUsage)
			}
			cmd := tt.give[0]
			want := tt.want + "\nRun 'tollgate " + cmd + " --help' for its usage.\n"
			if stderr.String() != want {
				t.Errorf("stderr:\n%s\nwant:\n%s", stderr.String(), want)
			}
		})
	}
}

func TestHelpPrintsUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		give     []string
		want     string
		minLines int
	}{
		{give: []string{"serve", "-h"}, want: "Usage: tollgate serve [flags]", minLines: 50},
		{give: []string{"serve", "--help"}, want: "Usage: tollgate serve [flags]", minLines: 50},
		{give: []string{"serve", "--grpc-addr", ":1", "-help"}, want: "Usage: tollgate serve [flags]", minLines: 50},
		{give: []string{"explain", "--help"}, want: "Usage: tollgate explain", minLines: 10},
		{give: []string{"health", "--help"}, want: "Usage: tollgate health [flags]", minLines: 6},
		{give: []string{"validate", "--help"}, want: "Usage: tollgate validate", minLines: 3},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.give, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, LookupEnv: env(nil)}
			if got := a.Run(context.Background(), tt.give); got != ExitOK {
				t.Errorf("exit code = %d, want %d", got, ExitOK)
			}
			out := stderr.String()
			if !strings.HasPrefix(out, tt.want) || strings.Count(out, "\n") < tt.minLines {
				t.Errorf("stderr is not the whole usage (want %q first, %d lines or more):\n%s", tt.want, tt.minLines, out)
			}
			if strings.Contains(out, "--help' for its usage") {
				t.Errorf("help printed the pointer to itself:\n%s", out)
			}
		})
	}
}

// TestFlagValueRefused: a value a flag or its variable refuses is
// reported with the flag (and the variable), what was given, and the form
// the flag takes, instead of the standard library's "parse error".
func TestFlagValueRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []string
		env  map[string]string
		want string
	}{
		{
			name: "duration without a unit", give: []string{"--store-timeout", "15"},
			want: `tollgate serve: --store-timeout "15": a duration needs a unit: 15ms, 2s, 1m`,
		},
		{
			name: "duration without a unit, from the environment", env: map[string]string{"TOLLGATE_STORE_TIMEOUT": "15"},
			want: `tollgate serve: TOLLGATE_STORE_TIMEOUT="15" (--store-timeout): a duration needs a unit: 15ms, 2s, 1m`,
		},
		{
			name: "duration not a number", give: []string{"--pressure-interval=soon"},
			want: `tollgate serve: --pressure-interval "soon": want a duration: a number and a unit (ns, us, ms, s, m, h), such as 15ms, 2s, 1m or 1h30m`,
		},
		{
			name: "duration with a bad unit, from the environment", env: map[string]string{"TOLLGATE_LEASE_MAX_LIFE": "1sec"},
			want: `tollgate serve: TOLLGATE_LEASE_MAX_LIFE="1sec" (--lease-max-life): want a duration: a number and a unit (ns, us, ms, s, m, h), such as 15ms, 2s, 1m or 1h30m`,
		},
		{
			name: "int", give: []string{"--pressure-capacity", "1k"},
			want: `tollgate serve: --pressure-capacity "1k": want a whole number, such as 100`,
		},
		{
			name: "int out of range", give: []string{"--pressure-capacity", "99999999999999999999"},
			want: `tollgate serve: --pressure-capacity "99999999999999999999": out of range`,
		},
		{
			name: "unsigned", give: []string{"--lease-min-limit", "-1"},
			want: `tollgate serve: --lease-min-limit "-1": want a whole number, 0 or more, such as 100`,
		},
		{
			name: "float, from the environment", env: map[string]string{"TOLLGATE_LEASE_FRACTION": "10%"},
			want: `tollgate serve: TOLLGATE_LEASE_FRACTION="10%" (--lease-fraction): want a number, such as 0.5`,
		},
		{
			name: "bool", give: []string{"--debug=yes please"},
			want: `tollgate serve: --debug "yes please": want true or false`,
		},
		{
			name: "bool from the environment", env: map[string]string{"TOLLGATE_PPROF": "on"},
			want: `tollgate serve: TOLLGATE_PPROF="on" (--pprof): want true or false`,
		},
		{
			name: "tollgate's own int", give: []string{"--redis-batch", "many"},
			want: `tollgate serve: --redis-batch "many": want a whole number, such as 100`,
		},
		{
			name: "tollgate's own int from the environment", env: map[string]string{"TOLLGATE_MAX_CONNECTIONS": "lots"},
			want: `tollgate serve: TOLLGATE_MAX_CONNECTIONS="lots" (--max-connections): want a whole number, such as 100`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, LookupEnv: env(tt.env)}
			if got := a.Run(context.Background(), append([]string{"serve"}, tt.give...)); got != ExitUsage {
				t.Errorf("exit code = %d, want %d", got, ExitUsage)
			}
			if first, _, _ := strings.Cut(stderr.String(), "\n"); first != tt.want {
				t.Errorf("stderr:\n%s\nwant first line:\n%s", stderr.String(), tt.want)
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	for _, give := range []string{"version", "--version", "-version", "-v"} {
		t.Run(give, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr buffer
			a := &App{Stdout: &stdout, Stderr: &stderr, Version: "v1.2.3"}
			if got := a.Run(context.Background(), []string{give}); got != ExitOK || stdout.String() != "v1.2.3\n" {
				t.Errorf("tollgate %s: exit %d, stdout %q, stderr %q; want 0 and \"v1.2.3\\n\"", give, got, stdout.String(), stderr.String())
			}
		})
	}
}

// TestServeListensWhereAsked: both ports move by flag or by variable, and
// the flag wins (a variable that cannot be listened on is overruled).
func TestServeListensWhereAsked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []string
		env  map[string]string
	}{
		{
			name: "gRPC by flag, admin by variable",
			give: []string{"--grpc-addr", "127.0.0.1:0"},
			env:  map[string]string{"TOLLGATE_GRPC_ADDR": "256.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "127.0.0.1:0"},
		},
		{
			name: "admin by flag, gRPC by variable",
			give: []string{"--admin-addr", "127.0.0.1:0"},
			env:  map[string]string{"TOLLGATE_GRPC_ADDR": "127.0.0.1:0", "TOLLGATE_ADMIN_ADDR": "256.0.0.1:0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			stderr := &buffer{}
			addrs := make(chan Addrs, 1)
			a := &App{Stdout: io.Discard, Stderr: stderr, Listening: func(ad Addrs) { addrs <- ad }, LookupEnv: env(tt.env)}
			runCtx, stop := context.WithCancel(context.Background())
			exit := make(chan int, 1)
			go func() { exit <- a.Run(runCtx, append([]string{"serve", "--config", "../../config"}, tt.give...)) }()
			defer func() {
				stop()
				<-exit
			}()
			select {
			case ad := <-addrs:
				for name, addr := range map[string]net.Addr{"gRPC": ad.GRPC, "admin": ad.Admin} {
					if tcp, ok := addr.(*net.TCPAddr); !ok || !tcp.IP.Equal(net.IPv4(127, 0, 0, 1)) || tcp.Port == 0 {
						t.Errorf("%s listens on %v, want 127.0.0.1 and a port", name, addr)
					}
				}
			case code := <-exit:
				exit <- code
				t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
			case <-ctx.Done():
				t.Fatalf("serve never listened:\n%s", stderr.String())
			}
		})
	}
}
