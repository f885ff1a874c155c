package memstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Board is the in-process limit.Board: the scores of one replica's own
// scopes, for a deployment without Redis (where it is the only replica)
// and for tests. The zero value is not usable; call NewBoard.
//
// Expired entries of a scope are dropped when that scope is written, by
// the writer's now; a scope nobody writes any more keeps its last entries
// (a few bytes per scope, and scopes are configured, not per request).
type Board struct {
	mu     sync.Mutex
	scopes map[string]*boardScope
}

var _ limit.Board = (*Board)(nil)

type boardScope struct {
	replicas map[string]boardEntry
	pushed   boardEntry // expires 0: none
}

type boardEntry struct {
	score   float64
	expires int64 // Unix ms
}

// NewBoard returns an empty Board.
func NewBoard() *Board { return &Board{scopes: make(map[string]*boardScope)} }

func (b *Board) scope(name string) *boardScope {
	s := b.scopes[name]
	if s == nil {
		s = &boardScope{replicas: make(map[string]boardEntry)}
		b.scopes[name] = s
	}
	return s
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
	if err := ctx.Err(); err != nil {
		return err
	}
	ms := now.UnixMilli()
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.scope(scope)
	for r, e := range s.replicas {
		if e.expires <= ms {
			delete(s.replicas, r)
		}
	}
	s.replicas[replica] = boardEntry{score: score, expires: exp}
	return nil
}

// Push implements limit.Board.
func (b *Board) Push(ctx context.Context, now time.Time, scope string, score float64, ttl time.Duration) error {
	exp, err := limit.BoardExpiry(now, scope, score, ttl)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scope(scope).pushed = boardEntry{score: score, expires: exp}
	return nil
}

// Scores implements limit.Board.
func (b *Board) Scores(ctx context.Context, now time.Time, scope string) (limit.Scores, error) {
	if err := ctx.Err(); err != nil {
		return limit.Scores{}, err
	}
	ms := now.UnixMilli()
	var out limit.Scores
	b.mu.Lock()
	if s := b.scopes[scope]; s != nil {
		for r, e := range s.replicas {
			if e.expires > ms {
				out.Replicas = append(out.Replicas, limit.ReplicaScore{Replica: r, Score: e.score})
			}
		}
		if s.pushed.expires > ms {
			out.Pushed, out.HasPushed = s.pushed.score, true
		}
	}
	b.mu.Unlock()
	slices.SortFunc(out.Replicas, func(a, b limit.ReplicaScore) int { return strings.Compare(a.Replica, b.Replica) })
	return out, nil
}
