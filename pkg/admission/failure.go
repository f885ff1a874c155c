package admission

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// stricter reports whether f decides a decision's code over g: deny over
// local over allow.
func stricter(f, g limit.StoreFailure) bool {
	rank := func(p limit.StoreFailure) int {
		switch p {
		case limit.FailureDeny:
			return 3
		case limit.FailureLocal:
			return 2
		case limit.FailureAllow:
			return 1
		}
		return 0
	}
	return rank(f) > rank(g)
}

// DegradedRetryAfter is what a charge denied by store_failure deny is told
// to wait: the store may be back by then.
const DegradedRetryAfter = time.Second

// DefaultStoreTimeout bounds every store call of a decision. Envoy's rate
// limit filter gives up after 20 ms by default (and then lets the request
// through, unless failure_mode_deny is set), so a decision must be
// answered before that: 15 ms leaves StoreReserve and more for the answer
// to get back. It is not shorter because a replica whose CPU is throttled
// (a Kubernetes CPU limit) routinely stalls for 10 ms: such a stall should
// cost a decision a wait, not a degraded answer.
const DefaultStoreTimeout = 15 * time.Millisecond

// StoreReserve is what a store call leaves of its caller's deadline, so
// that the answer still reaches a caller that set one (Envoy sends its
// filter timeout as grpc-timeout): the time to encode the answer, for
// the network, and for the moments of the caller's budget spent before
// the call reached this process, which its deadline here does not show.
const StoreReserve = 3 * time.Millisecond

// minStoreWait is the least a store call is given when the caller's
// deadline leaves less than StoreReserve: a call given nothing would fail
// without asking the store and count against it.
const minStoreWait = time.Millisecond

// DefaultOvershoot is, under the automatic local share, the fraction of
// each window limit (requests or tokens) that all replicas together may
// admit beyond it while their store fails: each replica keeps
// DefaultOvershoot/N of the limit, N the replicas sharing the store.
// Whatever the others admit through the store meanwhile, a window then
// admits at most the limit plus this fraction of it.
const DefaultOvershoot = 0.1

// FailurePolicy is how a Limiter bounds and survives its store.
type FailurePolicy struct {
	// Timeout bounds each store call of Decide and Reconcile (the smaller
	// of it and the caller's deadline); 0: no bound of its own.
	Timeout time.Duration
	// Default is the policy of rules and domains that set none (Optional,
	// default FailureLocal).
	Default limit.StoreFailure
	// LocalFraction, in (0,1], fixes the fraction of every limit a local
	// charge is checked against; amounts above 0 stay at least 1
	// (Optional; default 0: the automatic share, see localShare).
	LocalFraction float64
	// Replicas reports how many replicas share the store, this one
	// included, for the automatic share (Optional; nil or a count under 1
	// means 1). It is called on degraded decisions only.
	Replicas func() int
	// Local is the in-process store of local charges (Required for
	// local; without it, local charges are denied, the conservative
	// reading of "a limit this replica keeps alone").
	Local limit.Store
	// Observer is told of store failures and degraded decisions
	// (Optional).
	Observer FailureObserver

	// owed is what local charges the store has not counted yet; set by
	// WithStoreFailure.
	owed *owed
}

// FailureObserver is told what the store's failures did: the Limiter
// itself imports no metrics library.
type FailureObserver interface {
	// StoreFailed: a store call of a decision (or reconciliation) of a
	// domain failed or timed out; the caller did not give up.
	StoreFailed(domain string)
	// Degraded: a decision of domain was answered by policy p, the one
	// that chose its code (deny over local over allow), and dropped
	// charges were not recorded anywhere.
	Degraded(domain string, p limit.StoreFailure, dropped int)
}

// WithStoreFailure bounds store calls by p.Timeout and answers decisions
// whose store call fails by the rules' store_failure. Without it, a
// store error is Decide's error.
func WithStoreFailure(p FailurePolicy) Option {
	return func(l *Limiter) {
		if p.Default == limit.FailureUnset {
			p.Default = limit.FailureLocal
		}
		if !(p.LocalFraction > 0 && p.LocalFraction <= 1) {
			p.LocalFraction = 0
		}
		p.owed = &owed{}
		l.failure = &p
	}
}

// storeCtx is ctx bounded by the store timeout, and by the caller's own
// deadline less StoreReserve (but never under minStoreWait).
func (l *Limiter) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.failure == nil || l.failure.Timeout <= 0 {
		return ctx, func() {}
	}
	wait := l.failure.Timeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, max(time.Until(dl)-StoreReserve, minStoreWait))
	}
	return context.WithTimeout(ctx, wait)
}

// gaveUp reports whether err is the caller's own cancellation or
// deadline rather than the store's failure: only then is there nobody
// left to answer.
func gaveUp(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// policyOf is the store_failure of a charge from rule r in dom.
func (l *Limiter) policyOf(dom *limit.Domain, r *limit.Rule) limit.StoreFailure {
	if r != nil && r.StoreFailure != limit.FailureUnset {
		return r.StoreFailure
	}
	if dom.StoreFailure != limit.FailureUnset {
		return dom.StoreFailure
	}
	return l.failure.Default
}

// degrade answers dec by store_failure after the store failed on b's
// charges. Each status reflects its own rule's policy; the decision's code
// is decided by the strictest policy present (deny, then local, then
// allow), which Decision.Policy reports.
func (l *Limiter) degrade(ctx context.Context, now time.Time, dom *limit.Domain, req *limit.Request, b *built, dec *Decision) {
	dec.Degraded = true
	dropped := 0
	var local []limit.Charge
	var localPlans []plan
	var localIdx []int // each local charge's index in b
	denied := false
	for k, p := range b.plans {
		c := b.charges[k]
		pol := l.policyOf(dom, dec.Statuses[p.desc].Rule)
		if stricter(pol, dec.Policy) {
			dec.Policy = pol
		}
		if c.Cost < 0 {
			dropped++ // a refund: what it gives back was taken from the store
			continue
		}
		switch pol {
		case limit.FailureAllow:
			if c.Force {
				dropped++
			}
		case limit.FailureDeny:
			st := &dec.Statuses[p.desc]
			switch {
			case c.Force:
				dropped++ // a cost report never blocks
			case c.Shadow:
				st.ShadowOver = true
			default:
				denied = true
				st.Code = limit.CodeOverLimit
				st.RetryAfter = max(st.RetryAfter, DegradedRetryAfter)
				if p.limit != nil {
					st.Limit, st.Remaining = p.limit, 0
				} else {
					st.Concurrency = true
				}
			}
		case limit.FailureLocal:
			local = append(local, l.localCharge(c))
			localPlans = append(localPlans, p)
			localIdx = append(localIdx, k)
		}
	}
	leased := false
	if len(local) > 0 && !denied {
		var admitted bool
		admitted, leased = l.degradeLocal(ctx, now, b, dec, local, localPlans, localIdx)
		denied = !admitted
	}
	if denied {
		dec.Code, dec.Reason = limit.CodeOverLimit, ReasonLimit
		markTooLarge(b, dec)
		if dec.TooLarge() != nil {
			dec.Reason = ReasonTooLarge
		}
		if len(dec.Probes) > 0 {
			l.release(ctx, now, dom, dec)
		}
	} else if leased && req.ID != "" {
		// Local leases are released like any others, by the access log's
		// Reconcile; no tokens were reserved in the store, so the usage it
		// reports is charged there as usage spent, if the store is back.
		l.localLeases.Store(true)
		dec.Reservation = &limit.Reservation{ID: req.ID, At: now}
	}
	if o := l.failure.Observer; o != nil {
		o.Degraded(dom.Name, dec.Policy, dropped)
	}
}

// degradeLocal runs a degraded decision's local charges on the
// in-process store and reports each on its descriptor. It returns
// whether they were admitted, and whether a concurrency lease was taken.
func (l *Limiter) degradeLocal(ctx context.Context, now time.Time, b *built, dec *Decision, local []limit.Charge, localPlans []plan, localIdx []int) (admitted, leased bool) {
	res := make([]limit.Result, len(local))
	if l.failure.Local != nil {
		// The in-process store answers at once; the caller's context
		// is enough.
		var err error
		admitted, err = l.failure.Local.Apply(context.WithoutCancel(ctx), now, local, res)
		if err != nil {
			admitted = false
			clear(res)
		}
		if err == nil {
			l.owe(now, b, localIdx, local, res, admitted)
		}
	}
	for k, p := range localPlans {
		st := &dec.Statuses[p.desc]
		rs := res[k]
		if !rs.Fits && local[k].Shadow {
			st.ShadowOver, rs.Fits = true, true
		}
		if !rs.Fits && local[k].Force {
			rs.Fits = true
		}
		if p.limit == nil {
			if !rs.Fits && st.Code == limit.CodeOK {
				st.Code, st.Concurrency = limit.CodeOverLimit, true
				st.RetryAfter = max(rs.RetryAfter, DegradedRetryAfter)
			}
			if rs.Fits && admitted {
				leased = true
			}
			continue
		}
		lim := *p.limit
		lim.Amount, lim.Burst = local[k].Amount, local[k].Burst
		if report(st, &lim, rs) {
			st.Limit, st.Remaining, st.ResetAfter, st.RetryAfter = &lim, rs.Remaining, rs.ResetAfter, rs.RetryAfter
			if !rs.Fits {
				st.Code = limit.CodeOverLimit
				if st.RetryAfter <= 0 {
					st.RetryAfter = DegradedRetryAfter
				}
			}
		}
	}
	return admitted, leased
}

// owe notes the local charges the in-process store kept, to be written
// back to the store (see owed): every one that fit when the decision was
// admitted, and Force charges either way. A shadow charge that did not
// fit was not kept.
func (l *Limiter) owe(now time.Time, b *built, idx []int, local []limit.Charge, res []limit.Result, admitted bool) {
	for k := range local {
		if !(local[k].Force || admitted && res[k].Fits) {
			continue
		}
		// The store's own charge: its key and its limit, not the share.
		c := b.charges[idx[k]]
		c.Cost = local[k].Cost
		l.failure.owed.add(now, &c)
	}
}

// localCharge is c checked against this replica's share of its limit:
// the fixed LocalFraction when one is set, else localShare.
func (l *Limiter) localCharge(c limit.Charge) limit.Charge {
	if f := l.failure.LocalFraction; f > 0 {
		c.Amount = fractionOf(c.Amount, f)
		c.Burst = fractionOf(c.Burst, f)
		return c
	}
	f := l.localShare(c.Algorithm)
	burst := c.Burst
	c.Amount = floorOf(c.Amount, f)
	c.Burst = floorOf(c.Burst, f)
	if burst > 0 && c.Burst == 0 {
		// A burst of 0 means the whole amount: a share too small for one
		// unit of burst admits nothing.
		c.Amount = 0
	}
	return c
}

// localShare is the automatic fraction of a limit this replica keeps
// while the store fails, N being the replicas sharing it:
//
//   - a window limit or token bucket (requests or tokens): DefaultOvershoot/N.
//     A window where some replicas still reach the store can admit the
//     whole limit there, and whatever the failing ones admit on top of
//     it, as the store hears of it only once they reach it again (see
//     owed); so the failing ones together keep only what the limit may be
//     exceeded by.
//   - a concurrency cap: 1/N. It counts requests in flight now, not a
//     window: when every replica has lost the store, their shares add up
//     to the cap; while only some have, the cap can be exceeded by what
//     they hold, at most a 1/N share each, until their leases end.
//
// Amounts are rounded down: a share of under one unit denies, the
// conservative reading of a limit too small to split.
func (l *Limiter) localShare(a limit.Algorithm) float64 {
	n := 1
	if r := l.failure.Replicas; r != nil {
		n = max(1, r())
	}
	if a == limit.Concurrency {
		return 1 / float64(n)
	}
	return DefaultOvershoot / float64(n)
}

// fractionOf is floor(n x f), at least 1 when n is: a fraction of a limit
// never denies everything the limit admits.
func fractionOf(n uint64, f float64) uint64 {
	if n == 0 || f >= 1 {
		return n
	}
	return max(1, uint64(math.Floor(float64(n)*f)))
}

// floorOf is floor(n x f).
func floorOf(n uint64, f float64) uint64 {
	if f >= 1 {
		return n
	}
	return uint64(math.Floor(float64(n) * f))
}

// releaseLocal gives back, on the in-process store, the concurrency leases
// a degraded decision may have taken for charges' member: a no-op for
// members it holds none of.
func (l *Limiter) releaseLocal(ctx context.Context, now time.Time, charges []limit.Charge) {
	if l.failure == nil || l.failure.Local == nil || !l.localLeases.Load() {
		return
	}
	var rel []limit.Charge
	for _, c := range charges {
		if c.Algorithm == limit.Concurrency && c.Cost < 0 {
			rel = append(rel, c)
		}
	}
	if len(rel) > 0 {
		_, _ = l.failure.Local.Apply(context.WithoutCancel(ctx), now, rel, make([]limit.Result, len(rel)))
	}
}
