package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

//go:embed board.lua
var boardLua string

// boardMargin is how long (ms) a board key outlives its latest entry:
// Redis expires keys by its own clock, and the replicas that pass now may
// be a little behind it. Readers judge liveness by their own now.
const boardMargin = 1000

// Board is a limit.Board on Redis, for the replicas of one deployment.
//
// A scope's published scores are one hash, tg:{pressure}:<scope>, field =
// replica, value = "score:expiresAtMs"; its pushed score is a string,
// tg:{pressure}pushed:<scope>, holding the same "score:expiresAtMs" (the
// two prefixes differ before the scope, so no scope name makes one key
// the other's). Every key has the hash tag {pressure}: a scope's reads
// and writes touch one Cluster slot, and there are few scopes.
//
// Publish is one script call (board.lua) that sets the replica's entry,
// drops the entries expired at the caller's now and sets the hash's TTL
// to its latest entry's, plus a margin. Expiry is judged by the times
// callers pass; a replica whose clock runs ahead drops another's entry up
// to that much early, which NTP keeps to milliseconds.
type Board struct {
	c      redis.UniversalClient
	script *redis.Script
}

var _ limit.Board = (*Board)(nil)

// NewBoard returns a Board on c. It does not own c: a Store and a Board
// usually share one client, which the Store closes.
func NewBoard(c redis.UniversalClient) *Board {
	return &Board{c: c, script: redis.NewScript(boardLua)}
}

func boardValue(score float64, exp int64) string {
	return strconv.FormatFloat(score, 'g', -1, 64) + ":" + strconv.FormatInt(exp, 10)
}

// parseBoardValue reads "score:expiresAtMs", or a bare "score" when
// bare: an outside controller may write the pushed key itself, as
// SET tg:{pressure}pushed:<scope> 0.85 PX 60000, and then the key's own
// TTL is the entry's.
func parseBoardValue(v string, bare bool) (score float64, exp int64, err error) {
	s, e, ok := strings.Cut(v, ":")
	if !ok && !bare {
		return 0, 0, fmt.Errorf("board value %q: no expiry", v)
	}
	if score, err = strconv.ParseFloat(s, 64); err != nil {
		return 0, 0, fmt.Errorf("board value %q: %w", v, err)
	}
	if math.IsNaN(score) || score < 0 || score > 1 {
		return 0, 0, fmt.Errorf("board value %q: score is not in [0,1]", v)
	}
	if !ok {
		return score, math.MaxInt64, nil
	}
	if exp, err = strconv.ParseInt(e, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("board value %q: %w", v, err)
	}
	return score, exp, nil
}

// Publish implements limit.Board.
func (b *Board) Publish(ctx context.Context, now time.Time, scope, replica string, score float64, ttl time.Duration) error {
	exp, err := limit.BoardExpiry(now, scope, score, ttl)
	if err != nil {
		return err
	}
	if replica == "" {
		return errors.New("board: empty replica name")
	}
	args := []any{now.UnixMilli(), replica, strconv.FormatFloat(score, 'g', -1, 64), exp, boardMargin}
	if err := b.script.Run(ctx, b.c, []string{limit.BoardKey(scope)}, args...).Err(); err != nil {
		return fmt.Errorf("publish pressure of scope %q: %w", scope, err)
	}
	return nil
}

// Push implements limit.Board.
func (b *Board) Push(ctx context.Context, now time.Time, scope string, score float64, ttl time.Duration) error {
	exp, err := limit.BoardExpiry(now, scope, score, ttl)
	if err != nil {
		return err
	}
	px := time.Duration(exp-now.UnixMilli()+boardMargin) * time.Millisecond
	if err := b.c.Set(ctx, limit.PushedKey(scope), boardValue(score, exp), px).Err(); err != nil {
		return fmt.Errorf("push pressure of scope %q: %w", scope, err)
	}
	return nil
}

// Scores implements limit.Board: one pipelined round trip (HGETALL, GET)
// to the scope's slot.
func (b *Board) Scores(ctx context.Context, now time.Time, scope string) (limit.Scores, error) {
	var (
		all    *redis.MapStringStringCmd
		pushed *redis.StringCmd
	)
	_, err := b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, limit.BoardKey(scope))
		pushed = p.Get(ctx, limit.PushedKey(scope))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return limit.Scores{}, fmt.Errorf("read pressure of scope %q: %w", scope, err)
	}
	ms := now.UnixMilli()
	var out limit.Scores
	m, err := all.Result()
	if err != nil {
		return limit.Scores{}, fmt.Errorf("read pressure of scope %q: %w", scope, err)
	}
	for r, v := range m {
		score, exp, err := parseBoardValue(v, false)
		if err != nil {
			return limit.Scores{}, fmt.Errorf("read pressure of scope %q, replica %q: %w", scope, r, err)
		}
		if exp > ms {
			out.Replicas = append(out.Replicas, limit.ReplicaScore{Replica: r, Score: score})
		}
	}
	slices.SortFunc(out.Replicas, func(a, b limit.ReplicaScore) int { return strings.Compare(a.Replica, b.Replica) })
	v, err := pushed.Result()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return limit.Scores{}, fmt.Errorf("read pushed pressure of scope %q: %w", scope, err)
	default:
		score, exp, err := parseBoardValue(v, true)
		if err != nil {
			return limit.Scores{}, fmt.Errorf("read pushed pressure of scope %q: %w", scope, err)
		}
		if exp > ms {
			out.Pushed, out.HasPushed = score, true
		}
	}
	return out, nil
}
