package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The control loop's shared state (limit.Flights, Meters, Cells) on Redis.
//
// Each scope (or cell) is its own keys, under a hash tag that is a hash
// of the kind and the scope, spelled by limit.FlightsKey, MeterKey and
// CellKey beside the other keys' format in limit/key.go (a '}' in a scope
// cannot move it): every call touches one Cluster slot,
// and scopes spread over a cluster's masters. After the tag comes a kind
// letter no other key uses (f, m, c) and the scope with its length in
// front:
//
//	tg:{<16 hex>}:f:<len>:<scope>                  flights: sorted set, ID -> expiry ms
//	tg:{<16 hex>}:m:<len>:<scope>:<width>:<start>  a meter bucket: hash, name -> count, '' -> kept until ms
//	tg:{<16 hex>}:c:<len>:<key>                    a cell: hash, v value, n version, e expiry ms
//
// Every write is one script (flights.lua, meters.lua, cells.lua, run as
// Board's is: EVALSHA, and EVAL on NOSCRIPT), so it is atomic. Liveness
// is judged by the times callers pass, never by Redis's clock; each key
// also expires, by Redis's clock, sharedMargin after the latest thing it
// holds, so that a scope nobody writes any more leaves nothing behind.
// The commands these send beyond the Store's are ZCOUNT, ZRANGE, HGET and
// HINCRBY (the ACL grant in the README lists them).

//go:embed flights.lua
var flightsLua string

//go:embed meters.lua
var metersLua string

//go:embed cells.lua
var cellsLua string

// sharedMargin is how long (ms) a key outlives what it holds: Redis
// expires keys by its own clock, and the replicas that pass now may be a
// little behind it.
const sharedMargin = 1000

// Flights is a limit.Flights on Redis: a sorted set per scope. Begin and
// End are one script call each; Count is one pipelined ZCOUNT per scope
// (one round trip per master on a cluster).
type Flights struct {
	c      redis.UniversalClient
	script *redis.Script
}

var _ limit.Flights = (*Flights)(nil)

// NewFlights returns a Flights on c. It does not own c.
func NewFlights(c redis.UniversalClient) *Flights {
	return &Flights{c: c, script: redis.NewScript(flightsLua)}
}

func (f *Flights) run(ctx context.Context, mode string, now time.Time, scope string, ids []string, exp int64) (int64, error) {
	args := make([]any, 0, 4+len(ids))
	args = append(args, mode, now.UnixMilli(), exp, sharedMargin)
	for _, id := range ids {
		args = append(args, id)
	}
	n, err := f.script.Run(ctx, f.c, []string{limit.FlightsKey(scope)}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("%s flights of scope %q: %w", mode, scope, err)
	}
	return n, nil
}

// Begin implements limit.Flights.
func (f *Flights) Begin(ctx context.Context, now time.Time, scope string, ids []string, lease time.Duration) (int64, error) {
	exp, err := limit.CheckFlights(now, scope, ids, lease, true)
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return f.count1(ctx, now, scope)
	}
	return f.run(ctx, "begin", now, scope, ids, exp)
}

// End implements limit.Flights.
func (f *Flights) End(ctx context.Context, now time.Time, scope string, ids []string) (int64, error) {
	if _, err := limit.CheckFlights(now, scope, ids, 0, false); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return f.count1(ctx, now, scope)
	}
	return f.run(ctx, "end", now, scope, ids, 0)
}

func (f *Flights) count1(ctx context.Context, now time.Time, scope string) (int64, error) {
	n, err := f.Count(ctx, now, []string{scope})
	if err != nil {
		return 0, err
	}
	return n[0], nil
}

// Count implements limit.Flights. It reads only: flights expired at now
// are not counted, and the next Begin or End on their scope drops them.
func (f *Flights) Count(ctx context.Context, now time.Time, scopes []string) ([]int64, error) {
	if err := limit.CheckScopes(scopes); err != nil {
		return nil, err
	}
	out := make([]int64, len(scopes))
	if len(scopes) == 0 {
		return out, nil
	}
	live := "(" + strconv.FormatInt(now.UnixMilli(), 10)
	cmds := make([]*redis.IntCmd, len(scopes))
	_, err := f.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range scopes {
			cmds[i] = p.ZCount(ctx, limit.FlightsKey(s), live, "+inf")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count flights of %d scopes: %w", len(scopes), err)
	}
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// Meters is a limit.Meters on Redis: a hash per scope and bucket. Add is
// one script call; Sum is one pipelined HGETALL per bucket read, all in
// the scope's slot, so one round trip.
//
// A count that would pass the int64 range fails Add with Redis's error
// after the names before it were added (no caller counts that far).
type Meters struct {
	c      redis.UniversalClient
	script *redis.Script
}

var _ limit.Meters = (*Meters)(nil)

// NewMeters returns Meters on c. It does not own c.
func NewMeters(c redis.UniversalClient) *Meters {
	return &Meters{c: c, script: redis.NewScript(metersLua)}
}

// Add implements limit.Meters.
func (m *Meters) Add(ctx context.Context, now time.Time, scope string, bucket, keep time.Duration, counts map[string]int64) error {
	width, start, until, err := limit.CheckMeterAdd(now, scope, bucket, keep, counts)
	if err != nil {
		return err
	}
	args := make([]any, 0, 3+2*len(counts))
	args = append(args, now.UnixMilli(), until, sharedMargin)
	for name, n := range counts {
		if n > 0 { // a zero writes nothing, so Sum leaves the name out
			args = append(args, name, n)
		}
	}
	if len(args) == 3 {
		return nil
	}
	if err := m.script.Run(ctx, m.c, []string{limit.MeterKey(scope, width, start)}, args...).Err(); err != nil {
		return fmt.Errorf("add meters of scope %q: %w", scope, err)
	}
	return nil
}

// Sum implements limit.Meters.
func (m *Meters) Sum(ctx context.Context, now time.Time, scope string, bucket time.Duration, n int, partial bool) (map[string]int64, error) {
	width, err := limit.CheckMeterSum(scope, bucket, n)
	if err != nil {
		return nil, err
	}
	ms := now.UnixMilli()
	cur := limit.BucketStart(ms, width)
	last := cur - width
	if partial {
		last = cur
	}
	out := make(map[string]int64)
	if last < cur-int64(n)*width {
		return out, nil
	}
	cmds := make([]*redis.MapStringStringCmd, 0, n+1)
	_, err = m.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for start := cur - int64(n)*width; start <= last; start += width {
			cmds = append(cmds, p.HGetAll(ctx, limit.MeterKey(scope, width, start)))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sum meters of scope %q: %w", scope, err)
	}
	for _, c := range cmds {
		h := c.Val()
		until, err := strconv.ParseInt(h[""], 10, 64)
		if err != nil || until <= ms {
			continue // past its keep, or absent
		}
		for name, v := range h {
			if name == "" {
				continue
			}
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("sum meters of scope %q: name %q: %w", scope, name, err)
			}
			out[name] += x
		}
	}
	return out, nil
}

// Cells is a limit.Cells on Redis: a hash per cell. Load is one HGETALL,
// Swap one script call.
type Cells struct {
	c      redis.UniversalClient
	script *redis.Script
}

var _ limit.Cells = (*Cells)(nil)

// NewCells returns Cells on c. It does not own c.
func NewCells(c redis.UniversalClient) *Cells {
	return &Cells{c: c, script: redis.NewScript(cellsLua)}
}

// Load implements limit.Cells.
func (c *Cells) Load(ctx context.Context, now time.Time, key string) ([]byte, uint64, error) {
	if err := limit.CheckScope("cell key", key); err != nil {
		return nil, 0, err
	}
	h, err := c.c.HGetAll(ctx, limit.CellKey(key)).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("load cell %q: %w", key, err)
	}
	if len(h) == 0 {
		return nil, 0, nil
	}
	exp, err := strconv.ParseInt(h["e"], 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("load cell %q: expiry: %w", key, err)
	}
	if exp <= now.UnixMilli() {
		return nil, 0, nil
	}
	v, err := strconv.ParseUint(h["n"], 10, 64)
	if err != nil || v == 0 {
		return nil, 0, fmt.Errorf("load cell %q: version %q is not a positive integer", key, h["n"])
	}
	return append([]byte{}, h["v"]...), v, nil
}

// Swap implements limit.Cells.
func (c *Cells) Swap(ctx context.Context, now time.Time, key string, version uint64, value []byte, ttl time.Duration) (bool, uint64, error) {
	exp, err := limit.CheckCellSwap(now, key, value, ttl)
	if err != nil {
		return false, 0, err
	}
	rep, err := c.script.Run(ctx, c.c, []string{limit.CellKey(key)},
		now.UnixMilli(), strconv.FormatUint(version, 10), value, exp, sharedMargin).Slice()
	if err != nil {
		return false, 0, fmt.Errorf("swap cell %q: %w", key, err)
	}
	if len(rep) != 2 {
		return false, 0, fmt.Errorf("swap cell %q: %d values in the reply, want 2", key, len(rep))
	}
	ok, okInt := rep[0].(int64)
	s, okStr := rep[1].(string)
	if !okInt || !okStr {
		return false, 0, fmt.Errorf("swap cell %q: reply %T, %T; want an integer and a string", key, rep[0], rep[1])
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return false, 0, fmt.Errorf("swap cell %q: version: %w", key, err)
	}
	return ok == 1, v, nil
}
