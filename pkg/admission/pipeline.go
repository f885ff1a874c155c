// Package admission owns the admission decision: its stages in
// the order of docs/architecture.md#the-admission-stages (pipeline.go), its failure policy (failure.go) and
// the answer each denial reason picks (reason.go). Every adapter calls
// its Limiter; pkg/limit below it keeps the algorithms and the Store.
package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The admission decision, in the order of docs/architecture.md#the-admission-stages, cheapest and most
// global first. decide below is the whole list; each stage is a small
// method of its own, and a stage that refuses ends the decision, so a
// request refused by an earlier stage is charged nothing by a later one.
//
//  1. Local shedding: this replica's in-flight bound. It is not a stage
//     here: pkg/server's interceptor refuses a request before it is
//     decoded, which is the point of a bound that protects the replica
//     (docs/architecture.md says why).
//  2. Tier shedding by pressure: shedTier, then shedUnlessSettles once
//     the rules have told whether the request only settles.
//  3. Circuit breakers: askBreakers.
//  4. Rate limits and token budgets, and
//  5. concurrency caps: one all-or-nothing store call (limits), so that a
//     request one of them refuses charges no other; report then tells
//     each descriptor which limit or cap answered.
//
// The failure policy (failure.go) answers for a store that cannot, and
// reason.go says what each refusal tells the client.

// pass is one decision's way through the stages: what they share.
type pass struct {
	req *limit.Request
	dom *limit.Domain
	dec *Decision
	b   *built
	// adj is what pressure does to the limits of an admitted request.
	adj adjust
	// shed: the tier is shed, so the request is refused unless it only
	// settles an earlier one.
	shed bool
	// settles: every descriptor is a refund or a cost report (see
	// shedUnlessSettles).
	settles bool
	now     time.Time
	// res are the store's answers to b.charges; admitted is its verdict.
	res      []limit.Result
	admitted bool
}

// decide is Decide without the report to Admissions; it also returns the
// request's domain (nil: unknown) and whether the request only settles
// an earlier one.
func (l *Limiter) decide(ctx context.Context, req *limit.Request) (*Decision, *limit.Domain, bool, error) {
	p := pass{req: req}
	if err := l.start(&p); err != nil || p.dom == nil {
		return p.dec, nil, false, err
	}
	if l.shedTier(&p) {
		return p.dec, p.dom, false, nil
	}
	p.b = getBuilt()
	defer putBuilt(p.b)
	if err := l.match(&p); err != nil {
		return nil, p.dom, false, err
	}
	if l.shedUnlessSettles(&p) {
		return p.dec, p.dom, p.settles, nil
	}
	p.now = l.clock.Now()
	p.dec.At = p.now
	if done, err := l.askBreakers(ctx, &p); done || err != nil {
		if err != nil {
			return nil, p.dom, p.settles, err
		}
		return p.dec, p.dom, p.settles, nil
	}
	if done, err := l.limits(ctx, &p); done || err != nil {
		if err != nil {
			return nil, p.dom, p.settles, err
		}
		return p.dec, p.dom, p.settles, nil
	}
	l.report(&p)
	return p.dec, p.dom, p.settles, nil
}

// start checks the request and finds its domain; a domain the rules do
// not know admits everything (p.dom stays nil).
func (l *Limiter) start(p *pass) error {
	if err := limit.CheckRequest(p.req); err != nil {
		return err
	}
	p.dec = newDecision(len(p.req.Descriptors))
	for i := range p.dec.Statuses {
		p.dec.Statuses[i].Code = limit.CodeOK
	}
	p.dom = l.rules.Load().Domain(p.req.Domain)
	return nil
}

// shedTier is tier shedding's first half: it reads the pressure, and
// refuses a shed request at once unless it may only settle (which the
// rules tell, in match).
func (l *Limiter) shedTier(p *pass) bool {
	p.adj, p.shed = l.shed(p.dom, p.req, p.dec)
	if p.shed && !maySettle(p.req) {
		p.dec.Tier, _ = p.dom.Plan(p.req)
		refuse(p.dec, ReasonShed, p.dom.Shedding.RetryAfter())
		return true
	}
	return false
}

// match builds the request's charges from the rules (see build).
func (l *Limiter) match(p *pass) error {
	if err := build(p.b, p.dom, p.req, admit, p.dec.Statuses, p.adj); err != nil {
		return err
	}
	p.dec.Tier = p.b.tier
	p.settles = p.b.asks == 0
	return nil
}

// shedUnlessSettles is tier shedding's second half. A request of refunds
// and cost reports only (Envoy's apply_on_stream_done call) settles usage
// of a request admitted before: neither shedding nor a breaker refuses
// it, and it takes no probe slot, or a refund would be lost, usage go
// uncharged, and a report hold a half-open breaker's slot for nothing.
func (l *Limiter) shedUnlessSettles(p *pass) bool {
	if p.settles {
		p.dec.ShadowShed = false
		return false
	}
	if p.shed {
		clear(p.dec.Statuses)
		refuse(p.dec, ReasonShed, p.dom.Shedding.RetryAfter())
		return true
	}
	return false
}

// askBreakers asks each breaker whose key the request carries; done when
// one refused it.
func (l *Limiter) askBreakers(ctx context.Context, p *pass) (bool, error) {
	if len(p.dom.Breakers) == 0 || p.settles {
		return false, nil
	}
	sctx, cancel := l.storeCtx(ctx)
	ok, err := l.allowBreakers(sctx, p.now, p.dom, p.req, p.dec)
	cancel()
	if err != nil && l.failure != nil && !gaveUp(ctx, err) {
		// A breaker whose state cannot be read is passed as closed:
		// the limits that follow answer by store_failure, which is
		// the operator's choice for a store that is down.
		l.storeFailed(p.dom)
		ok, err = true, nil
	}
	return !ok, err
}

// limits sends every charge (rate limits, token budgets and concurrency
// leases) to the store in one all-or-nothing call; done when nothing is
// left to report (no charges, or a degraded answer).
func (l *Limiter) limits(ctx context.Context, p *pass) (bool, error) {
	b, dec := p.b, p.dec
	if len(b.charges) == 0 {
		return true, nil
	}
	p.res = b.results(len(b.charges))
	sctx, cancel := l.storeCtx(ctx)
	admitted, err := l.applyOwed(sctx, p.now, b.charges, p.res)
	cancel()
	if err != nil && l.failure != nil && !gaveUp(ctx, err) {
		l.storeFailed(p.dom)
		l.degrade(ctx, p.now, p.dom, p.req, b, dec)
		return true, nil
	}
	if err != nil {
		if len(dec.Probes) > 0 {
			l.release(ctx, p.now, p.dom, dec)
		}
		return true, fmt.Errorf("apply %d charges: %w", len(b.charges), err)
	}
	p.admitted = admitted
	if admitted && reportOver(b, p.res) {
		dec.Kept = true
	}
	if !admitted || dec.Kept {
		dec.Code, dec.Reason = limit.CodeOverLimit, ReasonLimit
		if len(dec.Probes) > 0 {
			l.release(ctx, p.now, p.dom, dec)
		}
	}
	return false, nil
}

// reportOver says whether a cost report on a request limit took its
// counter over the limit: the store kept it, and the answer is
// OVER_LIMIT, as envoyproxy/ratelimit answers a hit that goes over.
func reportOver(b *built, res []limit.Result) bool {
	if !b.reports {
		return false // the usual decision: no loop
	}
	for k, pl := range b.plans {
		if c := &b.charges[k]; c.Force && !c.Shadow && !res[k].Fits && pl.limit != nil && pl.limit.Kind == limit.Requests {
			return true
		}
	}
	return false
}

// report tells each descriptor which of its limits answered, then which
// concurrency cap refused it, and gives an admitted request that
// reserved something its Reservation.
func (l *Limiter) report(p *pass) {
	b, dec := p.b, p.dec
	for k, pl := range b.plans {
		if pl.limit != nil {
			reportLimit(&dec.Statuses[pl.desc], &b.charges[k], pl, p.res[k])
		}
	}
	for k, pl := range b.plans {
		if pl.limit == nil && !p.res[k].Fits {
			// The concurrency cap denied: report it on its descriptor
			// unless a limit there denied too.
			if st := &dec.Statuses[pl.desc]; st.Code == limit.CodeOK {
				st.Code = limit.CodeOverLimit
				st.Concurrency = true
				st.RetryAfter = p.res[k].RetryAfter
			}
		}
	}
	if !p.admitted && dec.TooLarge() != nil {
		dec.Reason = ReasonTooLarge
	}
	if p.admitted && p.req.ID != "" && b.reserves {
		dec.Reservation = &limit.Reservation{ID: p.req.ID, At: p.now, Tokens: b.tokens}
	}
}

// reportLimit puts what the store answered for charge c of limit pl in
// st, when it wins what the descriptor reports (see report).
func reportLimit(st *limit.Status, c *limit.Charge, pl plan, rs limit.Result) {
	if !rs.Fits && c.Shadow {
		st.ShadowOver = true
		rs.Fits = true
	}
	if !rs.Fits && c.Force && pl.limit.Kind == limit.Tokens {
		rs.Fits = true // kept and not blocking: the budget now shows 0 left
	}
	if !rs.Fits && !st.TooLarge && neverFits(c, pl) {
		// A denial no wait ends wins what the descriptor reports:
		// the client must change the request, not retry it.
		st.Code, st.Limit, st.Remaining, st.ResetAfter, st.RetryAfter = limit.CodeOverLimit, pl.limit, rs.Remaining, rs.ResetAfter, rs.RetryAfter
		st.TooLarge, st.Cost, st.Capacity = true, uint64(c.Cost), pl.capacity
		return
	}
	if report(st, pl.limit, rs) {
		st.Limit = pl.limit
		st.Remaining = rs.Remaining
		st.ResetAfter = rs.ResetAfter
		st.RetryAfter = rs.RetryAfter
		if !rs.Fits {
			st.Code = limit.CodeOverLimit
			// The counter had the room: only the fair gate denies so.
			st.Gated = c.Fair.Policy != nil && c.Cost >= 0 && rs.Remaining >= uint64(c.Cost)
		}
	}
}
