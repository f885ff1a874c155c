package limit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// maxOwedKeys bounds the keys whose local admissions wait to be written
// back. Past it, new ones are not remembered: the store then never
// counts them, which the automatic share allows for (see localShare).
const maxOwedKeys = 100_000

// owed is what a replica admitted locally, by store_failure local, and
// the store has not counted yet. Each key's units go to the store with
// the next decision on that key that reaches it, as a Force charge ahead
// of the decision's own: the store then counts them before it decides,
// and the replicas that still reached it meanwhile see them from then on.
// So a window in which the store was unreachable and then answered again
// admits about its limit, not the limit plus the local admissions.
//
// A write-back whose call failed before reaching the store (the circuit
// open, a refused connection) is sent again with the next decision. One
// whose call timed out is taken as counted: with a slow store it almost
// always was, and sending it again with every decision that times out
// would count it many times over, refusing for nothing; when it was not,
// the store misses those units, which the automatic share's bound allows
// for. Units whose window has passed since they were admitted count in no
// window any more and are dropped. Concurrency leases are not written
// back: they end by themselves.
type owed struct {
	keys atomic.Int64 // entries in m: Decide looks no further when 0
	mu   sync.Mutex
	m    map[string]owedKey
}

type owedKey struct {
	units   int64
	until   int64 // Unix ms after which the units count in no window
	sending int64 // units in a write-back under way
}

// add notes that c, a window or token bucket charge, was kept locally at
// now.
func (o *owed) add(now time.Time, c *Charge) {
	if c.Cost <= 0 || c.Algorithm > TokenBucket {
		return
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
	k.units += c.Cost
	k.until = max(k.until, now.Add(c.Window).UnixMilli())
	o.m[c.Key] = k
	o.keys.Store(int64(len(o.m)))
}

// take returns, for the keys of charges that are owed units, a Force
// charge of them (ahead of the decision's own), and marks them as being
// sent; nil when none is owed.
func (o *owed) take(now time.Time, charges []Charge) []Charge {
	ms := now.UnixMilli()
	var out []Charge
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range charges {
		c := &charges[i]
		k, ok := o.m[c.Key]
		if !ok {
			continue
		}
		if ms >= k.until && k.sending == 0 {
			delete(o.m, c.Key)
			continue
		}
		if k.sending > 0 || k.units == 0 || c.Algorithm > TokenBucket {
			continue
		}
		dup := false
		for j := range out {
			dup = dup || out[j].Key == c.Key
		}
		if dup {
			continue
		}
		out = append(out, Charge{Key: c.Key, Algorithm: c.Algorithm, Amount: c.Amount, Window: c.Window,
			Burst: c.Burst, Buckets: c.Buckets, Cost: k.units, Force: true})
		k.sending, k.units = k.units, 0
		o.m[c.Key] = k
	}
	o.keys.Store(int64(len(o.m)))
	return out
}

// settle ends the write-backs of sent: counted by the store when done,
// else owed again.
func (o *owed) settle(sent []Charge, done bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range sent {
		k, ok := o.m[sent[i].Key]
		if !ok {
			continue
		}
		if !done {
			k.units += k.sending
		}
		k.sending = 0
		if k.units == 0 {
			delete(o.m, sent[i].Key)
			continue
		}
		o.m[sent[i].Key] = k
	}
	o.keys.Store(int64(len(o.m)))
}

// applyOwed is Decide's store call: charges, preceded by the units owed
// on their keys, if any.
func (l *Limiter) applyOwed(ctx context.Context, now time.Time, charges []Charge, res []Result) (bool, error) {
	if l.failure == nil || l.failure.owed.keys.Load() == 0 {
		return l.store.Apply(ctx, now, charges, res)
	}
	sent := l.failure.owed.take(now, charges)
	if len(sent) == 0 {
		return l.store.Apply(ctx, now, charges, res)
	}
	all := append(sent, charges...)
	allRes := make([]Result, len(all))
	admitted, err := l.store.Apply(ctx, now, all, allRes)
	l.failure.owed.settle(sent, err == nil || timedOut(err))
	copy(res, allRes[len(sent):])
	return admitted, err
}

// timedOut reports whether err is a call that ran out of time, after which
// the store may well have done what it was asked.
func timedOut(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &t) && t.Timeout()
}
