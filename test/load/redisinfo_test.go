package load

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

func TestUsedMemory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		want    int64
		wantErr string
	}{
		{name: "reply", give: "# Memory\r\nused_memory:1049744\r\nused_memory_human:1.00M\r\nused_memory_rss:13000000\r\n", want: 1049744},
		{name: "missing", give: "# Memory\r\nused_memory_rss:13000000\r\n", wantErr: "no used_memory"},
		{name: "garbage", give: "used_memory:lots\r\n", wantErr: `used_memory "lots"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := usedMemory(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("usedMemory = %d, %v, want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("usedMemory = %d, %v, want %d", got, err, tt.want)
			}
		})
	}
}

func TestRedisMeterCountsNewKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	m, err := newRedisMeter(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	mem, err := m.start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// 10,000 small strings: each is a dictionary entry, a key and a value.
	c := srv.Client(t)
	const n = 10000
	pipe := c.Pipeline()
	for i := range n {
		pipe.Set(t.Context(), fmt.Sprintf("k%05d", i), "v", 0)
	}
	if _, err := pipe.Exec(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := m.finish(t.Context(), mem); err != nil {
		t.Fatal(err)
	}
	if mem.NewKeys() != n || mem.SampleKey == "" || mem.SampleBytes <= 0 {
		t.Fatalf("got %+v, want %d new keys and a sample", mem, n)
	}
	if b := mem.BytesPerKey(); b < 16 || b > 512 {
		t.Errorf("%.1f B/key for a 6-byte key and a 1-byte value, want 16..512", b)
	}
}

func TestMainRedisInfo(t *testing.T) {
	t.Parallel()
	_, addr := startFake(t)
	srv := redistest.Start(t)
	args := []string{"-addr", addr, "-c", "2", "-n", "10", "-domain", "api", "-descriptor", "tenant=acme", "-redis-info", srv.Addr()}

	var out, errOut bytes.Buffer
	if code := Main(t.Context(), args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	// The fake writes nothing to Redis: no key, no figure per key.
	if want := "redis      " + srv.Addr() + "  keys 0 -> 0 (+0)"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}

	out.Reset()
	if code := Main(t.Context(), append(args, "-json"), &out, &errOut); code != 0 {
		t.Fatalf("-json: exit %d, stderr %s", code, errOut.String())
	}
	var got JSONResult
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.Redis == nil || got.Redis.UsedMemoryBefore <= 0 {
		t.Fatalf("-json: %v, redis %+v\n%s", err, got.Redis, out.String())
	}

	// A port that was free a moment ago: nothing answers there.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = lis.Close()
	errOut.Reset()
	bad := []string{"-addr", addr, "-n", "1", "-domain", "api", "-descriptor", "tenant=acme", "-redis-info", lis.Addr().String()}
	if code := Main(t.Context(), bad, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "INFO memory") {
		t.Errorf("unreachable Redis: exit %d, stderr %q, want 1 and the INFO error", code, errOut.String())
	}
}

func TestCommandCalls(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		want    int64
		wantErr bool
	}{
		{"none", "# Commandstats\r\n", 0, false},
		{
			name: "sums all but the meter's",
			give: "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=3000,usec_per_call=25.00,rejected_calls=0,failed_calls=0\r\n" +
				"cmdstat_info:calls=7,usec=1,usec_per_call=0.1,rejected_calls=0,failed_calls=0\r\n" +
				"cmdstat_hello:calls=3,usec=1,usec_per_call=0.3,rejected_calls=0,failed_calls=0\r\n" +
				"cmdstat_dbsize:calls=2,usec=1,usec_per_call=0.5,rejected_calls=0,failed_calls=0\r\n",
			want: 123,
		},
		{"bad count", "cmdstat_get:calls=x,usec=1\r\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := commandCalls(tt.give)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("commandCalls = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
