package admission

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// maxOwedKeys bounds the keys whose local admissions wait to be written
// back. Past it, new ones are not remembered: the store then never
// counts them, which the automatic share allows for (see localShare).
const maxOwedKeys = 100_000

// owed is what a replica admitted locally, by store_failure local, and
// the store has not counted yet. Each key's debt goes to the store with
// the next decision on that key that reaches it, as a Force charge ahead
// of the decision's own: the store then counts it before it decides, and
// the replicas that still reached it meanwhile see it from then on. So a
// window in which the store was unreachable and then answered again
// admits about its limit, not the limit plus the local admissions.
//
// A window's debt is units: a unit counts the same whatever the tier of
// the request that spent it or carries it back (a tier only moves the
// limit), and units whose window has passed since they were admitted
// count in no window any more and are dropped. A token bucket's debt is
// time, as the bucket keeps it: each local admission adds its cost at its
// own price per unit (Window/Amount of the limit it was admitted under,
// which the plan multiplier scales), and the debt refills at one
// millisecond per millisecond, as the store's bucket would have. The
// write-back converts what is left into units at the carrier's price,
// rounded up. Kept as units, premium admissions carried back by a free
// request cost three times what they did, and a long outage's admissions
// came back at once though the bucket had refilled them as they went.
//
// A write-back whose call failed before reaching the store (the circuit
// open, a refused connection) is sent again with the next decision. One
// whose call timed out is taken as counted: with a slow store it almost
// always was, and sending it again with every decision that times out
// would count it many times over, refusing for nothing; when it was not,
// the store misses that debt, which the automatic share's bound allows
// for. Concurrency leases are not written back: they end by themselves.
type owed struct {
	keys atomic.Int64 // entries in m: Decide looks no further when 0
	mu   sync.Mutex
	m    map[string]owedKey
}

// owedKey is one key's debt: units for a window, time for a token bucket
// (a key names its algorithm, so never both).
type owedKey struct {
	units   int64   // window: units not sent yet
	until   int64   // window: Unix ms after which the units count in no window
	sending int64   // window: units in a write-back under way
	debt    float64 // token bucket: ms owed as of at, not sent yet
	at      int64   // token bucket: Unix ms of debt
	sendMs  float64 // token bucket: ms in a write-back under way
	busy    bool    // a write-back is under way
}

// bucketDebt is k's token bucket debt at ms: what is left of it after the
// refill since it was noted.
func (k *owedKey) bucketDebt(ms int64) float64 {
	return max(0, k.debt-float64(ms-k.at))
}

// empty reports whether k owes nothing at ms and sends nothing.
func (k *owedKey) empty(ms int64) bool {
	return !k.busy && k.units == 0 && k.bucketDebt(ms) == 0
}

// add notes that c, a window or token bucket charge, was kept locally at
// now.
func (o *owed) add(now time.Time, c *limit.Charge) {
	if c.Cost <= 0 || c.Algorithm > limit.TokenBucket || c.Algorithm == limit.TokenBucket && c.Amount == 0 {
		return // a bucket of 0 has no price per unit, and admitted nothing
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[string]owedKey)
	}
	k, ok := o.m[c.Key]
	if !ok && len(o.m) >= maxOwedKeys {
		return
	}
	ms := now.UnixMilli()
	if c.Algorithm == limit.TokenBucket {
		T := limit.EmissionMillis(c)
		k.debt, k.at = k.bucketDebt(ms)+float64(c.Cost)*T, ms
	} else {
		k.units += c.Cost
		k.until = max(k.until, now.Add(c.Window).UnixMilli())
	}
	o.m[c.Key] = k
	o.keys.Store(int64(len(o.m)))
}

// take returns, for the keys of charges that are owed a debt, a Force
// charge of it (ahead of the decision's own; a token bucket's priced at
// that charge's T), and marks them as being sent; nil when none is owed.
func (o *owed) take(now time.Time, charges []limit.Charge) []limit.Charge {
	ms := now.UnixMilli()
	var out []limit.Charge
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range charges {
		c := &charges[i]
		k, ok := o.m[c.Key]
		if !ok {
			continue
		}
		if !k.busy && (k.units > 0 && ms >= k.until || k.empty(ms)) {
			delete(o.m, c.Key)
			continue
		}
		if k.busy || c.Algorithm > limit.TokenBucket || c.Algorithm == limit.TokenBucket && c.Amount == 0 {
			continue
		}
		w := limit.Charge{Key: c.Key, Algorithm: c.Algorithm, Amount: c.Amount, Window: c.Window,
			Burst: c.Burst, Buckets: c.Buckets, Cost: k.units, Force: true}
		if c.Algorithm == limit.TokenBucket {
			d := k.bucketDebt(ms)
			T := limit.EmissionMillis(c)
			// Rounded up, so the store is never owed less than the
			// admissions cost; the tolerance keeps a debt of whole units
			// at this price from costing one more to a rounding error.
			w.Cost = int64(math.Ceil(d/T - 1e-9))
			k.sendMs, k.debt, k.at = d, 0, ms
		} else {
			k.sending, k.units = k.units, 0
		}
		if w.Cost <= 0 {
			continue
		}
		out = append(out, w)
		k.busy = true
		o.m[c.Key] = k
	}
	o.keys.Store(int64(len(o.m)))
	return out
}

// settle ends the write-backs of sent, taken at now: counted by the store
// when done, else owed again.
func (o *owed) settle(now time.Time, sent []limit.Charge, done bool) {
	ms := now.UnixMilli()
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range sent {
		k, ok := o.m[sent[i].Key]
		if !ok {
			continue
		}
		if !done {
			k.units += k.sending
			k.debt, k.at = k.bucketDebt(ms)+k.sendMs, ms
		}
		k.sending, k.sendMs, k.busy = 0, 0, false
		if k.empty(ms) {
			delete(o.m, sent[i].Key)
			continue
		}
		o.m[sent[i].Key] = k
	}
	o.keys.Store(int64(len(o.m)))
}

// applyOwed is Decide's store call: charges, preceded by the debts owed
// on their keys, if any.
func (l *Limiter) applyOwed(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	if l.failure == nil || l.failure.owed.keys.Load() == 0 {
		return l.store.Apply(ctx, now, charges, res)
	}
	sent := l.failure.owed.take(now, charges)
	if len(sent) == 0 {
		return l.store.Apply(ctx, now, charges, res)
	}
	all := append(sent, charges...)
	allRes := make([]limit.Result, len(all))
	admitted, err := l.store.Apply(ctx, now, all, allRes)
	l.failure.owed.settle(now, sent, err == nil || timedOut(err))
	copy(res, allRes[len(sent):])
	return admitted, err
}

// timedOut reports whether err is a call that ran out of time, after which
// the store may well have done what it was asked.
func timedOut(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &t) && t.Timeout()
}
