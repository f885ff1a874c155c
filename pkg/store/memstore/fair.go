package memstore

import (
	"math"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fairShared reports whether ch goes through its fair gate: a charge or a
// check on a rate or token limit with a policy. A refund or a Force charge
// records what was already spent, so it asks nobody; Concurrency and Once
// are store primitives no rule can share.
func fairShared(ch *limit.Charge) bool {
	return ch.Fair.Policy != nil && ch.Cost >= 0 && !ch.Force && ch.Algorithm <= limit.TokenBucket
}

// gatherFair adds a slot for the fair state of every fair-shared charge
// and the shards it falls in; it leaves sc.fair empty when there is none,
// so a decision without fair charges pays one loop.
func (sc *scratch) gatherFair(s *Store, charges []limit.Charge, locked *shardSet) {
	has := false
	for i := range charges {
		if fairShared(&charges[i]) {
			has = true
			break
		}
	}
	if !has {
		return
	}
	for i := range charges {
		ch := &charges[i]
		sc.fits = append(sc.fits, false)
		if !fairShared(ch) {
			sc.fair = append(sc.fair, -1)
			continue
		}
		j := sc.slotOf(s, limit.FairStateKey(ch.Key), true, locked)
		sc.slots[j].last = i
		sc.fair = append(sc.fair, j)
	}
}

// gate asks charge i's fair gate, when it has one, whether it may step
// its counter, with the room the counter has before it (the charges
// before it on the same key included). A gate denial answers as a charge
// that does not fit: its RetryAfter is fairRetry.
func (sc *scratch) gate(i int, ch *limit.Charge, ms int64) (fits bool, retry int64) {
	if len(sc.fair) == 0 || sc.fair[i] < 0 {
		return true, 0
	}
	c := &sc.slots[sc.slot[i]].c
	room, _ := c.Report(ch, ms)
	fs := &sc.slots[sc.fair[i]].fs
	if fs.Gate(ch.Fair.Policy, ms, ch.Fair.Member, ch.Fair.Weight, ch.Cost, int64(min(room, math.MaxInt64))) {
		return true, 0
	}
	// The counter records the time as a step would (its high-water mark).
	c.Touch(ch, ms)
	return false, fairRetry(ch, ms)
}

// fairRetry is a gate denial's RetryAfter (ms): when room next frees
// and the gate may answer otherwise. A window frees room at its next
// bucket boundary (a fixed window's bucket is the window); a token bucket
// frees one token every emission interval.
func fairRetry(ch *limit.Charge, ms int64) int64 {
	if ch.Algorithm == limit.TokenBucket {
		// Saturated: an Amount of 0 makes it +Inf, whose conversion to
		// an integer Go leaves to the platform (1 on amd64).
		return max(int64(min(math.Ceil(limit.EmissionMillis(ch)), float64(limit.MaxWindow/time.Millisecond))), 1)
	}
	return limit.BucketEnd(ch, ms) - ms
}

// record writes every fair charge's outcome into its working state, in
// charge order, once the decision's outcome is known: FairDenied when the
// charge (its gate or its counter) did not fit, FairAdmitted when the
// decision was admitted, FairElsewhere when another charge denied it.
func (sc *scratch) record(charges []limit.Charge, admitted bool, ms int64) {
	for i, j := range sc.fair {
		if j < 0 {
			continue
		}
		ch := &charges[i]
		out := limit.FairElsewhere
		switch {
		case !sc.fits[i]:
			out = limit.FairDenied
		case admitted:
			out = limit.FairAdmitted
		}
		sc.slots[j].fs.Record(ch.Fair.Policy, ms, ch.Fair.Member, ch.Fair.Weight, ch.Cost, out)
	}
}

// loadFair sets the working fair state to the stored one (empty when
// absent or expired), in the slot's own buffer.
func (sl *slot) loadFair() {
	keys := sl.fs.Keys[:0]
	if sl.live && sl.e.fair != nil {
		sl.fs = limit.FairState{Clock: sl.e.fair.Clock, Keys: append(keys, sl.e.fair.Keys...)}
		return
	}
	sl.fs = limit.FairState{Keys: keys}
}

// fairTTL is how long a fair state lives after the last decision that
// recorded into it: Backlog + the window, as the Redis store keeps it.
// Past Backlog no key has demand or is waiting, and a window later the
// counter has forgotten what they were admitted, so a fresh state owes
// them what the old one would have, within Credit.
func fairTTL(ch *limit.Charge) int64 {
	return ch.Fair.Policy.Backlog.Milliseconds() + limit.WindowMillis(ch)
}

// commitFair stores a fair slot's working state, with its shard locked,
// and reports whether it added a key.
func (s *Store) commitFair(sl *slot, ch *limit.Charge, now int64) (added bool) {
	sh := &s.shards[sl.shard]
	e := sl.e
	if e == nil {
		e = &entry{}
		sh.m[sl.key] = e
	}
	if e.fair == nil {
		e.fair = &limit.FairState{}
	}
	e.fair.Clock = sl.fs.Clock
	e.fair.Keys = append(e.fair.Keys[:0], sl.fs.Keys...)
	e.expires = now + fairTTL(ch)
	return sl.e == nil
}
