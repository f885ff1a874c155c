package load

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"
)

// Main is the tollgate-load command: parse args, run, print. It returns
// the process exit code: 0 after a run in which some call was answered,
// 1 when none was (or the run could not start), 2 for bad flags.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := ParseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "tollgate-load: %v\n", err)
		return 2
	}
	var (
		meter *redisMeter
		mem   *RedisMemory
	)
	if cfg.RedisInfo != "" {
		if meter, err = newRedisMeter(cfg.RedisInfo); err == nil {
			defer meter.close()
			mem, err = meter.start(ctx)
		}
		if err != nil {
			fmt.Fprintf(stderr, "tollgate-load: %v\n", err)
			return 1
		}
	}
	// CPU is read as the warm-up ends and after the last call.
	cpu := newCPUMeter(meter, cfg.ServerPID)
	var before cpuSample
	var beforeErr error
	res, err := run(ctx, cfg, func() { before, beforeErr = cpu.sample(context.WithoutCancel(ctx)) })
	if err == nil {
		err = beforeErr
	}
	if err != nil {
		fmt.Fprintf(stderr, "tollgate-load: %v\n", err)
		return 1
	}
	after, err := cpu.sample(context.WithoutCancel(ctx))
	if err != nil {
		fmt.Fprintf(stderr, "tollgate-load: %v\n", err)
		return 1
	}
	res.CPU = cpu.use(before, after, res.Requests)
	if meter != nil {
		if err := meter.finish(ctx, mem); err != nil {
			fmt.Fprintf(stderr, "tollgate-load: %v\n", err)
			return 1
		}
		res.Redis = mem
	}
	if cfg.JSON {
		err = res.WriteJSON(stdout)
	} else {
		err = res.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tollgate-load: write result: %v\n", err)
		return 1
	}
	if res.Latency.Count() == 0 {
		fmt.Fprintf(stderr, "tollgate-load: no call to %s was answered\n", cfg.Addr)
		return 1
	}
	return 0
}

// Quantiles reported, in order.
var reportQuantiles = []struct {
	name string
	q    float64
}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p999", 0.999}}

// WriteText prints r for a person.
func (r *Result) WriteText(w io.Writer) error {
	h := r.Latency
	_, err := fmt.Fprintf(w, "target     %s  workers %d  conns %d  elapsed %v\n", r.Addr, r.Workers, r.Conns, r.Elapsed.Round(time.Millisecond))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "requests   %d  (%.1f/s)\n", r.Requests, r.RPS())
	fmt.Fprintf(w, "answers    ok %d  over_limit %d  unknown %d  errors %d\n", r.OK, r.OverLimit, r.Unknown, r.ErrorCount())
	fmt.Fprintf(w, "latency   ")
	for _, q := range reportQuantiles {
		fmt.Fprintf(w, " %s %v ", q.name, roundDuration(h.Quantile(q.q)))
	}
	fmt.Fprintf(w, " max %v  (%d answered)\n", roundDuration(h.Max()), h.Count())
	for _, name := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(w, "error      %-18s %d\n", name, r.Errors[name])
	}
	if m := r.Redis; m != nil {
		fmt.Fprintf(w, "redis      %s  keys %d -> %d (%+d)  used_memory %d -> %d (%+d B)  %.1f B/key\n",
			m.Addr, m.KeysBefore, m.KeysAfter, m.NewKeys(), m.UsedBefore, m.UsedAfter, m.UsedAfter-m.UsedBefore, m.BytesPerKey())
		if m.SampleKey != "" {
			fmt.Fprintf(w, "redis      MEMORY USAGE %d B of a sample key %q\n", m.SampleBytes, m.SampleKey)
		}
		fmt.Fprintf(w, "redis      commands %d for %d calls (warmup included): %.4f per call\n",
			m.Commands(), r.AllCalls, r.CommandsPerCall())
	}
	if u := r.CPU; u != nil {
		fmt.Fprintf(w, "cpu        per measured decision (%d):", u.Decisions)
		if u.Redis {
			fmt.Fprintf(w, "  redis %.2f µs (%.4f commands)", u.RedisMicros(), u.RedisCommandsPerDecision())
		}
		if u.ServerPID > 0 {
			fmt.Fprintf(w, "  server pid %d %.2f µs", u.ServerPID, u.ServerMicros())
		}
		fmt.Fprintf(w, "  load tool %.2f µs\n", u.SelfMicros())
	}
	return nil
}

// roundDuration keeps about four significant digits.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Microsecond)
	default:
		return d.Round(100 * time.Nanosecond)
	}
}

// JSONResult is the -json output.
type JSONResult struct {
	Addr              string           `json:"addr"`
	Workers           int              `json:"workers"`
	Conns             int              `json:"conns"`
	ElapsedSeconds    float64          `json:"elapsed_seconds"`
	Requests          int64            `json:"requests"`
	RequestsPerSecond float64          `json:"requests_per_second"`
	OK                int64            `json:"ok"`
	OverLimit         int64            `json:"over_limit"`
	Unknown           int64            `json:"unknown"`
	ErrorsTotal       int64            `json:"errors_total"`
	Errors            map[string]int64 `json:"errors"`
	// LatencyMS has min, mean, p50, p90, p99, p999 and max in milliseconds
	// over the answered calls.
	LatencyMS      map[string]float64 `json:"latency_ms"`
	LatencySamples uint64             `json:"latency_samples"`
	// Redis is there with -redis-info.
	Redis *JSONRedis `json:"redis,omitempty"`
	// CPU is the CPU time per measured decision.
	CPU *JSONCPU `json:"cpu,omitempty"`
}

// JSONCPU is CPUUse in the -json output: microseconds of CPU per
// measured decision (warm-up excluded). The redis fields are there with
// -redis-info, the server fields with -server-pid.
type JSONCPU struct {
	Decisions                int64    `json:"decisions"`
	RedisUSPerDecision       *float64 `json:"redis_us_per_decision,omitempty"`
	RedisCommandsPerDecision *float64 `json:"redis_commands_per_decision,omitempty"`
	ServerPID                int      `json:"server_pid,omitempty"`
	ServerUSPerDecision      *float64 `json:"server_us_per_decision,omitempty"`
	ClockTicksPerSecond      int64    `json:"clock_ticks_per_second,omitempty"`
	LoadUSPerDecision        float64  `json:"load_us_per_decision"`
}

func (u *CPUUse) json() *JSONCPU {
	j := &JSONCPU{Decisions: u.Decisions, LoadUSPerDecision: u.SelfMicros()}
	if u.Redis {
		us, cmds := u.RedisMicros(), u.RedisCommandsPerDecision()
		j.RedisUSPerDecision, j.RedisCommandsPerDecision = &us, &cmds
	}
	if u.ServerPID > 0 {
		us := u.ServerMicros()
		j.ServerPID, j.ServerUSPerDecision, j.ClockTicksPerSecond = u.ServerPID, &us, u.ClockTicks
	}
	return j
}

// JSONRedis is RedisMemory in the -json output.
type JSONRedis struct {
	Addr              string  `json:"addr"`
	UsedMemoryBefore  int64   `json:"used_memory_before"`
	UsedMemoryAfter   int64   `json:"used_memory_after"`
	KeysBefore        int64   `json:"keys_before"`
	KeysAfter         int64   `json:"keys_after"`
	BytesPerKey       float64 `json:"bytes_per_key"`
	SampleKey         string  `json:"sample_key,omitempty"`
	SampleMemoryUsage int64   `json:"sample_memory_usage,omitempty"`
	Commands          int64   `json:"commands"`
	AllCalls          int64   `json:"all_calls"`
	CommandsPerCall   float64 `json:"commands_per_call"`
}

// CommandsPerCall is the Redis commands run per call made, warmup
// included on both sides; 0 without -redis-info or calls.
func (r *Result) CommandsPerCall() float64 {
	if r.Redis == nil || r.AllCalls == 0 {
		return 0
	}
	return float64(r.Redis.Commands()) / float64(r.AllCalls)
}

// JSON returns r in the -json shape.
func (r *Result) JSON() JSONResult {
	h := r.Latency
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	lat := map[string]float64{"min": ms(h.Min()), "mean": ms(h.Mean()), "max": ms(h.Max())}
	for _, q := range reportQuantiles {
		lat[q.name] = ms(h.Quantile(q.q))
	}
	var rj *JSONRedis
	if m := r.Redis; m != nil {
		rj = &JSONRedis{
			Addr: m.Addr, UsedMemoryBefore: m.UsedBefore, UsedMemoryAfter: m.UsedAfter,
			KeysBefore: m.KeysBefore, KeysAfter: m.KeysAfter, BytesPerKey: m.BytesPerKey(),
			SampleKey: m.SampleKey, SampleMemoryUsage: m.SampleBytes,
			Commands: m.Commands(), AllCalls: r.AllCalls, CommandsPerCall: r.CommandsPerCall(),
		}
	}
	var cj *JSONCPU
	if r.CPU != nil {
		cj = r.CPU.json()
	}
	return JSONResult{
		CPU:               cj,
		Addr:              r.Addr,
		Workers:           r.Workers,
		Conns:             r.Conns,
		ElapsedSeconds:    r.Elapsed.Seconds(),
		Requests:          r.Requests,
		RequestsPerSecond: r.RPS(),
		OK:                r.OK,
		OverLimit:         r.OverLimit,
		Unknown:           r.Unknown,
		ErrorsTotal:       r.ErrorCount(),
		Errors:            r.Errors,
		LatencyMS:         lat,
		LatencySamples:    h.Count(),
		Redis:             rj,
	}
}

// WriteJSON prints r as one JSON object.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.JSON())
}
