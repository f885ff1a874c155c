package limit

import (
	"context"
	"time"
)

// The shared state of the overload control loop (issue 13): what every
// replica must see alike to shed alike. Like Board, these live beside
// Store so that memstore and redisstore implement them and storetest
// checks them without importing the packages that use them. Every method
// is atomic per scope or key; times are the caller's (expiry follows the
// now callers pass, not the store's clock).

// Flights counts requests in flight per scope (a model, or a model and a
// tier), shared by every replica: an admission begins a flight under its
// request ID, its completion (ext_proc's end of stream or the access log
// entry, whichever comes first) ends it, and a lease ends one whose
// completion was lost. Begin and End are idempotent per ID, so both
// completion channels may end the same flight.
type Flights interface {
	// Begin adds ids to scope, each live until now+lease (an id in flight
	// already has its lease renewed), and returns how many are live in
	// scope after. lease is at least a millisecond; an empty id is an
	// error and changes nothing.
	Begin(ctx context.Context, now time.Time, scope string, ids []string, lease time.Duration) (int64, error)
	// End removes ids from scope (unknown ones are ignored) and returns
	// how many are live after.
	End(ctx context.Context, now time.Time, scope string, ids []string) (int64, error)
	// Count returns, for each scope, how many flights are live at now.
	Count(ctx context.Context, now time.Time, scopes []string) ([]int64, error)
}

// Meters are shared event counters per scope in time buckets: each
// replica adds its local counts in batches (one call per tick, not one per
// request), and any replica reads the cluster's sums.
type Meters interface {
	// Add adds counts (name -> n, n >= 0) to scope's bucket holding now;
	// buckets are bucket wide and aligned to the Unix epoch, and are kept
	// at least keep past their end.
	Add(ctx context.Context, now time.Time, scope string, bucket, keep time.Duration, counts map[string]int64) error
	// Sum returns, per name, the sum over scope's n whole buckets before
	// the one holding now, and the partial bucket holding now as well when
	// partial is true. Names with no counts are absent.
	Sum(ctx context.Context, now time.Time, scope string, bucket time.Duration, n int, partial bool) (map[string]int64, error)
}

// Cells are small shared records with compare-and-swap, for state that
// one replica computes and every replica must read alike (the controller's
// shed fractions, a step and its hold).
type Cells interface {
	// Load returns key's value and version; an absent or expired key is
	// nil and version 0.
	Load(ctx context.Context, now time.Time, key string) (value []byte, version uint64, err error)
	// Swap sets key to value, live until now+ttl, if its version is still
	// version (0: absent or expired). It returns whether it did, and the
	// key's version after: the new one, or the current one when another
	// writer got there first.
	Swap(ctx context.Context, now time.Time, key string, version uint64, value []byte, ttl time.Duration) (bool, uint64, error)
}
