package limit

import "time"

// MaxQueueWait is the longest wait a queue may allow: far above what an
// Envoy filter timeout allows, low enough that a mistyped bound (300s
// for 300ms) is caught.
const MaxQueueWait = 30 * time.Second

// MaxQueueLength is the most waiters one tier's queue may hold on one
// replica: each is a held gRPC stream and a goroutine.
const MaxQueueLength = 100000

// Queue lets a request that a rate limit or concurrency cap refuses wait,
// on the replica that decided it, until capacity frees or its tier's
// bound passes (pkg/admission's Queue does the waiting).
type Queue struct {
	// Tiers are the tiers that may wait, highest priority first: a
	// waiter of an earlier tier retries before any of a later one.
	Tiers []QueueTier
	// Default is the bound of a tier Tiers does not list, and of every
	// request of a domain without tiers; it ranks after every listed
	// tier. MaxWait 0: such requests do not wait.
	Default QueueTier
	// Poll is how often a waiter retries when nothing on this replica
	// told it that capacity freed (another replica's release, a lease
	// that expired); 0 is DefaultQueuePoll.
	Poll time.Duration
}

// DefaultQueuePoll is Queue.Poll's default.
const DefaultQueuePoll = 250 * time.Millisecond

// QueueTier is how one tier waits.
type QueueTier struct {
	// Tier is the plan name ("" for Queue.Default).
	Tier string
	// MaxWait is the longest a request of the tier waits before it is
	// answered as refused; 0 means it does not wait.
	MaxWait time.Duration
	// MaxLength is the most requests of the tier that wait at once on
	// one replica; past it a refused request is answered at once.
	MaxLength int
	// Skip: the tier never waits; its refusals are answered at once, as
	// without a queue (a tier whose clients want a fast answer).
	Skip bool
}

// For returns how requests of tier wait and their rank (0 is the
// highest priority); ok is false when they do not wait.
func (q *Queue) For(tier string) (t QueueTier, rank int, ok bool) {
	if q == nil {
		return QueueTier{}, 0, false
	}
	for i, qt := range q.Tiers {
		if qt.Tier == tier {
			return qt, i, !qt.Skip && qt.MaxWait > 0 && qt.MaxLength > 0
		}
	}
	d := q.Default
	return d, len(q.Tiers), !d.Skip && d.MaxWait > 0 && d.MaxLength > 0
}

// PollEvery is Poll or its default.
func (q *Queue) PollEvery() time.Duration {
	if q.Poll > 0 {
		return q.Poll
	}
	return DefaultQueuePoll
}

// MaxWait is the longest bound of any tier: what must stay under the
// Envoy filter timeout.
func (q *Queue) MaxWait() time.Duration {
	m := q.Default.MaxWait
	for _, t := range q.Tiers {
		m = max(m, t.MaxWait)
	}
	return m
}
