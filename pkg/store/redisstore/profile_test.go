package redisstore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestScriptProfile splits the Redis time of one one-charge decision
// (apply.lua as a function) into its parts: it loads variants of the
// script cut short at some step, and bare functions that do only one
// part (the call itself, the argument parsing, the GET, the decode, the
// SET, the reply), and reports each one's usec_per_call of FCALL from
// INFO commandstats (the script and the commands it runs; wall time),
// the median over rounds that alternate the variants. Set
// TOLLGATE_SCRIPT_PROFILE=1 to run it (about a minute); ROUNDS and
// CALLS tune it.
func TestScriptProfile(t *testing.T) {
	if os.Getenv("TOLLGATE_SCRIPT_PROFILE") == "" {
		t.Skip("set TOLLGATE_SCRIPT_PROFILE=1 to profile apply.lua")
	}
	rounds, calls := 3, 20000
	if v, err := strconv.Atoi(os.Getenv("ROUNDS")); err == nil {
		rounds = v
	}
	if v, err := strconv.Atoi(os.Getenv("CALLS")); err == nil {
		calls = v
	}
	src := applyLua
	if f := os.Getenv("SCRIPT"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = string(b)
	}
	// cut is src with from replaced by to; "" when src has no from.
	cut := func(from, to string) string {
		if !strings.Contains(src, from) {
			return ""
		}
		return strings.Replace(src, from, to, 1)
	}
	bare := func(body string) string {
		return "local function apply(keys, argv)\n" + body + "\nend\n"
	}
	variants := []struct{ name, body string }{
		{"noop: return 1", bare("return 1")},
		{"reply: 5 values", bare("return {1, 1, 0, 0, 0}")},
		{"args: tonumber x10", bare(`local a = 0
for i = 2, 10 do a = a + (tonumber(argv[i]) or 0) end
return 1`)},
		{"args+table: the ch table", bare(`local ch = {ki = tonumber(argv[4]), kind = argv[5], amount = tonumber(argv[6]),
 p1 = tonumber(argv[7]), p2 = tonumber(argv[8]), p3 = tonumber(argv[9]), cost = tonumber(argv[10]),
 shadow = argv[11] ~= '' and string.find(argv[11], 's', 1, true) ~= nil, force = argv[11] ~= '' and string.find(argv[11], 'f', 1, true) ~= nil}
return 1`)},
		{"get", bare("redis.pcall('GET', keys[1]) return 1")},
		{"get+unpack", bare("local r = redis.pcall('GET', keys[1]) if r then cmsgpack.unpack(r) end return 1")},
		{"get+unpack+pack", bare("local r = redis.pcall('GET', keys[1]) if r then cmsgpack.pack(cmsgpack.unpack(r)) end return 1")},
		// '0' where there was nothing: a count key may be new (a new
		// window), and the variants after this one read it as a count.
		{"get+set", bare("local r = redis.pcall('GET', keys[1]) redis.call('SET', keys[1], r or '0', 'PX', '60000') return 1")},
		// The least a decision on a new window key can cost: GET, SET of
		// a packed window, a reply of five values, and no logic.
		{"least: new window", bare("local r = redis.pcall('GET', keys[1]) if r == false then redis.call('SET', keys[1], cmsgpack.pack({3000, math.floor(tonumber(argv[2]) / 3000), 1}), 'PX', string.format('%d', 61000)) end return {1, 1, 0, 1, 60000}")},
		{"format %d x2", bare("local a = string.format('%d', 1764170000000) local b = string.format('%d', 61000) return 1")},
		{"apply: parse+load", cut("  local out = {1}\n", "  do return 1 end\n  local out = {1}\n")},
		{"apply: parse+load+reset", cut("  local out = {1}\n", "  reset(order) do return 1 end\n  local out = {1}\n")},
		{"apply: no save, no report", strings.Replace(cut("    for _, k in ipairs(order) do save(k) end\n", ""), "  for j, ch in ipairs(charges) do\n    local o = 4 * j - 2\n    local c = ch.k.work\n", "  for j, ch in ipairs({}) do\n    local o = 4 * j - 2\n    local c = ch.k.work\n", 1)},
		{"apply: no save", cut("    for _, k in ipairs(order) do save(k) end\n", "")},
		{"apply: full", src},
		// The library as the store runs it: counts for the fixed
		// windows, plains for the others.
		{"library", src},
	}
	variants = slices.DeleteFunc(variants, func(v struct{ name, body string }) bool { return v.body == "" })
	if fs := os.Getenv("BASE"); fs != "" {
		// A/B: the scripts at BASE (comma-separated) against this one,
		// whole.
		variants = variants[:0]
		for f := range strings.SplitSeq(fs, ",") {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			variants = append(variants, struct{ name, body string }{f, string(b)})
		}
		variants = append(variants, struct{ name, body string }{"this: apply.lua", src})
	}
	const window = time.Minute
	scenarios := []struct {
		name string
		alg  limit.Algorithm
		warm bool
	}{
		{"sliding", limit.SlidingWindow, true},
		{"sliding-new", limit.SlidingWindow, false},
		{"fixed", limit.FixedWindow, true},
		{"fixed-new", limit.FixedWindow, false},
		{"token", limit.TokenBucket, true},
		{"token-new", limit.TokenBucket, false},
	}
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for i, v := range variants {
		lib := "#!lua name=prof" + strconv.Itoa(i) + "\n" + v.body + "\nredis.register_function('prof" + strconv.Itoa(i) + "', apply)\n"
		if v.name == "library" || os.Getenv("BASE") != "" {
			lib += "redis.register_function('prof" + strconv.Itoa(i) + "_counts', counts)\n" +
				"redis.register_function('prof" + strconv.Itoa(i) + "_plains', plains)\n"
		}
		if err := c.FunctionLoad(ctx, lib).Err(); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
	}
	s := newStore(mustClient(t, srv.URL()))
	t.Cleanup(func() { _ = s.Close() })
	now := t0
	usec := make(map[string][]float64)
	cpus := make(map[string][]float64)
	for r := range rounds {
		for _, sc := range scenarios {
			key := benchKey(limit.Requests, sc.alg, window, "tenant", "prof-"+sc.name)
			ch := limit.Charge{Key: key, Algorithm: sc.alg, Amount: 1 << 40, Window: window, Cost: 1}
			if sc.warm {
				// One charge in every bucket of a sliding window.
				for range limit.DefaultBuckets + 1 {
					if _, err := s.Apply(ctx, now, []limit.Charge{ch}, make([]limit.Result, 1)); err != nil {
						t.Fatal(err)
					}
					now = now.Add(window / limit.DefaultBuckets)
				}
			}
			for i, v := range variants {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				cpu := mainThreadCPU(t, c)
				pipe := c.Pipeline()
				for j := range calls {
					now = now.Add(time.Millisecond)
					k := key
					if !sc.warm {
						k = fmt.Sprintf("%s-%d-%d-%d", key, r, i, j)
					}
					charges := []limit.Charge{{Key: k, Algorithm: sc.alg, Amount: 1 << 40, Window: window, Cost: 1}}
					build := applyCall
					if v.name == "library" || os.Getenv("BASE") != "" {
						build = newCall
					}
					cl, err := build("apply", now.UnixMilli(), charges)
					if err != nil {
						t.Fatal(err)
					}
					fn := "prof" + strconv.Itoa(i) + [...]string{fnApply: "", fnCounts: "_counts", fnPlains: "_plains"}[cl.fn]
					pipe.FCall(ctx, fn, cl.keys, cl.args...)
					if pipe.Len() == 10 || j == calls-1 {
						if _, err := pipe.Exec(ctx); err != nil {
							t.Fatalf("%s %s: %v", sc.name, v.name, err)
						}
					}
				}
				n, us := fcallStats(t, c)
				if n != int64(calls) {
					t.Fatalf("%d calls, want %d", n, calls)
				}
				usec[sc.name+"\x00"+v.name] = append(usec[sc.name+"\x00"+v.name], us/float64(n))
				cpus[sc.name+"\x00"+v.name] = append(cpus[sc.name+"\x00"+v.name], (mainThreadCPU(t, c)-cpu)/float64(n))
			}
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	var b strings.Builder
	table := func(title string, usec map[string][]float64) {
		fmt.Fprintf(&b, "%-28s", title)
		for _, sc := range scenarios {
			fmt.Fprintf(&b, " %11s", sc.name)
		}
		b.WriteString("\n")
		for _, v := range variants {
			fmt.Fprintf(&b, "%-28.28s", v.name)
			for _, sc := range scenarios {
				xs := usec[sc.name+"\x00"+v.name]
				slices.Sort(xs)
				fmt.Fprintf(&b, " %5.2f/%5.2f", xs[0], xs[len(xs)/2])
			}
			b.WriteString("\n")
		}
	}
	table("FCALL µs/call (min/median)", usec)
	table("main thread CPU µs/call", cpus)
	t.Log("\n" + b.String())
}

func mustClient(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	c, err := NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fcallStats reads cmdstat_fcall's calls and usec.
func fcallStats(t *testing.T, c *redis.Client) (calls int64, usec float64) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_fcall:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return calls, usec
}
