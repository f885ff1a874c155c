package app

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// redisLogLine makes go-redis log a line: an unknown client-side cache
// strategy is one it reports and then ignores, without dialling.
func redisLogLine(t testing.TB) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ClientSideCacheStrategy: 99})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// goRedisLines are the lines of a JSON log that go-redis wrote, failing
// the test at a line that is not JSON.
func goRedisLines(t testing.TB, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("a log line is not JSON: %q", line)
		}
		if m["logger"] == "go-redis" {
			out = append(out, m)
		}
	}
	return out
}

func TestRedisLogThroughZap(t *testing.T) {
	t.Parallel()
	var buf buffer
	log, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	stop := routeRedisLog(log)
	redisLogLine(t)
	// Tests running in parallel may add lines of their own.
	found := false
	for _, l := range goRedisLines(t, buf.String()) {
		found = found || l["level"] == "info" && strings.Contains(l["msg"].(string), "unknown ClientSideCacheStrategy 99")
	}
	if !found {
		t.Fatalf("no go-redis line at info about the strategy; log:\n%s", buf.String())
	}
	stop()
	before := buf.String()
	redisLogLine(t)
	if buf.String() != before {
		t.Errorf("go-redis still logs here after stop:\n%s", strings.TrimPrefix(buf.String(), before))
	}
}

func TestRedisLogLevel(t *testing.T) {
	t.Parallel()
	tests := []struct{ give, want string }{
		{give: "sentinel: selected addr=%s masterAddr=%s", want: "info"},
		{give: "sentinel: GetMasterAddrByName name=%q failed: %s", want: "warn"},
		{give: "redis: connection pool: Error %s", want: "warn"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			t.Parallel()
			var buf buffer
			log, err := newLogger(&buf, "debug", "json")
			if err != nil {
				t.Fatal(err)
			}
			r := &redisLog{}
			defer r.add(log.Named("go-redis"))()
			r.Printf(context.Background(), tt.give, "a", "b")
			if lines := goRedisLines(t, buf.String()); len(lines) != 1 || lines[0]["level"] != tt.want {
				t.Errorf("log %s, want one go-redis line at %s", buf.String(), tt.want)
			}
		})
	}
}

// TestServeRoutesRedisLog: serve routes go-redis's log into its own.
func TestServeRoutesRedisLog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stderr := &buffer{}
	if ad, code := serveAddrs(ctx, t, stderr, nil, "--config", "../../config"); ad.GRPC == nil {
		t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
	}
	redisLogLine(t)
	if lines := goRedisLines(t, stderr.String()); len(lines) == 0 {
		t.Errorf("serve's log lacks go-redis's line:\n%s", stderr.String())
	}
}
