package limit

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Board is where replicas share pressure scores: each replica publishes
// its own score per scope, an outside controller may push one, and every
// replica reads them all back. It lives here, beside Store, so that the
// stores implement it and storetest checks it without importing the
// pressure package that uses it.
//
// The contract every Board keeps (storetest.RunBoard checks it):
//   - A score is a float64 in [0,1]; a ttl is at least a millisecond.
//     Anything else is an error and changes nothing.
//   - An entry written at now with ttl is live while the reader's now is
//     before its expiry, now.UnixMilli() + ttl rounded up to whole
//     milliseconds, and gone from then on: expiry follows the times
//     callers pass, not the store's clock.
//   - A replica has one entry per scope; publishing again replaces it
//     (score and expiry), and so does pushing again for the pushed entry.
//   - Scopes are independent.
type Board interface {
	// Publish sets replica's score for scope, live until now+ttl.
	Publish(ctx context.Context, now time.Time, scope, replica string, score float64, ttl time.Duration) error
	// Push sets the score an outside controller gives scope, live until
	// now+ttl.
	Push(ctx context.Context, now time.Time, scope string, score float64, ttl time.Duration) error
	// Scores returns scope's entries that are live at now.
	Scores(ctx context.Context, now time.Time, scope string) (Scores, error)
}

// Scores are the live entries of one scope on a Board.
type Scores struct {
	// Replicas are the published scores, sorted by replica name.
	Replicas []ReplicaScore
	// Pushed is the pushed score, meaningful when HasPushed.
	Pushed    float64
	HasPushed bool
}

// ReplicaScore is one replica's published score.
type ReplicaScore struct {
	Replica string
	Score   float64
}

// BoardExpiry checks a Board write's arguments and returns the Unix ms at
// which the entry expires. Every Board calls it (Publish also rejects an
// empty replica name), so they reject the same writes with the same
// errors.
func BoardExpiry(now time.Time, scope string, score float64, ttl time.Duration) (int64, error) {
	switch {
	case scope == "":
		return 0, fmt.Errorf("board: empty scope")
	case math.IsNaN(score) || score < 0 || score > 1:
		return 0, fmt.Errorf("board: scope %q: score %v is not in [0,1]", scope, score)
	case ttl < time.Millisecond:
		return 0, fmt.Errorf("board: scope %q: ttl %v is under 1ms", scope, ttl)
	}
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	return now.UnixMilli() + int64(ms), nil
}
