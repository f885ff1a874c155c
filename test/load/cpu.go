package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CPUUse is the CPU time spent during the measured run (the warm-up
// excluded) by Redis, the server process and the load tool itself, read
// just before the first measured call and after the last one answered.
type CPUUse struct {
	// Decisions is the measured calls the figures are divided by.
	Decisions int64
	// Redis is set with -redis-info: INFO cpu's used_cpu_sys +
	// used_cpu_user, in seconds, and the commands of INFO commandstats
	// (but the meter's own) over the same span.
	Redis         bool
	RedisSeconds  float64
	RedisCommands int64
	// ServerPID is -server-pid (0: not measured); ServerSeconds its
	// utime + stime from /proc/PID/stat, its threads included, its
	// children not.
	ServerPID     int
	ServerSeconds float64
	// ClockTicks is the USER_HZ that /proc/PID/stat counts in.
	ClockTicks int64
	// SelfSeconds is the load tool's own user + system time (getrusage).
	SelfSeconds float64
}

// perDecision is v (seconds) per decision in microseconds; 0 without decisions.
func (u *CPUUse) perDecision(v float64) float64 {
	if u.Decisions <= 0 {
		return 0
	}
	return v * 1e6 / float64(u.Decisions)
}

// RedisMicros is Redis CPU per decision in µs.
func (u *CPUUse) RedisMicros() float64 { return u.perDecision(u.RedisSeconds) }

// ServerMicros is the server's CPU per decision in µs.
func (u *CPUUse) ServerMicros() float64 { return u.perDecision(u.ServerSeconds) }

// SelfMicros is the load tool's CPU per decision in µs.
func (u *CPUUse) SelfMicros() float64 { return u.perDecision(u.SelfSeconds) }

// RedisCommandsPerDecision is the commands Redis ran per measured decision.
func (u *CPUUse) RedisCommandsPerDecision() float64 {
	if u.Decisions <= 0 {
		return 0
	}
	return float64(u.RedisCommands) / float64(u.Decisions)
}

// cpuSample is one reading of the cumulative counters.
type cpuSample struct {
	redis     float64
	redisCmds int64
	server    float64
	self      float64
}

// cpuMeter reads the counters CPUUse is the difference of.
type cpuMeter struct {
	redis *redisMeter // nil: Redis not measured
	pid   int         // 0: server not measured
	ticks int64
}

func newCPUMeter(redis *redisMeter, pid int) *cpuMeter {
	return &cpuMeter{redis: redis, pid: pid, ticks: clockTicks()}
}

func (m *cpuMeter) sample(ctx context.Context) (cpuSample, error) {
	var s cpuSample
	var err error
	if m.redis != nil {
		if s.redis, err = m.redis.cpu(ctx); err != nil {
			return s, err
		}
		if s.redisCmds, err = m.redis.commands(ctx); err != nil {
			return s, err
		}
	}
	if m.pid > 0 {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(m.pid) + "/stat")
		if err != nil {
			return s, fmt.Errorf("-server-pid: %w", err)
		}
		ticks, err := procStatTicks(string(stat))
		if err != nil {
			return s, fmt.Errorf("-server-pid %d: %w", m.pid, err)
		}
		s.server = float64(ticks) / float64(m.ticks)
	}
	s.self, err = selfCPU()
	return s, err
}

// use is the CPU spent from a to b over decisions.
func (m *cpuMeter) use(a, b cpuSample, decisions int64) *CPUUse {
	return &CPUUse{
		Decisions:     decisions,
		Redis:         m.redis != nil,
		RedisSeconds:  b.redis - a.redis,
		RedisCommands: b.redisCmds - a.redisCmds,
		ServerPID:     m.pid,
		ServerSeconds: b.server - a.server,
		ClockTicks:    m.ticks,
		SelfSeconds:   b.self - a.self,
	}
}

// cpu reads used_cpu_sys + used_cpu_user, in seconds.
func (m *redisMeter) cpu(ctx context.Context) (float64, error) {
	return infoValue(ctx, m, "cpu", redisCPU)
}

// redisCPU sums used_cpu_sys and used_cpu_user of an INFO cpu reply: the
// main thread's and the I/O threads' CPU seconds. Both must be there.
func redisCPU(info string) (float64, error) {
	var sum float64
	found := 0
	for line := range strings.Lines(info) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s %q: %w", name, v, err)
		}
		sum += f
		found++
	}
	if found != 2 {
		return 0, errors.New("INFO cpu lacks used_cpu_sys or used_cpu_user")
	}
	return sum, nil
}

// procStatTicks is utime + stime of a /proc/PID/stat line, in clock
// ticks. The command name (field 2) is in parentheses and may hold spaces
// and parentheses itself, so the fields are counted from the last ')':
// state is field 3, utime 14, stime 15.
func procStatTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')' after the command name")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var sum int64
	for _, v := range f[11:13] { // fields 14 and 15
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("/proc stat: utime or stime %q is not a count", v)
		}
		sum += n
	}
	return sum, nil
}

// atClkTck is the auxiliary vector entry holding sysconf(_SC_CLK_TCK).
const atClkTck = 17

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: the kernel
// passes it to every process in its auxiliary vector (AT_CLKTCK), which
// is where sysconf(_SC_CLK_TCK) reads it. Without /proc/self/auxv it is
// 100, what Linux has used on every architecture since 2.6.
func clockTicks() int64 {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	return auxvClockTicks(b)
}

// auxvClockTicks finds AT_CLKTCK in a 64-bit native-endian auxiliary
// vector (pairs of words); 100 when it is not there.
func auxvClockTicks(b []byte) int64 {
	for ; len(b) >= 16; b = b[16:] {
		key, val := binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:])
		if key == 0 {
			break
		}
		if key == atClkTck && val > 0 && val < 1e6 {
			return int64(val)
		}
	}
	return 100
}
