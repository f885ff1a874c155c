package load

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	base := []string{"-domain", "api", "-descriptor", "tenant=acme"}
	defaults := Config{
		Addr: "127.0.0.1:8081", Concurrency: 50, Conns: 1, Duration: 10 * time.Second,
		Timeout: time.Second, Domain: "api", Descriptors: []Descriptor{{{"tenant", "acme"}}},
		SpreadKey: "tenant", Spread: SpreadRandom, API: APIRateLimit, BodyBytes: 2048, Model: "gpt-4o",
		Window: time.Second,
	}
	tests := []struct {
		name    string
		give    []string
		want    func(*Config)
		wantErr string
	}{
		{name: "defaults", give: base, want: func(*Config) {}},
		{
			name: "everything",
			give: append([]string{
				"-addr", "127.0.0.1:9000", "-c", "8", "-conns", "4", "-d", "0", "-n", "1000",
				"-descriptor", `user=u1,path=/a\,b`, "-tenants", "10", "-spread-key", "user",
				"-spread", "round-robin", "-hits", "5", "-timeout", "250ms", "-warmup", "2s", "-json",
				"-redis-info", "127.0.0.1:6390",
			}, base...),
			want: func(c *Config) {
				c.Addr, c.Concurrency, c.Conns, c.Duration, c.Requests = "127.0.0.1:9000", 8, 4, 0, 1000
				c.Descriptors = []Descriptor{{{"user", "u1"}, {"path", "/a,b"}}, {{"tenant", "acme"}}}
				c.Tenants, c.SpreadKey, c.Spread, c.Hits = 10, "user", SpreadRoundRobin, 5
				c.Timeout, c.Warmup, c.JSON = 250*time.Millisecond, 2*time.Second, true
				c.RedisInfo = "127.0.0.1:6390"
			},
		},
		{name: "no domain", give: []string{"-descriptor", "a=b"}, wantErr: "-domain is required"},
		{name: "no descriptor", give: []string{"-domain", "api"}, wantErr: "at least one -descriptor"},
		{name: "unbounded", give: append([]string{"-d", "0"}, base...), wantErr: "never stop"},
		{name: "negative n", give: append([]string{"-n", "-1"}, base...), wantErr: "must not be negative"},
		{name: "no workers", give: append([]string{"-c", "0"}, base...), wantErr: "-c is 0"},
		{name: "no conns", give: append([]string{"-conns", "0"}, base...), wantErr: "-conns is 0"},
		{name: "no timeout", give: append([]string{"-timeout", "0"}, base...), wantErr: "-timeout is 0s"},
		{name: "spread key missing", give: append([]string{"-tenants", "3", "-spread-key", "user"}, base...), wantErr: `no descriptor has a key of "user"`},
		{name: "several spread keys", give: append([]string{"-tenants", "3", "-spread-key", "user,tenant"}, base...), want: func(c *Config) {
			c.Tenants, c.SpreadKey = 3, "user,tenant"
		}},
		{name: "baseline", give: append([]string{"-api", "redis-baseline", "-redis-url", "redis://127.0.0.1:1/0", "-window", "1m", "-server-pid", "42"}, base...), want: func(c *Config) {
			c.API, c.RedisURL, c.Window, c.ServerPID = APIRedisBaseline, "redis://127.0.0.1:1/0", time.Minute, 42
		}},
		{name: "baseline without redis", give: append([]string{"-api", "redis-baseline"}, base...), wantErr: "needs -redis-url"},
		{name: "baseline window too short", give: append([]string{"-api", "redis-baseline", "-redis-url", "x:1", "-window", "10us"}, base...), wantErr: "-window is 10µs"},
		{name: "negative pid", give: append([]string{"-server-pid", "-1"}, base...), wantErr: "-server-pid is -1"},
		{name: "bad spread", give: append([]string{"-spread", "zipf"}, base...), wantErr: `-spread is "zipf"`},
		{name: "hits too big", give: append([]string{"-hits", "4294967296"}, base...), wantErr: "-hits is 4294967296"},
		{name: "bad descriptor", give: []string{"-domain", "api", "-descriptor", "tenant"}, wantErr: "has no '='"},
		{name: "extra args", give: append(base, "extra"), wantErr: "unexpected arguments"},
		{name: "bad api", give: append([]string{"-api", "grpc"}, base...), wantErr: `-api is "grpc"`},
		{name: "check without descriptors", give: []string{"-api", "check", "-key", "k"}, want: func(c *Config) {
			c.API, c.APIKey, c.Domain, c.Descriptors = APICheck, "k", "", nil
		}},
		{name: "check body too small", give: []string{"-api", "check", "-body-bytes", "10"}, wantErr: "-body-bytes is 10"},
		{name: "check with tenants", give: []string{"-api", "check", "-tenants", "3"}, wantErr: "-tenants spreads descriptors"},
		{name: "empty address in a list", give: append([]string{"-addr", "127.0.0.1:1,,127.0.0.1:2"}, base...), wantErr: `-addr "127.0.0.1:1,,127.0.0.1:2" has an empty address`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseFlags(tt.give, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := defaults
			want.Descriptors = append([]Descriptor(nil), defaults.Descriptors...)
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestParseFlagsHelp(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	_, err := ParseFlags([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("error = %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(out.String(), `\, \= \\`) {
		t.Fatalf("usage does not document the descriptor escapes:\n%s", out.String())
	}
}
