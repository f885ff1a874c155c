package load

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

// runJSON runs Main with -json and decodes its output.
func runJSON(t *testing.T, args ...string) JSONResult {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := Main(t.Context(), append(args, "-json"), &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	var got JSONResult
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return got
}

// The baseline writes, per call, INCRBY and PEXPIRE to one key per
// descriptor, named by domain, entries and window start, and its CPU and
// command figures cover the measured calls only.
func TestBaselineWritesOneKeyPerDescriptor(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const calls = 300
	got := runJSON(t, "-api", "redis-baseline", "-redis-url", srv.URL(), "-redis-info", srv.Addr(),
		"-c", "3", "-n", strconv.Itoa(calls), "-warmup", "100ms", "-window", "1h", "-hits", "2", "-server-pid", strconv.Itoa(os.Getpid()),
		"-domain", "bench", "-descriptor", "tenant=a", "-descriptor", "tenant=a,model=m", "-descriptor", "user=u",
		"-tenants", "1", "-spread-key", "tenant,user")
	if got.OK != calls || got.ErrorsTotal != 0 || got.Redis.AllCalls <= calls || got.Addr != srv.URL() {
		t.Fatalf("ok %d errors %d addr %s, want %d calls OK against %s", got.OK, got.ErrorsTotal, got.Addr, calls, srv.URL())
	}

	c := srv.Client(t)
	keys, err := c.Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	// A window boundary may fall in the run: then each prefix has two keys.
	sums := map[string]int64{}
	for _, k := range keys {
		i := strings.LastIndexByte(k, '_')
		start, err := strconv.ParseInt(k[i+1:], 10, 64)
		if err != nil || start%3600 != 0 || math.Abs(float64(time.Now().Unix()-start)) > 7200 {
			t.Errorf("key %q does not end in the current hour's start in Unix seconds", k)
		}
		n, err := c.Get(t.Context(), k).Int64()
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := c.PTTL(t.Context(), k).Result()
		if err != nil || ttl <= 0 || ttl > time.Hour {
			t.Errorf("key %q: PTTL %v, %v, want in (0, 1h]", k, ttl, err)
		}
		sums[k[:i]] += n
	}
	all := 2 * got.Redis.AllCalls
	want := map[string]int64{"bench_tenant_tenant-0": all, "bench_tenant_tenant-0_model_m": all, "bench_user_tenant-0": all}
	if len(sums) != len(want) {
		t.Fatalf("keys %q, want one window of each of %v", keys, want)
	}
	for k, n := range want {
		if sums[k] != n {
			t.Errorf("%s counts %d, want %d (hits 2 per call, warm-up included)", k, sums[k], n)
		}
	}

	cpu := got.CPU
	if cpu == nil || cpu.RedisUSPerDecision == nil || cpu.ServerUSPerDecision == nil {
		t.Fatalf("cpu %+v, want Redis and server figures", cpu)
	}
	// The warm-up dialed the connections; the meter's readings bracket
	// the measured calls exactly.
	if cpu.Decisions != calls || *cpu.RedisCommandsPerDecision != 6 {
		t.Errorf("%d decisions, %v commands each, want %d and 6 (3 x INCRBY + PEXPIRE)", cpu.Decisions, *cpu.RedisCommandsPerDecision, calls)
	}
	if *cpu.RedisUSPerDecision <= 0 || *cpu.ServerUSPerDecision < 0 || cpu.LoadUSPerDecision <= 0 || cpu.ServerPID != os.Getpid() {
		t.Errorf("cpu %+v: want Redis and load tool time > 0, server time >= 0 for pid %d", cpu, os.Getpid())
	}
}

// The warm-up's calls are in neither the decisions nor the commands the
// CPU figures are divided by.
func TestCPUExcludesWarmup(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	got := runJSON(t, "-api", "redis-baseline", "-redis-url", srv.URL(), "-redis-info", srv.Addr(),
		"-c", "2", "-d", "300ms", "-warmup", "300ms", "-domain", "bench", "-descriptor", "tenant=a")
	cpu, r := got.CPU, got.Redis
	if cpu == nil || r == nil || cpu.RedisCommandsPerDecision == nil {
		t.Fatalf("cpu %+v redis %+v", cpu, r)
	}
	if r.AllCalls < got.Requests*3/2 {
		t.Fatalf("%d calls in all, %d measured: the warm-up made too few to tell", r.AllCalls, got.Requests)
	}
	// The warm-up's calls have all ended when the meter reads.
	if cpu.Decisions != got.Requests || *cpu.RedisCommandsPerDecision != 2 {
		t.Errorf("%d decisions, %.4f commands each, want %d and 2",
			cpu.Decisions, *cpu.RedisCommandsPerDecision, got.Requests)
	}
}

func TestServerPIDGone(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var out, errOut bytes.Buffer
	args := []string{"-api", "redis-baseline", "-redis-url", srv.URL(), "-n", "5", "-domain", "d", "-descriptor", "k=v", "-server-pid", "999999999"}
	if code := Main(t.Context(), args, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "-server-pid") {
		t.Errorf("exit %d, stderr %q, want 1 and a -server-pid error", code, errOut.String())
	}
}
