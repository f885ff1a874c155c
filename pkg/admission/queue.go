package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The queue stage: where a domain's queue (limit.Queue) lets the
// request's tier wait, a request that a rate limit or concurrency cap
// refused is held on this replica and decided again, until the limits
// admit it, another stage refuses it, or its tier's bound passes; then
// it is answered as any decision is (docs/admission-queue.md).
//
// Only ReasonLimit waits. A shed tier is refused at once: shedding
// means this replica or its upstream is overloaded, and a held request
// is a held stream and goroutine, more load, for a hold (the policy's,
// seconds long) that outlasts any wait bound. An open breaker's period
// outlasts it too, and a request too large for a limit never fits.
//
// Waiters retry one at a time per domain, in priority order (the
// queue's tiers, first highest) and then FIFO, whenever they are due:
// all of a domain's waiters when this replica sees capacity free (a
// settle, a release, an admitted refund), one waiter when the denial's
// RetryAfter passes (a window's bucket ageing out), capped by the
// queue's poll (capacity another replica freed, a lease that expired).
// The retry is a whole decision against the global limiter, so waiters
// on every replica take capacity from the one store as it frees; the
// queue orders this replica's claims, and the store's all-or-nothing
// call keeps the limits.
//
// Retries are paced per domain: a retry refused with RetryAfter d
// (capped by poll) holds the domain's next retry until d has passed,
// unless a Notify comes first. The refusal says capacity will not free
// sooner, so the retries it holds back would only be refused too; without
// the pace a full queue of n waiters due together costs the store n
// calls back to back, each d (docs/admission-queue.md, "Pacing").
//
// A waiter whose retry only a fair gate refused (limit.Status.Gated: the
// shared limit had the room, kept for members owed it) steps aside: the
// next turns go to the other due waiters, in the same order, and it
// retries again when none of them is left, or at once after a Notify. In
// strict order it took every paced turn while it was due, and the
// waiters behind it, which the gate would have admitted, got none (docs/
// admission-queue.md, "Fair share").

// QueueMargin is how long before the caller's deadline a waiter gives
// up waiting: the last retry's store call and the answer's way back to
// Envoy must fit in it, or Envoy times the call out and applies its own
// failure_mode_allow, which is no answer of ours.
const QueueMargin = 25 * time.Millisecond

// QueueOutcome is how a wait ended.
type QueueOutcome uint8

const (
	// QueueAdmitted: a retry admitted the request.
	QueueAdmitted QueueOutcome = iota
	// QueueTimeout: the tier's bound (or the caller's deadline less
	// QueueMargin) passed; the last refusal is answered.
	QueueTimeout
	// QueueRefused: a retry was refused by another stage (shedding, a
	// breaker), which is answered at once.
	QueueRefused
	// QueueGone: the caller gave up, or the store failed.
	QueueGone
)

// String is the outcome's metric label.
func (o QueueOutcome) String() string {
	switch o {
	case QueueAdmitted:
		return "admitted"
	case QueueTimeout:
		return "timeout"
	case QueueRefused:
		return "refused"
	default:
		return "gone"
	}
}

// QueueObserver is told what the queue does; pkg/app's metrics are one.
// It is called on the decision path, so it must not block.
type QueueObserver interface {
	// Queued reports a change of delta in the waiters of domain's tier.
	Queued(domain, tier string, delta int)
	// Waited reports a wait that ended after d with outcome o.
	Waited(domain, tier string, d time.Duration, o QueueOutcome)
	// Shed reports a refusal answered without a wait although the tier
	// may wait: full (its queue at max_length) or, when not, the caller's
	// deadline left no time to wait in.
	Shed(domain, tier string, full bool)
}

// Queue holds this replica's waiters (see the stage's comment above).
// Its zero value is not usable; use NewQueue.
type Queue struct {
	obs QueueObserver
	mu  sync.Mutex
	// doms are the queues of the domains with waiters, by name.
	doms map[string]*domQueue
	// waiting counts the waiters of every domain (changed under mu), so
	// that Notify, called on every settle, release and refund, takes no
	// lock while nothing waits, the usual state.
	waiting atomic.Int64
	// avgMu guards avgs apart from mu: the retry budget reads an average
	// on every admitted decision of its domains, and must not wait on
	// the waiters' turns.
	avgMu sync.Mutex
	// avgs are the recent waits of each domain that had a waiter. Only
	// a waiter adds one, and only a domain of the rules with a queue
	// has waiters, so a client's unknown domain never adds a key; a
	// domain whose waits are forgotten is dropped when read.
	avgs map[string]*waitAverage
}

// NewQueue returns an empty queue reporting to obs (nil: to nobody).
func NewQueue(obs QueueObserver) *Queue {
	return &Queue{obs: obs, doms: map[string]*domQueue{}, avgs: map[string]*waitAverage{}}
}

// WithQueue makes the Limiter hold refused requests in q where a
// domain's queue lets them wait. Without it, domains' queues are
// ignored.
func WithQueue(q *Queue) Option { return func(l *Limiter) { l.queue = q } }

// domQueue is one domain's waiters.
type domQueue struct {
	// ranks are the waiters of each rank (limit.Queue.For), oldest first.
	ranks [][]*waiter
	// holder is the waiter whose retry runs; nil when none does.
	holder *waiter
	n      int
	// paced is when the domain's next retry may start, set by a refused
	// retry (see the stage's comment) and cleared by Notify.
	paced time.Time
	// pacer grants the turn at paced; created on the first pace and
	// stopped when the domain's last waiter leaves, so an idle domain
	// leaves no timer or goroutine behind.
	pacer *time.Timer
	// wake is the pacer's function: grant under the queue's lock.
	wake func()
	// notified counts Notify calls, and heldAt is its value when the
	// running retry was granted: a retry that began before a Notify
	// may be refused by a state the release has since changed, so its
	// refusal must not pace the domain.
	notified, heldAt uint64
}

// waiter is one held request.
type waiter struct {
	rank int
	// due: it should retry at its next turn.
	due bool
	// aside: its last retry only a fair gate refused; the due waiters
	// that are not aside go first.
	aside bool
	// turn receives when the waiter may retry; holder is then it.
	turn chan struct{}
}

// Notify tells the waiters of domain that capacity may have freed: each
// retries, in priority order.
func (q *Queue) Notify(domain string) {
	if q.waiting.Load() == 0 {
		return // a waiter that joins later retries on its own timer
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.doms[domain]
	if d == nil {
		return
	}
	for _, ws := range d.ranks {
		for _, w := range ws {
			w.due, w.aside = true, false
		}
	}
	d.notified++
	d.paced = time.Time{}
	if d.pacer != nil {
		d.pacer.Stop()
	}
	d.grant(time.Now())
}

// Len is the number of waiters of domain's rank (for tests and /debug).
func (q *Queue) Len(domain string, rank int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if d := q.doms[domain]; d != nil && rank < len(d.ranks) {
		return len(d.ranks[rank])
	}
	return 0
}

// AverageWait is the average wait of domain's requests whose wait ended
// in the last 10 to 20 seconds on this replica (0 when none waited): the
// retry budget's measure of how full the queue of the domain's upstream
// runs. It adds no key: any domain may be asked for.
func (q *Queue) AverageWait(domain string) time.Duration {
	q.avgMu.Lock()
	defer q.avgMu.Unlock()
	a := q.avgs[domain]
	if a == nil {
		return 0
	}
	d, n := a.get(time.Now())
	if n == 0 {
		delete(q.avgs, domain) // forgotten: a domain since removed leaves no key
	}
	return d
}

// recordWait adds a wait of domain's to its average.
func (q *Queue) recordWait(domain string, waited time.Duration) {
	q.avgMu.Lock()
	defer q.avgMu.Unlock()
	a := q.avgs[domain]
	if a == nil {
		a = &waitAverage{}
		q.avgs[domain] = a
	}
	a.add(time.Now(), waited)
}

// grant gives the turn to the first due waiter, in rank then FIFO
// order, unless a retry runs or the domain is paced until after now
// (then the pacer grants it at the pace's end); q.mu is held. Waiters
// aside go after every due waiter that is not, and when only they are
// due, the first of them goes and all are back in line.
func (d *domQueue) grant(now time.Time) {
	if d.holder != nil {
		return
	}
	w := d.first(false)
	if w == nil {
		if w = d.first(true); w == nil {
			return
		}
		for _, ws := range d.ranks {
			for _, o := range ws {
				o.aside = false
			}
		}
	}
	if wait := d.paced.Sub(now); wait > 0 {
		if d.pacer == nil {
			d.pacer = time.AfterFunc(wait, d.wake)
		} else {
			d.pacer.Reset(wait)
		}
		return
	}
	w.due = false
	d.holder = w
	d.heldAt = d.notified
	w.turn <- struct{}{} // cap 1, and only the holder is sent to
}

// first is the first due waiter in rank then FIFO order, among those
// aside or those not.
func (d *domQueue) first(aside bool) *waiter {
	for _, ws := range d.ranks {
		for _, w := range ws {
			if w.due && w.aside == aside {
				return w
			}
		}
	}
	return nil
}

// join adds a waiter of rank unless the rank holds maxLen already.
func (q *Queue) join(domain string, rank, maxLen int) *waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.doms[domain]
	if d == nil {
		d = &domQueue{}
		d.wake = func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			if q.doms[domain] == d { // not emptied (and replaced) since armed
				d.grant(time.Now())
			}
		}
		q.doms[domain] = d
	}
	for len(d.ranks) <= rank {
		d.ranks = append(d.ranks, nil)
	}
	if len(d.ranks[rank]) >= maxLen {
		if d.n == 0 {
			delete(q.doms, domain)
		}
		return nil
	}
	w := &waiter{rank: rank, turn: make(chan struct{}, 1)}
	d.ranks[rank] = append(d.ranks[rank], w)
	d.n++
	q.waiting.Add(1)
	return w
}

// ready marks w due, and gives it the turn if nobody holds it.
func (q *Queue) ready(domain string, w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.due = true
	q.doms[domain].grant(time.Now())
}

// done ends w's turn and passes it on. pace > 0: w's retry was refused
// with that RetryAfter (capped by poll), and the domain's next retry
// waits for it, unless a Notify came since the retry began. aside: only
// a fair gate refused it, and it steps aside (see the stage's comment).
func (q *Queue) done(domain string, w *waiter, pace time.Duration, aside bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.doms[domain]
	now := time.Now()
	if d.holder == w {
		d.holder = nil
		if pace > 0 && d.notified == d.heldAt {
			d.paced = now.Add(pace)
			w.aside = aside
		}
	}
	d.grant(now)
}

// leave removes w, passing its turn on if it held it, and records a
// wait of waited.
func (q *Queue) leave(domain string, w *waiter, waited time.Duration) {
	q.recordWait(domain, waited)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting.Add(-1)
	d := q.doms[domain]
	ws := d.ranks[w.rank]
	for i, o := range ws {
		if o == w {
			d.ranks[w.rank] = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	d.n--
	if d.holder == w {
		d.holder = nil
	}
	if d.n == 0 {
		if d.pacer != nil {
			d.pacer.Stop()
		}
		delete(q.doms, domain)
		return
	}
	d.grant(time.Now())
}

// hold is the queue stage: it returns dec unless the request may wait
// for it, and otherwise the decision its wait ends with.
func (l *Limiter) hold(ctx context.Context, req *limit.Request, dec *Decision, dom *limit.Domain, settles bool) (*Decision, error) {
	if l.queue == nil || dom == nil || dom.Queue == nil || settles || !mayWait(dec) || !mayQueue(ctx) {
		return dec, nil
	}
	qt, rank, ok := dom.Queue.For(dec.Tier)
	if !ok {
		return dec, nil
	}
	retry := func() (*Decision, error) {
		d, _, _, err := l.decide(ctx, req)
		return d, err
	}
	return l.queue.wait(ctx, dom.Name, dec.Tier, qt, rank, dom.Queue.PollEvery(), dec, retry)
}

// mayWait says whether dec is a refusal that capacity freeing may end: a
// rate limit's or concurrency cap's, answered by the store (not by
// store_failure), and not too large for any wait. The stage's comment
// says why no other refusal waits.
func mayWait(dec *Decision) bool {
	return dec.Code == limit.CodeOverLimit && dec.Reason == ReasonLimit && !dec.Degraded && !dec.Kept && dec.TooLarge() == nil
}

// wait holds one refused request (dec) of a tier that may wait.
func (q *Queue) wait(ctx context.Context, domain, tier string, qt limit.QueueTier, rank int, poll time.Duration,
	dec *Decision, retry func() (*Decision, error),
) (*Decision, error) {
	start := time.Now()
	end := start.Add(qt.MaxWait)
	if dl, ok := ctx.Deadline(); ok {
		if last := dl.Add(-QueueMargin); last.Before(end) {
			end = last
		}
	}
	if !end.After(start) {
		q.shed(domain, tier, false)
		return dec, nil
	}
	w := q.join(domain, rank, qt.MaxLength)
	if w == nil {
		q.shed(domain, tier, true)
		return dec, nil
	}
	if q.obs != nil {
		q.obs.Queued(domain, tier, 1)
	}
	out := QueueGone
	defer func() {
		waited := time.Since(start)
		q.leave(domain, w, waited)
		if q.obs != nil {
			q.obs.Queued(domain, tier, -1)
			q.obs.Waited(domain, tier, waited, out)
		}
	}()
	t := time.NewTimer(until(dec, poll, start, end))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			now := time.Now()
			if !now.Before(end) {
				out = QueueTimeout
				return dec, nil
			}
			// Due now: the turn comes when the waiters ahead of it have
			// retried; meanwhile only the bound can end the wait.
			q.ready(domain, w)
			t.Reset(end.Sub(now))
		case <-w.turn:
			if !time.Now().Before(end) {
				// The turn came after the bound (the waiters ahead held
				// it): a retry now would overrun the bound by a store call.
				q.done(domain, w, 0, false)
				out = QueueTimeout
				return dec, nil
			}
			next, err := retry()
			// Refused again, by the limits: the domain's next retry waits
			// for the refusal's RetryAfter too.
			again := err == nil && mayWait(next)
			var pace time.Duration
			if again {
				pace = retryIn(next, poll)
			}
			q.done(domain, w, pace, again && gated(next))
			switch {
			case err != nil:
				return nil, err
			case next.Code == limit.CodeOK:
				out = QueueAdmitted
				return next, nil
			case !again:
				out = QueueRefused // by another stage, answered at once
				return next, nil
			}
			dec = next
			now := time.Now()
			if !now.Before(end) {
				out = QueueTimeout
				return dec, nil
			}
			t.Reset(until(dec, poll, now, end))
		}
	}
}

// gated reports whether only fair gates refused dec: every descriptor
// over its limit was denied with room left (limit.Status.Gated).
func gated(dec *Decision) bool {
	refused := false
	for _, st := range dec.Statuses {
		if st.Code == limit.CodeOverLimit {
			if !st.Gated {
				return false
			}
			refused = true
		}
	}
	return refused
}

// until is how long from now a waiter refused by dec waits before it
// retries on its own: retryIn, and not past end.
func until(dec *Decision, poll time.Duration, now, end time.Time) time.Duration {
	return max(min(retryIn(dec, poll), end.Sub(now)), time.Millisecond)
}

// retryIn is how soon capacity may free for a request refused by dec:
// the soonest RetryAfter of its refused descriptors (a bucket ageing
// out), at most poll (capacity freed elsewhere is seen no later).
func retryIn(dec *Decision, poll time.Duration) time.Duration {
	d := poll
	for _, st := range dec.Statuses {
		if st.Code == limit.CodeOverLimit && st.RetryAfter > 0 {
			d = min(d, st.RetryAfter)
		}
	}
	return d
}

// shed reports a refusal of a tier that may wait, answered at once.
func (q *Queue) shed(domain, tier string, full bool) {
	if q.obs != nil {
		q.obs.Shed(domain, tier, full)
	}
}

// waitAverage averages the waits that ended in two 10 s buckets, the
// current one and the one before, so it forgets a burst within 20 s.
type waitAverage struct {
	start     time.Time
	sum, prev time.Duration
	n, prevN  int64
}

const waitBucket = 10 * time.Second

func (a *waitAverage) roll(now time.Time) {
	switch {
	case now.Sub(a.start) < waitBucket:
	case now.Sub(a.start) < 2*waitBucket:
		a.prev, a.prevN = a.sum, a.n
		a.sum, a.n = 0, 0
		a.start = a.start.Add(waitBucket)
	default:
		a.prev, a.prevN, a.sum, a.n = 0, 0, 0, 0
		a.start = now
	}
}

func (a *waitAverage) add(now time.Time, d time.Duration) {
	a.roll(now)
	a.sum += d
	a.n++
}

// get is the average and the number of waits it is over.
func (a *waitAverage) get(now time.Time) (time.Duration, int64) {
	a.roll(now)
	if n := a.n + a.prevN; n > 0 {
		return (a.sum + a.prev) / time.Duration(n), n
	}
	return 0, 0
}
