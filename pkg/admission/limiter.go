package admission

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TooLarge returns the first status whose limit the request can never
// fit (see Status.TooLarge), nil when none.
func (d *Decision) TooLarge() *limit.Status {
	for i := range d.Statuses {
		if d.Statuses[i].TooLarge {
			return &d.Statuses[i]
		}
	}
	return nil
}

// Decision is the answer to a Request.
type Decision struct {
	Code     limit.Code
	Statuses []limit.Status
	// Reservation is set when an admitted request with an ID reserved
	// tokens or took a concurrency lease.
	Reservation *limit.Reservation
	// Tier is the plan the request was decided under (see Tiers): one of
	// the domain's plan names, or "" when the domain has no tiers.
	Tier string
	// Reason is why Code is CodeOverLimit: ReasonShed and ReasonBreaker
	// refuse before any limit is charged (every status is then over limit
	// with no Limit); ReasonNone when admitted.
	Reason Reason
	// RetryAfter is, for ReasonShed and ReasonBreaker, how long to wait:
	// the policy's Hold (or DefaultShedRetryAfter), or the breaker's open
	// period left. For ReasonLimit the statuses carry it.
	RetryAfter time.Duration
	// ShadowShed: a shadow-mode shedding policy would have refused the
	// request. It was decided as if there were no shedding.
	ShadowShed bool
	// Probes are the half-open breakers' probes the admitted request
	// holds; their outcomes must be reported with the probe IDs.
	Probes []limit.Probe
	// Degraded: the store could not answer (an error, a timeout, its
	// circuit open) and the rules' store_failure did; Policy is the one
	// that chose Code (deny over local over allow).
	Degraded bool
	Policy   limit.StoreFailure
	// At is when the decision was made, by the Limiter's clock; zero for
	// a domain the rules do not know.
	At time.Time
	// Flight is the ID an admitted request's flight began under (see
	// Admissions), "" for none: the request's ticket carries it, so that
	// its completion ends the flight.
	Flight string
	// Retries is how many times an admitted request may be retried
	// upstream now, when HasRetries: its domain has a retry budget
	// (retry.go). The adapters tell Envoy as x-envoy-max-retries.
	Retries    int
	HasRetries bool
	// Kept: refused (ReasonLimit) with its charges kept, because a cost
	// report on a request limit went over it (see addDescriptor). No
	// wait may retry it: that would charge it twice.
	Kept bool
}

// Limiter matches requests against the current rules and applies the
// charges to its Store in one call, all or nothing.
//
// Before the limits it applies, in the order of docs/architecture.md#the-admission-stages, the domain's tier
// shedding (WithShedder) and circuit breakers (WithBreakers): a request
// they refuse is charged nothing.
type Limiter struct {
	rules    atomic.Pointer[limit.RuleSet]
	store    limit.Store
	clock    limit.Clock
	shedder  Shedder
	breakers Breakers
	// admissions, when set, is told of the decisions of domains with a
	// Control (WithAdmissions).
	admissions Admissions
	// queue, when set, holds refused requests that may wait (WithQueue).
	queue *Queue
	// failure, when set, bounds store calls and answers for a store that
	// cannot (WithStoreFailure).
	failure *FailurePolicy
	// localLeases is set once a degraded decision took a concurrency
	// lease on the in-process store, so Reconcile releases there too.
	localLeases atomic.Bool
	// retries, when set, gives the retry budget its signals
	// (WithRetrySource).
	retries RetrySource
}

// NewLimiter returns a Limiter over store; rules may be nil (everything is
// then unknown and allowed) and can be swapped later with SetRules.
// Without WithShedder and WithBreakers, domains' shedding and breakers are
// ignored.
func NewLimiter(store limit.Store, clock limit.Clock, rules *limit.RuleSet, opts ...Option) *Limiter {
	if clock == nil {
		clock = limit.SystemClock{}
	}
	l := &Limiter{store: store, clock: clock}
	for _, o := range opts {
		o(l)
	}
	if rules != nil {
		l.rules.Store(rules)
	}
	return l
}

// SetRules swaps the rules atomically; decisions in flight finish on the old set.
func (l *Limiter) SetRules(rs *limit.RuleSet) { l.rules.Store(rs) }

// Rules returns the rules in force (nil before the first load).
func (l *Limiter) Rules() *limit.RuleSet { return l.rules.Load() }

// plan ties a charge to the descriptor it came from.
type plan struct {
	desc  int
	limit *limit.Limit
	// capacity is the most the limit can ever admit at once, before the
	// pressure's factor (which passes): see Status.TooLarge.
	capacity uint64
}

// Decide answers req. It returns an error wrapping ErrInvalid for a
// malformed request. When the store (or a breaker's) fails, it returns
// the store's error, unless the Limiter was made WithStoreFailure: then
// each store call runs under the store timeout, a breaker that cannot be
// read is passed, and a failed Apply is answered by the rules'
// store_failure (see StoreFailure), with Degraded set. Either way a
// caller that gave up (its context done) gets its context's error.
//
// The steps, each skipped when the domain does not configure it: the
// tier's shedding under the current pressure (refused: ReasonShed); each
// breaker whose key the request carries (open: ReasonBreaker; half-open:
// maybe a probe); the limits, scaled by the plan multiplier and then by
// the pressure's limit factor. A probe taken for a request the limits
// then refuse is released: the request never goes upstream, so no
// outcome would ever free its slot before the lease ends.
func (l *Limiter) Decide(ctx context.Context, req *limit.Request) (*Decision, error) {
	dec, dom, settles, err := l.decide(ctx, req)
	if err == nil {
		dec, err = l.hold(ctx, req, dec, dom, settles)
	}
	if err == nil && settles && dec.Code == limit.CodeOK && l.queue != nil {
		l.queue.Notify(req.Domain) // a refund may have freed capacity
	}
	l.budgetRetries(dec, dom, req, settles)
	if err != nil || l.admissions == nil || dom == nil || settles || dom.Shedding == nil || dom.Shedding.Control == nil {
		return dec, err
	}
	// Offered counts every question, shed or not: the controller's
	// demand is what arrives, not what it let through.
	dec.Flight = l.admissions.Decided(dom.Name, req.Value(dom.Shedding.Control.KeyName()), dec.Tier, dec.Code == limit.CodeOK, req.ID)
	return dec, nil
}

// Settle settles a reservation that Decide made for req (the same
// domain, descriptors, ID and overrides) at time at, once the actual
// usage is known: the difference between it and the reserved tokens is
// refunded into the window the reservation was charged in, or charged as
// usage already spent; and the request's concurrency leases are
// released. It runs at most once per request ID: a second call for the
// same ID (the access log and ext_proc both reporting, or an entry
// delivered twice, to any replica) changes nothing and returns false.
func (l *Limiter) Settle(ctx context.Context, req *limit.Request, at time.Time, reserved, actual uint64) (bool, error) {
	ok, err := l.reconcile(ctx, req, at, clampCost(actual)-clampCost(reserved), true)
	if err == nil && l.queue != nil {
		l.queue.Notify(req.Domain)
	}
	return ok, err
}

// Release gives back the concurrency leases Decide took for req, without
// settling its tokens: the request is over, but its usage is not known
// yet (an access log entry without usage, before ext_proc reports it).
// Releasing is idempotent, so it needs no mark: a lease is a member
// named by the request ID, and removing it twice removes it once.
func (l *Limiter) Release(ctx context.Context, req *limit.Request) error {
	_, err := l.reconcile(ctx, req, time.Time{}, 0, false)
	if err == nil && l.queue != nil {
		l.queue.Notify(req.Domain)
	}
	return err
}

// reconcile applies a settle (once, with the token delta) or a release.
func (l *Limiter) reconcile(ctx context.Context, req *limit.Request, at time.Time, delta int64, once bool) (bool, error) {
	if err := limit.CheckRequest(req); err != nil {
		return false, err
	}
	if req.ID == "" {
		return false, limit.Invalidf("reconcile needs the request ID")
	}
	if len(req.ID) > limit.MaxValueBytes {
		return false, limit.Invalidf("request ID is %d bytes, at most %d", len(req.ID), limit.MaxValueBytes)
	}
	dom := l.rules.Load().Domain(req.Domain)
	if dom == nil {
		return false, nil
	}
	b := getBuilt()
	defer putBuilt(b)
	if err := build(b, dom, req, reconcile, make([]limit.Status, len(req.Descriptors)), noAdjust); err != nil {
		return false, err
	}
	charges := b.charges[:0]
	for _, c := range b.charges {
		switch {
		case c.Algorithm == limit.Concurrency:
			c.Cost = -1
		case !once:
			continue
		case delta < 0:
			c.Cost, c.At = delta, at.UnixMilli()
		case delta > 0:
			c.Cost, c.Force = delta, true
		default:
			continue
		}
		charges = append(charges, c)
	}
	if !once && len(charges) == 0 {
		return true, nil
	}
	if once {
		// The mark shares the first counter's hash tag, so on Cluster it
		// sits in a slot this decision already touches. It is set even
		// when there is nothing to charge, so that a later report of the
		// same request does not settle it a second time.
		charges = append(charges, limit.Charge{
			Key:       limit.OnceKey(req.Domain, b.first, req.ID),
			Algorithm: limit.Once,
			Window:    max(limit.SettleOnceFor, b.lease),
			Cost:      1,
		})
	}
	res := b.results(len(charges))
	now := l.clock.Now()
	l.releaseLocal(ctx, now, charges)
	sctx, cancel := l.storeCtx(ctx)
	done, err := l.store.Apply(sctx, now, charges, res)
	cancel()
	if err != nil {
		if l.failure != nil && !gaveUp(ctx, err) {
			l.storeFailed(dom)
		}
		return false, fmt.Errorf("reconcile %d charges: %w", len(charges), err)
	}
	return done || !once, nil
}

// storeFailed reports a store failure of a decision of dom.
func (l *Limiter) storeFailed(dom *limit.Domain) {
	if o := l.failure.Observer; o != nil {
		o.StoreFailed(dom.Name)
	}
}

type mode uint8

const (
	admit mode = iota
	reconcile
)

// built is the charges a request makes and what they came from.
type built struct {
	charges []limit.Charge
	plans   []plan
	// reserves is set when a charge reserves tokens or takes a lease, so
	// the request has something to reconcile.
	reserves bool
	tokens   uint64         // the tokens reserved on each token limit
	lease    time.Duration  // the longest concurrency lease taken
	tier     string         // the request's plan, "" without tiers
	first    []limit.Entry  // the first descriptor's entries, tier entries removed
	res      []limit.Result // the store's answers, reused like charges and plans

	// reports: a charge is a request limit's cost report (a Force
	// charge that answers OVER_LIMIT once over; see reportOver).
	reports bool
	// asks counts the descriptors that ask for admission: all but
	// refunds (is_negative_hits) and cost reports (a hits_addend of its
	// own on a token limit). None: the request only settles.
	asks int
}

// builtPool keeps built values between decisions so that their charge,
// plan and result slices are reused: a warm decision allocates none of
// them. A Store does not keep charges or res past Apply (see Store).
var builtPool = sync.Pool{New: func() any { return new(built) }}

func getBuilt() *built { return builtPool.Get().(*built) }

// putBuilt empties b, dropping what it points to (keys, rules, the
// request's entries), and returns it to the pool.
func putBuilt(b *built) {
	if cap(b.charges) > maxPooledCharges {
		return
	}
	clear(b.charges[:cap(b.charges)])
	clear(b.plans[:cap(b.plans)])
	*b = built{charges: b.charges[:0], plans: b.plans[:0], res: b.res[:0]}
	builtPool.Put(b)
}

// maxPooledCharges bounds what the pool keeps: a few limits for each of
// MaxDescriptors descriptors.
const maxPooledCharges = 4 * limit.MaxDescriptors

// results returns b.res with n zeroed elements.
func (b *built) results(n int) []limit.Result {
	if cap(b.res) < n {
		b.res = make([]limit.Result, n)
	}
	b.res = b.res[:n]
	clear(b.res)
	return b.res
}

// newDecision returns an admitting Decision with n statuses (codes left
// to the caller). A single descriptor, the usual request, gets its status
// in the same allocation as the Decision.
func newDecision(n int) *Decision {
	if n == 1 {
		d := new(struct {
			dec Decision
			st  [1]limit.Status
		})
		d.dec.Code, d.dec.Statuses = limit.CodeOK, d.st[:]
		return &d.dec
	}
	return &Decision{Code: limit.CodeOK, Statuses: make([]limit.Status, n)}
}

// build matches req's descriptors and returns their charges. In reconcile
// mode it returns the request's token limits (cost left for Reconcile to
// set) and concurrency leases only. statuses receives the matched rules.
//
// With tiers, every limit is scaled by the request's plan multiplier
// (after the key's or tenant's override, before the descriptor's own
// limit, which is not scaled), except a fair-shared rule's, whose limits
// are absolute and whose charges carry the plan as a weight (fair.go);
// and tier entries are removed from each
// descriptor before it is matched and keyed. A descriptor of tier entries
// only is then empty and matches nothing.
//
// adj, the pressure's limit factor and burst switch, scales every limit
// after the plan multiplier (floored, at least 1), and with noBurst
// shrinks every token bucket's burst to the policy's burst floor. A
// descriptor's own limit is not scaled by either.
//
// b must be empty (from getBuilt); build fills it.
func build(b *built, dom *limit.Domain, req *limit.Request, m mode, statuses []limit.Status, adj adjust) error {
	var micro uint64
	b.tier, micro = dom.Plan(req)
	ents := tierStripped(dom, req)
	entriesOf := func(i int) []limit.Entry {
		if ents != nil {
			return ents[i]
		}
		return req.Descriptors[i].Entries
	}
	b.first = entriesOf(0)
	// Made here, not in matchAll, so that the compiler keeps it on the
	// stack: a decision allocates no more than it must.
	mt := matched{rules: make([]*limit.Rule, len(req.Descriptors))}
	matchAll(dom, req, entriesOf, statuses, &mt)
	for i := range req.Descriptors {
		if err := b.addDescriptor(dom, req, i, entriesOf(i), &mt, m, statuses, adj, micro); err != nil {
			return err
		}
	}
	return nil
}

// tierStripped is every descriptor's entries as matched and keyed, with
// the tiers key's entries removed; nil (the request's own entries) when
// no descriptor carries one, so that the usual request allocates none.
func tierStripped(dom *limit.Domain, req *limit.Request) [][]limit.Entry {
	if dom.Tiers == nil {
		return nil
	}
	var ents [][]limit.Entry
	for i := range req.Descriptors {
		e := req.Descriptors[i].Entries
		if s := limit.StripTier(e, dom.Tiers.Key); len(s) != len(e) {
			if ents == nil {
				ents = make([][]limit.Entry, len(req.Descriptors))
				for j := range i {
					ents[j] = req.Descriptors[j].Entries
				}
			}
			e = s
		}
		if ents != nil {
			ents[i] = e
		}
	}
	return ents
}

// matched is what matching every descriptor found, before any charge:
// replaces needs all of them.
type matched struct {
	rules    []*limit.Rule
	replaced map[string]bool
	// keyEntries are the entries descriptors under a share_threshold
	// wildcard are counted under.
	keyEntries map[int][]limit.Entry
}

// matchAll matches every descriptor of req into mt, whose rules has a
// place for each; statuses receive the rules.
func matchAll(dom *limit.Domain, req *limit.Request, entriesOf func(int) []limit.Entry, statuses []limit.Status, mt *matched) {
	for i := range req.Descriptors {
		if len(entriesOf(i)) == 0 {
			continue // tier entries only: nothing to match
		}
		r, shared := dom.MatchShared(entriesOf(i))
		if shared != 0 {
			if mt.keyEntries == nil {
				mt.keyEntries = map[int][]limit.Entry{}
			}
			mt.keyEntries[i] = dom.SharedEntries(entriesOf(i), shared)
		}
		mt.rules[i] = r
		statuses[i].Rule = r
		// An overridden descriptor's limit is the request's, which
		// replaces nothing.
		if r != nil && len(r.Replaces) > 0 && req.Descriptors[i].Override == nil {
			if mt.replaced == nil {
				mt.replaced = map[string]bool{}
			}
			for _, n := range r.Replaces {
				mt.replaced[n] = true
			}
		}
	}
}

// addDescriptor adds the charges of descriptor i, whose entries (tier
// entries removed) are ents, to b.
func (b *built) addDescriptor(dom *limit.Domain, req *limit.Request, i int, ents []limit.Entry, mt *matched, m mode, statuses []limit.Status, adj adjust, micro uint64) error {
	d := &req.Descriptors[i]
	r := mt.rules[i]
	if !d.Negative {
		b.asks++ // until it turns out a cost report, below
	}
	if r != nil && r.Unlimited && d.Override == nil {
		return nil // a request's override limits it (limitsOf)
	}
	if len(ents) == 0 {
		return nil // tier entries only, its own limit included: see build
	}
	scale := micro
	if r != nil && r.Fair != nil {
		scale = limit.MicroOne // a shared budget is absolute; the plan is a weight (fair.go)
	}
	rate, tokens, rateCap, tokenCap, err := limitsOf(req, i, r, dom.Algorithm, adj, scale)
	if err != nil {
		return err
	}
	if rate != nil && rate.Name != "" && mt.replaced[rate.Name] {
		statuses[i].Replaced = true
		rate = nil
	}
	if tokens != nil && tokens.Name != "" && mt.replaced[tokens.Name] {
		statuses[i].Replaced = true
		tokens = nil
	}
	if ke, ok := mt.keyEntries[i]; ok {
		ents = ke
	}
	// Concurrency leases need a request ID to be released by; RLS
	// calls have none, so only ext_authz holds them.
	if r != nil && r.MaxConcurrent > 0 && req.ID != "" {
		b.charges = append(b.charges, limit.Charge{
			Key:       limit.Key(limit.Requests, limit.Concurrency, r.Lease, req.Domain, ents),
			Algorithm: limit.Concurrency,
			Amount:    limit.Scale(limit.Scale(r.MaxConcurrent, scale), adj.micro),
			Window:    r.Lease,
			Cost:      1,
			Member:    req.ID,
		})
		b.plans = append(b.plans, plan{desc: i})
		b.reserves = true
		b.lease = max(b.lease, r.Lease)
	}
	if rate == nil && tokens == nil {
		return nil
	}
	rateCost, tokenCost := costs(req, d, tokens != nil)
	shadow := r != nil && r.Shadow
	fair := fairCharge(req, r, micro)
	if m == admit && rate != nil && !(tokens != nil && d.HitsSet) {
		// A request's override is its own limit, enforced: the rule's
		// shadow_mode is not its (as envoyproxy/ratelimit has it).
		c := charge(req.Domain, ents, rate, rateCost, shadow && d.Override == nil)
		if d.HitsSet && rateCost > 0 {
			// A descriptor's own hits_addend on a request limit is kept
			// whatever the count, as envoyproxy/ratelimit keeps every
			// hit: Envoy's apply_on_stream_done reports the usage of a
			// request already served so, and a report refused would
			// let a quota never run out. It is answered OVER_LIMIT once
			// over (limits), so the same hits_addend on the request
			// path is refused. Envoy's call cannot say which it is, so
			// it still asks (a weighed request: shedding and breakers
			// refuse it); a token_limit's report settles instead.
			c.Force, b.reports = true, true
		}
		if r != nil && r.Fair != nil && d.Override == nil {
			// Envoy's own limit for the descriptor is not the shared one.
			c.Fair, c.Fair.Policy = fair, r.Fair.Rate
		}
		b.charges = append(b.charges, c)
		b.plans = append(b.plans, plan{desc: i, limit: rate, capacity: rateCap})
	}
	if tokens != nil {
		c := charge(req.Domain, ents, tokens, tokenCost, shadow)
		if r != nil && r.Fair != nil {
			c.Fair, c.Fair.Policy = fair, r.Fair.Token
		}
		// A cost report is usage already spent: Envoy ignores the
		// answer to it, so refusing it would lose the usage and let a
		// tenant whose responses outgrow its remaining budget run on.
		c.Force = d.HitsSet && tokenCost > 0
		if c.Force {
			b.asks--
		}
		if !c.Force && tokenCost > 0 {
			b.reserves = true
			b.tokens = uint64(tokenCost)
		}
		b.charges = append(b.charges, c)
		b.plans = append(b.plans, plan{desc: i, limit: tokens, capacity: tokenCap})
	}
	return nil
}

// limitsOf is descriptor i's request and token limits under rule r, with
// the override, plan multiplier and pressure applied, and their
// capacities before pressure (see plan.capacity). An override is a limit
// of its own, as envoyproxy/ratelimit makes it: the rule's algorithm (the
// file's, alg, without a rule), but neither its name nor anything the
// name does (replaces, the status's name).
func limitsOf(req *limit.Request, i int, r *limit.Rule, alg limit.Algorithm, adj adjust, micro uint64) (rate, tokens *limit.Limit, rateCap, tokenCap uint64, err error) {
	d := &req.Descriptors[i]
	if r != nil {
		rate = limit.Scaled(overridden(r.RateLimit, req.Overrides), micro)
		tokens = limit.Scaled(overridden(r.TokenLimit, req.Overrides), micro)
		rateCap, tokenCap = capacity(rate), capacity(tokens)
		rate, tokens = adj.apply(rate), adj.apply(tokens)
	}
	if d.Override != nil {
		ov := &limit.Limit{Kind: limit.Requests, Amount: d.Override.Amount, Unit: d.Override.Unit, Multiplier: d.Override.Multiplier, Algorithm: alg}
		if rate != nil {
			ov.Algorithm, ov.Buckets = rate.Algorithm, rate.Buckets
			// A token bucket of 0 has no emission interval; a sliding
			// window of 0 denies everything, which is what 0 asks for.
			if rate.Algorithm == limit.TokenBucket && d.Override.Amount == 0 {
				ov.Algorithm = limit.SlidingWindow
			}
		}
		if ov.Window() <= 0 {
			return nil, nil, 0, 0, limit.Invalidf("descriptors[%d].limit: unit %d is not known", i, d.Override.Unit)
		}
		rate, rateCap = ov, capacity(ov)
	}
	return rate, tokens, rateCap, tokenCap, nil
}

// markTooLarge marks, in a denied dec, the statuses of b's charges that
// can never fit (see Status.TooLarge). Apply's results are not needed:
// a charge costing more than its capacity never fits any store, so the
// degraded answers use it too.
func markTooLarge(b *built, dec *Decision) {
	for k, p := range b.plans {
		c, st := &b.charges[k], &dec.Statuses[p.desc]
		if st.TooLarge || !neverFits(c, p) {
			continue
		}
		st.Code, st.Limit, st.RetryAfter = limit.CodeOverLimit, p.limit, 0
		st.TooLarge, st.Cost, st.Capacity = true, uint64(c.Cost), p.capacity
	}
}

// neverFits says whether charge c of limit p costs more than the
// limit's whole capacity, so that no wait lets it fit: a denial of it is
// ReasonTooLarge. A shadow charge and a cost report never block, and a
// concurrency lease has no capacity of this kind.
func neverFits(c *limit.Charge, p plan) bool {
	// A token limit's cost report never fails; a request limit's
	// hits_addend, kept either way, is refused like any request.
	return p.limit != nil && !c.Shadow && !(c.Force && p.limit.Kind == limit.Tokens) && c.Cost > 0 && uint64(c.Cost) > p.capacity
}

// capacity is the most l admits at once: a token bucket's burst, else
// its amount; 0 for no limit.
func capacity(l *limit.Limit) uint64 {
	switch {
	case l == nil:
		return 0
	case l.Algorithm == limit.TokenBucket:
		return l.EffectiveBurst()
	default:
		return l.Amount
	}
}

// overridden returns l with the request's override for its name applied:
// an API key's or tenant's own amount, and window when it names a unit.
func overridden(l *limit.Limit, ovs map[string]limit.Override) *limit.Limit {
	if l == nil || l.Name == "" || len(ovs) == 0 {
		return l
	}
	ov, ok := ovs[l.Name]
	if !ok {
		return l
	}
	c := *l
	c.Amount = ov.Amount
	if ov.Unit != limit.UnitUnknown {
		c.Unit, c.Multiplier = ov.Unit, ov.Multiplier
	}
	if c.Algorithm == limit.TokenBucket && c.Amount == 0 {
		c.Algorithm = limit.SlidingWindow // 0 denies everything; a bucket of 0 has no rate
	}
	if c.Algorithm == limit.TokenBucket && c.Burst > c.Amount {
		c.Burst = 0 // the rule's burst was sized for its own amount
	}
	return &c
}

// costs returns what a descriptor charges its request limit and its token
// limit. A rule with only a request limit charges the hits_addend, as
// envoyproxy/ratelimit does. A rule with a token limit treats a descriptor
// that carries its own hits_addend as a cost report (only the token limit
// is charged, typically from apply_on_stream_done) and any other
// descriptor as a request: one request, plus the request-level
// hits_addend as tokens (0, the usual case, checks that budget is left).
func costs(req *limit.Request, d *limit.Descriptor, hasTokens bool) (rate, tokens int64) {
	hits := req.Hits
	if hits == 0 {
		hits = 1
	}
	if d.HitsSet {
		hits = d.Hits
	}
	rate = clampCost(hits)
	if hasTokens {
		rate = 1
		switch {
		case d.HitsSet:
			tokens = clampCost(d.Hits)
		case req.TokensSet:
			tokens = clampCost(req.Tokens)
		default:
			tokens = clampCost(req.Hits)
		}
	}
	if d.Negative {
		rate, tokens = -rate, -tokens
	}
	return rate, tokens
}

func clampCost(h uint64) int64 {
	const maxCost = 1 << 53 // exact in a float64, as Lua counts
	if h > maxCost {
		return maxCost
	}
	return int64(h)
}

func charge(domain string, entries []limit.Entry, l *limit.Limit, cost int64, shadow bool) limit.Charge {
	return limit.Charge{
		Key:       limit.Key(l.Kind, l.Algorithm, l.Window(), domain, entries),
		Algorithm: l.Algorithm,
		Amount:    l.Amount,
		Window:    l.Window(),
		Burst:     l.Burst,
		Buckets:   l.Buckets,
		Cost:      cost,
		Shadow:    shadow,
	}
}

// report says whether r should replace what st reports: a denial wins,
// then the limit with the smaller share of room left.
func report(st *limit.Status, l *limit.Limit, r limit.Result) bool {
	if st.Limit == nil {
		return true
	}
	if st.Code == limit.CodeOverLimit {
		return false
	}
	if !r.Fits {
		return true
	}
	// r.Remaining/l.Amount < st.Remaining/st.Limit.Amount, without division.
	return float64(r.Remaining)*float64(st.Limit.Amount) < float64(st.Remaining)*float64(l.Amount)
}
