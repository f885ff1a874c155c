package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

//go:embed breaker.lua
var breakerLua string

// Breakers is the Redis breaker.Store: each operation is one EVALSHA of
// breaker.lua on the breaker's one key (a hash), so it is atomic on a
// single node, Sentinel or Cluster alike. Allow on a closed breaker reads
// and writes nothing else; it is still a round trip per decision.
type Breakers struct {
	c      redis.Scripter
	script *redis.Script
}

var _ breaker.Store = (*Breakers)(nil)

// NewBreakers returns a Breakers on c. It does not own c.
func NewBreakers(c redis.Scripter) *Breakers {
	return &Breakers{c: c, script: redis.NewScript(breakerLua)}
}

// Breakers returns a breaker.Store sharing the Store's client.
func (s *Store) Breakers() *Breakers { return NewBreakers(s.c) }

// reply is breaker.lua's answer.
type reply struct {
	state      breaker.State
	from       int64
	allowed    bool
	probeID    string
	retryAfter int64
	failures   int64
	until      int64
	probes     int64
	successes  int64
	volume     int64
}

func (b *Breakers) run(ctx context.Context, mode string, now time.Time, key string, p breaker.Params, r breaker.Report) (reply, error) {
	ok := "0"
	if r.Success {
		ok = "1"
	}
	keys := []string{key}
	if mode == "record" && !r.Success && r.Once != "" {
		keys = append(keys, breaker.OnceKey(key, r.Once))
	}
	rep, err := b.script.Run(ctx, b.c, keys, mode, now.UnixMilli(),
		p.FailureThreshold, p.Window.Milliseconds(), p.OpenFor.Milliseconds(),
		p.HalfOpenProbes, p.CloseAfter, p.ProbeLease.Milliseconds(), breaker.Retain.Milliseconds(),
		ok, r.ProbeID, breaker.OnceTTL(p).Milliseconds(),
		strconv.FormatFloat(p.FailureRate, 'g', -1, 64), p.MinRequests, r.Successes).Slice()
	if err != nil {
		return reply{}, fmt.Errorf("run breaker script: %w", err)
	}
	return decodeBreaker(rep)
}

func decodeBreaker(rep []any) (reply, error) {
	if len(rep) != 10 {
		return reply{}, fmt.Errorf("breaker script: %d values in the reply, want 10", len(rep))
	}
	var n [10]int64
	for i, v := range rep {
		if i == 3 {
			continue
		}
		x, ok := v.(int64)
		if !ok {
			return reply{}, fmt.Errorf("breaker script: reply[%d] is %T, want an integer", i, v)
		}
		n[i] = x
	}
	id, ok := rep[3].(string)
	if !ok {
		return reply{}, fmt.Errorf("breaker script: reply[3] is %T, want a string", rep[3])
	}
	if n[0] < 0 || n[0] > int64(breaker.Open) || n[1] < -1 || n[1] > int64(breaker.Open) {
		return reply{}, fmt.Errorf("breaker script: bad state %d or transition %d", n[0], n[1])
	}
	return reply{
		state: breaker.State(n[0]), from: n[1], allowed: n[2] == 1, probeID: id,
		retryAfter: n[4], failures: n[5], until: n[6], probes: n[7], successes: n[8], volume: n[9],
	}, nil
}

func (r reply) transition() breaker.Transition {
	if r.from < 0 {
		return breaker.Transition{From: r.state, To: r.state}
	}
	return breaker.Transition{From: breaker.State(r.from), To: r.state}
}

// Allow implements breaker.Store.
func (b *Breakers) Allow(ctx context.Context, now time.Time, key string, p breaker.Params, probeID string) (breaker.Verdict, breaker.Transition, error) {
	if !breaker.ValidProbeID(probeID) {
		return breaker.Verdict{}, breaker.Transition{}, fmt.Errorf("%w: a probe ID must be 1 to %d hex digits", limit.ErrInvalid, breaker.MaxProbeIDBytes)
	}
	r, err := b.run(ctx, "allow", now, key, p, breaker.Report{ProbeID: probeID})
	if err != nil {
		return breaker.Verdict{}, breaker.Transition{}, err
	}
	v := breaker.Verdict{
		Allowed:    r.allowed,
		Probe:      r.probeID != "",
		ProbeID:    r.probeID,
		RetryAfter: time.Duration(r.retryAfter) * time.Millisecond,
		State:      r.state,
	}
	return v, r.transition(), nil
}

// Record implements breaker.Store. A failure with a Once is one script
// call on two keys of one hash tag: the breaker and its marker.
func (b *Breakers) Record(ctx context.Context, now time.Time, key string, p breaker.Params, r breaker.Report) (breaker.Transition, error) {
	if err := breaker.CheckReport(r); err != nil {
		return breaker.Transition{}, err
	}
	rep, err := b.run(ctx, "record", now, key, p, r)
	if err != nil {
		return breaker.Transition{}, err
	}
	return rep.transition(), nil
}

// Release implements breaker.Store.
func (b *Breakers) Release(ctx context.Context, now time.Time, key string, p breaker.Params, probeID string) error {
	_, err := b.run(ctx, "release", now, key, p, breaker.Report{ProbeID: probeID})
	return err
}

// State implements breaker.Store.
func (b *Breakers) State(ctx context.Context, now time.Time, key string, p breaker.Params) (breaker.Status, error) {
	r, err := b.run(ctx, "state", now, key, p, breaker.Report{})
	if err != nil {
		return breaker.Status{}, err
	}
	st := breaker.Status{State: r.state, Failures: uint64(r.failures), Probes: uint64(r.probes), Successes: uint64(r.successes), Volume: uint64(r.volume)}
	if r.state == breaker.Open {
		st.OpenUntil = time.UnixMilli(r.until)
	}
	return st, nil
}
