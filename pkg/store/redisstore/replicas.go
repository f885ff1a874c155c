package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// replicasKey is the hash where the replicas sharing a Redis count each
// other: field = replica, value = "0:expiresAtMs", board.lua's format
// (see Board). Its hash tag is its own, so on a Cluster it is one slot.
const replicasKey = "tg:{replicas}"

// Replicas counts the replicas that share a Redis: each one beats every
// so often, and the live beats are the count. Store failure policies use
// it to split a limit between the replicas (admission.FailurePolicy).
type Replicas struct {
	c      redis.UniversalClient
	script *redis.Script
}

// NewReplicas returns a Replicas on c. It does not own c.
func NewReplicas(c redis.UniversalClient) *Replicas {
	return &Replicas{c: c, script: redis.NewScript(boardLua)}
}

// Beat marks replica live until now+ttl, drops the replicas whose beat
// expired at now, and returns how many are live, replica included: one
// script call. Expiry follows the callers' clocks, as Board's does.
func (r *Replicas) Beat(ctx context.Context, now time.Time, replica string, ttl time.Duration) (int, error) {
	if replica == "" {
		return 0, errors.New("replicas: empty replica name")
	}
	if ttl < time.Millisecond {
		return 0, fmt.Errorf("replicas: ttl %v is under 1ms", ttl)
	}
	exp := now.Add(ttl + time.Millisecond - 1).UnixMilli()
	n, err := r.script.Run(ctx, r.c, []string{replicasKey}, now.UnixMilli(), replica, "0", exp, boardMargin).Int()
	if err != nil {
		return 0, fmt.Errorf("beat as replica %q: %w", replica, err)
	}
	return n, nil
}
