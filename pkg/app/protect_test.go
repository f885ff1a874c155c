package app

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/server"
)

// TestProtectFlagsHelpShowsDefaults: the flags' zero values mean "the
// server's default", so the help must say what that is.
func TestProtectFlagsHelpShowsDefaults(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr, LookupEnv: env(nil)}
	_, _ = a.parseServeFlags([]string{"-h"})
	for _, want := range []string{
		fmt.Sprintf("(default %d)", server.DefaultMaxInFlight),
		fmt.Sprintf("(default %d)", server.DefaultMaxConnections),
		fmt.Sprintf("(default %d)", server.DefaultMaxConcurrentStreams),
		"-max-in-flight", "-max-connections", "-max-concurrent-streams",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("serve -h lacks %q", want)
		}
	}
}

func TestProtectFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		give          []string
		env           map[string]string
		wantInFlight  int    // server.Config.MaxInFlight: 0 its default
		wantConns     int    // server.Config.MaxConnections: 0 its default
		wantStreams   uint32 // server.Config.MaxConcurrentStreams: 0 its default
		wantUsageText string // non-empty: a usage error containing it
	}{
		{name: "defaults"},
		{name: "flags", give: []string{"--max-in-flight=10", "--max-connections=20", "--max-concurrent-streams=30"}, wantInFlight: 10, wantConns: 20, wantStreams: 30},
		{name: "env", env: map[string]string{"TOLLGATE_MAX_IN_FLIGHT": "30", "TOLLGATE_MAX_CONNECTIONS": "40"}, wantInFlight: 30, wantConns: 40},
		{name: "zero is no cap", give: []string{"--max-in-flight=0", "--max-connections=0"}, wantInFlight: -1, wantConns: -1},
		{name: "negative in flight", give: []string{"--max-in-flight=-1"}, wantUsageText: "--max-in-flight must be 0 (no cap) or more"},
		{name: "negative connections", give: []string{"--max-connections=-5"}, wantUsageText: "--max-connections must be 0 (no cap) or more"},
		{name: "not a number", give: []string{"--max-in-flight=lots"}, wantUsageText: `--max-in-flight "lots": want a whole number, such as 100`},
		{name: "zero streams", give: []string{"--max-concurrent-streams=0"}, wantUsageText: "--max-concurrent-streams must be between 1 and 2147483647"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			a := &App{Stderr: &stderr, LookupEnv: env(tt.env)}
			f, err := a.parseServeFlags(tt.give)
			if tt.wantUsageText != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantUsageText) {
					t.Errorf("parseServeFlags(%q) = %v, stderr %q; want a usage error with %q", tt.give, err, stderr.String(), tt.wantUsageText)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseServeFlags: %v\n%s", err, stderr.String())
			}
			if got := f.protect.inFlight(); got != tt.wantInFlight {
				t.Errorf("MaxInFlight = %d, want %d", got, tt.wantInFlight)
			}
			if got := f.protect.connections(); got != tt.wantConns {
				t.Errorf("MaxConnections = %d, want %d", got, tt.wantConns)
			}
			if got := f.protect.streams(); got != tt.wantStreams {
				t.Errorf("MaxConcurrentStreams = %d, want %d", got, tt.wantStreams)
			}
		})
	}
}
