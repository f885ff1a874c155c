package load

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisMemory is what -redis-info read from the Redis behind the service:
// its memory and key count before and after the run. The difference is
// what the run's new keys cost, whatever their layout.
type RedisMemory struct {
	Addr string
	// UsedBefore and UsedAfter are INFO memory's used_memory, in bytes:
	// what Redis's allocator holds, keys, values, dictionaries and client
	// buffers included.
	UsedBefore, UsedAfter int64
	// KeysBefore and KeysAfter are DBSIZE.
	KeysBefore, KeysAfter int64
	// SampleKey is a key found after the run (RANDOMKEY), and SampleBytes
	// its MEMORY USAGE; both empty when the database is.
	SampleKey   string
	SampleBytes int64
	// CommandsBefore and CommandsAfter sum the calls of INFO
	// commandstats, but for the commands this meter sends itself.
	CommandsBefore, CommandsAfter int64
}

// Commands is how many commands Redis ran during the run (warmup
// included), from every client but the meter.
func (m *RedisMemory) Commands() int64 { return m.CommandsAfter - m.CommandsBefore }

// meterCommands are the commandstats names of what the meter sends.
var meterCommands = map[string]bool{"info": true, "dbsize": true, "randomkey": true, "memory|usage": true, "memory": true}

// commandCalls sums the calls in an INFO commandstats reply, skipping
// meterCommands.
func commandCalls(info string) (int64, error) {
	var total int64
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || meterCommands[strings.TrimPrefix(name, "cmdstat_")] {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats line %q: %w", strings.TrimSpace(line), err)
		}
		total += n
	}
	return total, nil
}

// commands reads the command calls so far.
func (m *redisMeter) commands(ctx context.Context) (int64, error) {
	return infoValue(ctx, m, "commandstats", commandCalls)
}

// infoValue reads one INFO section and parses it.
func infoValue[T any](ctx context.Context, m *redisMeter, section string, parse func(string) (T, error)) (T, error) {
	var zero T
	info, err := m.info(ctx, section)
	if err != nil {
		return zero, err
	}
	v, err := parse(info)
	if err != nil {
		return zero, fmt.Errorf("redis %s: %w", m.addr, err)
	}
	return v, nil
}

// info reads one INFO section.
func (m *redisMeter) info(ctx context.Context, section string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	info, err := m.c.Info(ctx, section).Result()
	if err != nil {
		return "", fmt.Errorf("redis %s: INFO %s: %w", m.addr, section, err)
	}
	return info, nil
}

// NewKeys is how many keys the database gained.
func (m *RedisMemory) NewKeys() int64 { return m.KeysAfter - m.KeysBefore }

// BytesPerKey is the growth of used_memory per new key; 0 when no key
// was added.
func (m *RedisMemory) BytesPerKey() float64 {
	if m.NewKeys() <= 0 {
		return 0
	}
	return float64(m.UsedAfter-m.UsedBefore) / float64(m.NewKeys())
}

// redisMeter reads one Redis's memory figures.
type redisMeter struct {
	addr string
	c    *redis.Client
}

// redisTimeout bounds each command; the figures are worthless late.
const redisTimeout = 10 * time.Second

func newRedisMeter(addr string) (*redisMeter, error) {
	opts := &redis.Options{Addr: addr}
	if strings.Contains(addr, "://") {
		var err error
		if opts, err = redis.ParseURL(addr); err != nil {
			return nil, fmt.Errorf("-redis-info: %w", err)
		}
	}
	opts.PoolSize = 1
	opts.ReadTimeout, opts.WriteTimeout = redisTimeout, redisTimeout
	return &redisMeter{addr: addr, c: redis.NewClient(opts)}, nil
}

func (m *redisMeter) close() { _ = m.c.Close() }

// read returns used_memory and DBSIZE.
func (m *redisMeter) read(ctx context.Context) (used, keys int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	info, err := m.c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, 0, fmt.Errorf("redis %s: INFO memory: %w", m.addr, err)
	}
	if used, err = usedMemory(info); err != nil {
		return 0, 0, fmt.Errorf("redis %s: %w", m.addr, err)
	}
	if keys, err = m.c.DBSize(ctx).Result(); err != nil {
		return 0, 0, fmt.Errorf("redis %s: DBSIZE: %w", m.addr, err)
	}
	return used, keys, nil
}

// sample returns a key and its MEMORY USAGE; "" and 0 when there is none.
func (m *redisMeter) sample(ctx context.Context) (string, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	key, err := m.c.RandomKey(ctx).Result()
	if errors.Is(err, redis.Nil) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("redis %s: RANDOMKEY: %w", m.addr, err)
	}
	n, err := m.c.MemoryUsage(ctx, key).Result()
	if errors.Is(err, redis.Nil) { // expired in between
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("redis %s: MEMORY USAGE: %w", m.addr, err)
	}
	return key, n, nil
}

// usedMemory finds used_memory in an INFO reply.
func usedMemory(info string) (int64, error) {
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO memory: used_memory %q: %w", v, err)
		}
		return n, nil
	}
	return 0, errors.New("INFO memory has no used_memory")
}

// start reads the figures the run starts from.
func (m *redisMeter) start(ctx context.Context) (*RedisMemory, error) {
	used, keys, err := m.read(ctx)
	if err != nil {
		return nil, err
	}
	cmds, err := m.commands(ctx)
	if err != nil {
		return nil, err
	}
	return &RedisMemory{Addr: m.addr, UsedBefore: used, KeysBefore: keys, CommandsBefore: cmds}, nil
}

// finish reads the figures after the run into rm. It reads even when ctx
// is done: an interrupted run has still written its keys.
func (m *redisMeter) finish(ctx context.Context, rm *RedisMemory) error {
	ctx = context.WithoutCancel(ctx)
	used, keys, err := m.read(ctx)
	if err != nil {
		return err
	}
	rm.UsedAfter, rm.KeysAfter = used, keys
	if rm.CommandsAfter, err = m.commands(ctx); err != nil {
		return err
	}
	rm.SampleKey, rm.SampleBytes, err = m.sample(ctx)
	return err
}
