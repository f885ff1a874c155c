// Package lease is a limit.Store decorator that lets a replica spend a
// slice of a high limit's room locally, so most decisions on a busy key
// make no store call at all.
//
// # How a lease works
//
// When a decision reaches the store, each of its leasable charges asks for
// Cost plus an extra: the lease. The store keeps the extra exactly as it
// keeps a charge, so for every other replica those units are spent. This
// replica then admits later decisions on the key from the lease, with no
// store call, until the lease is used up or ends. What is left when it
// ends goes back to the store as a refund aimed at the bucket it was
// charged in (Charge.At).
//
// # Why no window ever admits more than its limit
//
// A unit admitted from a lease was counted by the store before it was
// admitted, in the bucket of the grant. A lease ends before the bucket it
// was granted in ends (by this replica's clock, with a guard of an eighth
// of the bucket, at least 5 and at most 100 ms), so every local admission happens inside
// the bucket that counts it, or an earlier one when the store's high-water
// bucket was ahead: the store counted it for at least as long as a
// direct charge would have been. The sum the store sees is therefore
// never below what the replicas admitted, in any interval, and the
// store's own promise (see limit.Charge) carries over.
//
// A refund only removes units that were never admitted, and it is sent
// before the grant's bucket ends, so it is taken from that bucket (or,
// for a fixed window, from that window). A refund that cannot be sent in
// time is dropped: those units stay spent until their bucket leaves the
// window, which can only refuse more, never admit more. This assumes the
// replicas' clocks agree within half the guard (2.5-50 ms), the same
// assumption the store's high-water buckets make.
//
// # What is leased
//
// Sliding and fixed window charges with Cost > 0 whose limit is at least
// Options.MinAmount, in decisions made only of window and token bucket
// charges with Cost >= 0 and no Force: a decision the store denies then
// keeps nothing, so a denial caused by the extra is retried once without
// it. Refunds, Force charges, Once marks, concurrency leases and shadow
// charges always go to the store. A decision with a fair-shared charge
// (Charge.Fair.Policy set) goes to the store whole, as it came: the fair
// gate orders the members by what each was admitted, so it must see every
// decision on the shared limit, once; a lease would admit in bulk behind
// its back, and a retry without the extras would record the decision
// twice. Leasing the decision's other charges would save no store call.
// A lease is tied to the limit it was
// granted under: a decision carrying the key under another Amount (a plan
// or pressure change) asks the store.
//
// # Sizing
//
// Only a key decided on again within MaxLife of its last decision is
// leased: the first decision on a key, and every decision on a key seen
// once in a while (a long tail of tenants), asks the store for its own
// cost only, as a lease there would cost a refund per decision. Such keys
// are remembered in a fixed table of hashes per shard, not an entry each
// (shard.once), so a long tail costs no memory and no garbage collection
// that grow with it. A lease
// takes at most Options.Fraction of the room the store last reported, so
// replicas share what is left and, near the limit, leases shrink to
// nothing and every decision asks the store. Within that, a key's next
// lease doubles when the last one ran out before it ended and shrinks to
// what was used when it ended with units left. Keys with no lease make
// room for new ones when MaxEntries are tracked.
package lease

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Defaults used when Options leaves a field at zero.
const (
	DefaultMinAmount  = 1000
	DefaultFraction   = 0.1
	DefaultMaxLife    = time.Second
	DefaultMaxEntries = 100_000
	// firstLease is the extra the first grant on a key asks for.
	firstLease = 16
	// idleAfter is how long a key's sizing is remembered with no lease.
	idleAfter = 10 * time.Second
	// maxWaits bounds how many refills of a key a decision waits for,
	// and maxWait how long it waits in all.
	maxWaits = 8
	maxWait  = 50 * time.Millisecond
	// returnBatch bounds the refunds sent in one store call.
	returnBatch = 64
	// returnTimeout bounds one store call that gives units back.
	returnTimeout = time.Second
	// returnTick is how often Run looks for ended leases: well within
	// the half guard (at least 2.5 ms) a refund has to reach the store.
	returnTick = 2 * time.Millisecond
)

const shardCount = 64

// Options configures a Store.
type Options struct {
	// MinAmount is the smallest limit leased (Optional; default
	// DefaultMinAmount). Below it every decision asks the store: a lease
	// of a small limit would strand too much of it on one replica.
	MinAmount uint64
	// Fraction is the most of a limit's remaining room one lease takes,
	// in (0, 1] (Optional; default DefaultFraction).
	Fraction float64
	// MaxLife bounds how long a lease is spent (Optional; default
	// DefaultMaxLife). A lease also ends before its bucket does.
	MaxLife time.Duration
	// MaxEntries bounds the keys tracked (Optional; default
	// DefaultMaxEntries); past it, new keys are not leased.
	MaxEntries int
	// Clock tells Run the time (Optional; default limit.SystemClock).
	Clock limit.Clock
}

// Stats counts what the Store did, for metrics.
type Stats struct {
	// Local is the decisions admitted from leases, with no store call.
	Local uint64
	// Granted is the leases granted, and GrantedUnits their units.
	Granted, GrantedUnits uint64
	// Returned is the units given back to the store unused.
	Returned uint64
	// Dropped is the units left unused that could not be given back in
	// time (or whose refund failed); they stay spent until their bucket
	// leaves the window.
	Dropped uint64
	// Retries is the decisions asked again without leases because the
	// extra did not fit.
	Retries uint64
	// Keys is the keys tracked now.
	Keys int
}

// Store is a limit.Store that leases room from inner; see the package
// doc. It is safe for concurrent use. Run gives ended leases back; a
// Store whose Run is not running still never over-admits, it only drops
// what it does not use.
type Store struct {
	inner    limit.Store
	opts     Options
	perShard int
	shards   [shardCount]shard

	qmu   sync.Mutex
	queue grantHeap // grants with units, by end

	scratch sync.Pool // *scratch

	local, granted, grantedUnits, returned, dropped, retries atomic.Uint64
}

var _ limit.Store = (*Store)(nil)

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	// once remembers keys decided on once, by a hash of the key and its
	// limit, until a second decision within MaxLife makes an entry of
	// one. A long tail of tenants each decided on once in a while so
	// costs no entry: an entry per key made the live heap, and the
	// garbage collector's marking, grow with the keys (on a million
	// distinct keys the mark workers took 17% of the CPU, against 5%
	// without leases). The array holds no pointers, so the collector
	// does not scan it. A slot is overwritten by the next key that hashes
	// to it: a key seen again after that is remembered anew, and leased
	// one decision later.
	once [onceSlots]onceSeen
}

// onceSlots is how many keys seen once a shard remembers (32 bytes each).
const onceSlots = 1024

// onceSeen is a key seen once: h its hash (onceHash), at when (an
// entry's seen and last), room as an entry's.
type onceSeen struct {
	h    uint64
	at   int64
	room uint64
}

// onceHash is a 64-bit FNV-1a of a charge's key and limit; never 0 (the
// empty slot).
func onceHash(c *limit.Charge) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(c.Key); i++ {
		h ^= uint64(c.Key[i])
		h *= 1099511628211
	}
	for _, v := range [...]uint64{uint64(c.Algorithm), c.Amount, uint64(c.Window), uint64(c.Buckets)} {
		h ^= v
		h *= 1099511628211
	}
	return max(h, 1)
}

// seenOnce returns the entry charge c's key, of hash h (onceHash), seen
// once within maxLife before now, becomes, added to the shard, and clears
// its slot; nil when the key was not seen so, or the shard is full of
// leased keys. The caller holds sh.mu and has found no entry for c.Key.
func (sh *shard) seenOnce(c *limit.Charge, h uint64, now, maxLife int64, perShard int) *entry {
	o := &sh.once[h%onceSlots]
	if o.h != h || now-o.at >= maxLife {
		return nil
	}
	if len(sh.m) >= perShard && !sh.evictIdle() {
		return nil
	}
	e := &entry{alg: c.Algorithm, amount: c.Amount, window: c.Window, buckets: c.Buckets, next: firstLease,
		room: o.room, seen: o.at, last: o.at}
	sh.m[c.Key] = e
	*o = onceSeen{}
	return e
}

// entry is what the Store knows about one key.
type entry struct {
	// The limit the key is leased under.
	alg     limit.Algorithm
	amount  uint64
	window  time.Duration
	buckets uint16
	cur     *grant // the lease being spent, nil when none
	next    int64  // the extra the next grant asks for
	// room is the store's last Remaining for the key, not counting this
	// replica's lease; seen is when (Unix ms).
	room uint64
	seen int64
	// last is when the key was last decided on (Unix ms), here or by the
	// store.
	last int64
	// rate is the units per ms the key's last lease was spent at.
	rate float64
	// refill is closed when the store call asking for the key's next
	// lease returns; nil when none is under way.
	refill chan struct{}
}

func (e *entry) sameLimit(c *limit.Charge) bool {
	return e.alg == c.Algorithm && e.amount == c.Amount && e.window == c.Window && e.buckets == c.Buckets
}

// grant is one lease.
type grant struct {
	key   string
	limit limit.Charge // Key, Algorithm, Amount, Window, Buckets of the refund
	at    int64        // when its units were charged (Unix ms)
	end   int64        // admit from it only before this
	by    int64        // give units back only before this
	size  int64        // units granted
	// balance is the units left; guarded by the key's shard lock, and 0
	// once the grant has ended.
	balance int64
	ended   bool
	// room and reset are the store's Remaining and reset instant (Unix
	// ms) at the grant, for the Results of local admissions.
	room  uint64
	reset int64
	index int // in the heap
}

// New returns a Store that leases room from inner.
func New(inner limit.Store, opts Options) *Store {
	if opts.MinAmount == 0 {
		opts.MinAmount = DefaultMinAmount
	}
	if opts.Fraction <= 0 || opts.Fraction > 1 {
		opts.Fraction = DefaultFraction
	}
	if opts.MaxLife <= 0 {
		opts.MaxLife = DefaultMaxLife
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.Clock == nil {
		opts.Clock = limit.SystemClock{}
	}
	s := &Store{inner: inner, opts: opts, perShard: max(1, opts.MaxEntries/shardCount)}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	s.scratch.New = func() any { return new(scratch) }
	return s
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return Stats{
		Local: s.local.Load(), Granted: s.granted.Load(), GrantedUnits: s.grantedUnits.Load(),
		Returned: s.returned.Load(), Dropped: s.dropped.Load(), Retries: s.retries.Load(), Keys: n,
	}
}

func (s *Store) shardOf(key string) *shard {
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &s.shards[h%shardCount]
}

// scratch is one Apply's working space.
type scratch struct {
	charges []limit.Charge
	extra   []int64
	marks   []chan struct{}
}

// Apply admits a decision from leases when it can, and otherwise asks
// inner, asking for leases on the way.
func (s *Store) Apply(ctx context.Context, now time.Time, charges []limit.Charge, res []limit.Result) (bool, error) {
	nowMs := now.UnixMilli()
	if !retryable(charges) || fairShared(charges) {
		return s.inner.Apply(ctx, now, charges, res)
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	// Many decisions find a lease used up at once. One asks the store for
	// the next; the others wait for its answer rather than each taking a
	// lease of their own, a store call each. A lease too small for all
	// of them leaves some to wait for the next; after a few rounds, or
	// when the store is slow to answer, they ask it themselves. A
	// decision that cannot be admitted locally anyway does not wait.
	leased := s.allLeasable(charges)
	var timeout <-chan time.Time
	for wait := 0; ; wait++ {
		if leased && s.admitLocally(nowMs, charges, res) {
			s.local.Add(1)
			return true, nil
		}
		busy := s.prepare(nowMs, charges, sc, leased && wait < maxWaits)
		if busy == nil {
			break
		}
		if timeout == nil {
			t := time.NewTimer(maxWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-busy:
		case <-timeout:
			leased = false // waited enough: ask the store
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	defer func() {
		s.release(charges, sc.marks)
		clear(sc.marks)
	}()
	asked := false
	for _, x := range sc.extra {
		asked = asked || x > 0
	}
	if !asked {
		admitted, err := s.inner.Apply(ctx, now, charges, res)
		if err == nil {
			s.observe(nowMs, charges, res, nil)
		}
		return admitted, err
	}
	admitted, err := s.inner.Apply(ctx, now, sc.charges, res)
	if err != nil {
		return false, err
	}
	if admitted {
		s.observe(nowMs, charges, res, sc.extra)
		return true, nil
	}
	// Ask again without leases when the decision was denied only by
	// charges whose cost alone would have fit.
	retry := false
	for i, x := range sc.extra {
		if res[i].Fits || charges[i].Shadow {
			continue
		}
		if !fitsWithoutLease(charges[i].Cost, x, res[i]) {
			retry = false
			break
		}
		retry = true
	}
	s.observe(nowMs, charges, res, nil)
	if !retry {
		// Denied by a charge without a lease: the extras changed nothing,
		// but a leased charge was answered for its cost plus the lease.
		// Alone, its cost fits when the room covers it: say so, or the
		// caller reports that descriptor over its limit too.
		fitsAlone(charges, sc.extra, res)
		return false, nil
	}
	s.retries.Add(1)
	admitted, err = s.inner.Apply(ctx, now, charges, res)
	if err == nil {
		s.observe(nowMs, charges, res, nil)
	}
	return admitted, err
}

// prepare fills sc with the decision's charges, each with the lease it
// asks for, and marks the keys it asks for as being refilled. When another
// decision is refilling one of them and wait is true, it takes nothing
// and returns that decision's mark, to wait for.
func (s *Store) prepare(now int64, charges []limit.Charge, sc *scratch, wait bool) (busy chan struct{}) {
	sc.charges = append(sc.charges[:0], charges...)
	sc.extra, sc.marks = sc.extra[:0], sc.marks[:0]
	for i := range sc.charges {
		x, mark, other := s.extraFor(now, charges, i)
		if other != nil && wait {
			s.release(charges, sc.marks)
			clear(sc.marks)
			sc.marks = sc.marks[:0]
			return other
		}
		sc.extra = append(sc.extra, x)
		sc.marks = append(sc.marks, mark)
		sc.charges[i].Cost += x
	}
	return nil
}

// retryable reports whether a decision keeps nothing when denied, so it
// may be asked again: window and token bucket charges, none a refund or
// Force, and at least one.
func retryable(charges []limit.Charge) bool {
	for i := range charges {
		c := &charges[i]
		if c.Cost < 0 || c.Force || c.Algorithm > limit.TokenBucket {
			return false
		}
	}
	return len(charges) > 0
}

// fairShared reports whether a charge of the decision is fair-shared.
func fairShared(charges []limit.Charge) bool {
	for i := range charges {
		if charges[i].Fair.Policy != nil {
			return true
		}
	}
	return false
}

// leasable reports whether charge i of a retryable decision may be leased
// or admitted from a lease.
func (s *Store) leasable(charges []limit.Charge, i int) bool {
	c := &charges[i]
	if c.Algorithm > limit.FixedWindow || c.Shadow || c.Member != "" || c.At != 0 || c.Amount < s.opts.MinAmount {
		return false
	}
	for j := range charges {
		if j != i && charges[j].Key == c.Key {
			return false // a charge that sees another on its key
		}
	}
	return true
}

// allLeasable reports whether every charge of a retryable decision may
// be admitted from a lease.
func (s *Store) allLeasable(charges []limit.Charge) bool {
	for i := range charges {
		if !s.leasable(charges, i) {
			return false
		}
	}
	return true
}

// admitLocally admits the decision from leases, filling res, when every
// charge is leased with room for it; otherwise it changes nothing. The
// caller has checked allLeasable.
func (s *Store) admitLocally(now int64, charges []limit.Charge, res []limit.Result) bool {
	var buf [4]*grant
	taken := buf[:0]
	for i := range charges {
		c := &charges[i]
		sh := s.shardOf(c.Key)
		sh.mu.Lock()
		e := sh.m[c.Key]
		var g *grant
		if e != nil && e.sameLimit(c) {
			g = e.cur
		}
		if g == nil || g.ended || now >= g.end || now < g.at || g.balance < max(c.Cost, 1) {
			sh.mu.Unlock()
			s.undo(charges[:i], taken)
			return false
		}
		g.balance -= c.Cost
		e.last = now
		if g.balance == 0 {
			// Used up before it ended: the next lease may be larger.
			e.next = max(e.next, 2*g.size)
			e.rate = float64(g.size) / float64(max(1, now-g.at))
		}
		res[i] = limit.Result{Fits: true, Remaining: min(c.Amount, g.room+uint64(g.balance)), ResetAfter: ms(max(0, g.reset-now))}
		sh.mu.Unlock()
		taken = append(taken, g)
	}
	return true
}

// undo gives back what admitLocally took from taken[i] for charges[i], to
// the very grant it came from: units put into another grant would be
// units the store never counted. A grant that ended meanwhile has given
// its rest back already, so what was taken from it is left unused.
func (s *Store) undo(charges []limit.Charge, taken []*grant) {
	for i, g := range taken {
		sh := s.shardOf(g.key)
		sh.mu.Lock()
		if !g.ended {
			g.balance += charges[i].Cost
		}
		sh.mu.Unlock()
	}
}

// extraFor returns the lease charge i of a retryable decision asks for.
// When it asks, and no other decision is asking for the key already, it
// marks the key as being refilled and returns the mark, for release.
func (s *Store) extraFor(now int64, charges []limit.Charge, i int) (x int64, mark, other chan struct{}) {
	c := &charges[i]
	if c.Cost <= 0 || !s.leasable(charges, i) {
		return 0, nil, nil
	}
	end, _, tail := s.bounds(c, now)
	sh := s.shardOf(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[c.Key]
	if e == nil {
		e = sh.seenOnce(c, onceHash(c), now, s.opts.MaxLife.Milliseconds(), s.perShard)
	}
	// Only a key used again within a lease's life is leased: a key seen
	// once (a long tail of tenants) would cost a refund per decision.
	if e == nil || !e.sameLimit(c) || now-e.last >= s.opts.MaxLife.Milliseconds() {
		return 0, nil, nil
	}
	want, room := max(e.next, 1), c.Amount
	if tail {
		// What the key used per ms, for the time left, and a quarter.
		want = int64(e.rate*float64(end-now)*1.25) + 1
	}
	if now-e.seen < s.opts.MaxLife.Milliseconds() {
		room = e.room
	}
	if uint64(c.Cost) >= room {
		return 0, nil, nil
	}
	x = max(0, min(want, int64(s.opts.Fraction*float64(room-uint64(c.Cost)))))
	switch {
	case x == 0:
	case e.refill != nil:
		other = e.refill
	default:
		mark = make(chan struct{})
		e.refill = mark
	}
	return x, mark, other
}

// release clears the refill marks taken for charges.
func (s *Store) release(charges []limit.Charge, marks []chan struct{}) {
	for i, mark := range marks {
		if mark == nil {
			continue
		}
		sh := s.shardOf(charges[i].Key)
		sh.mu.Lock()
		if e := sh.m[charges[i].Key]; e != nil && e.refill == mark {
			e.refill = nil
		}
		sh.mu.Unlock()
		close(mark)
	}
}

// bounds returns when a lease granted at now on c's key must stop being
// spent, and the instant before which its rest may still be given back.
// In the bucket's last guard a lease is spent up to the bucket's end and
// never given back (tail): its rest could no longer reach the store in
// time, so it is sized to what the key has been using.
func (s *Store) bounds(c *limit.Charge, now int64) (end, by int64, tail bool) {
	w := limit.BucketWidth(c)
	bucketEnd := limit.BucketEnd(c, now)
	guard := max(5, min(w/8, 100))
	if now >= bucketEnd-guard {
		return bucketEnd, 0, true
	}
	return min(now+s.opts.MaxLife.Milliseconds(), bucketEnd-guard), bucketEnd - guard/2, false
}

// observe records what the store said about each leasable charge of an
// answered decision, and the leases it granted (extra[i] > 0 on charges
// that were kept; extra is nil when none was).
func (s *Store) observe(now int64, charges []limit.Charge, res []limit.Result, extra []int64) {
	for i := range charges {
		c := &charges[i]
		if !s.leasable(charges, i) {
			continue
		}
		var x int64
		if extra != nil {
			x = extra[i]
		}
		sh := s.shardOf(c.Key)
		sh.mu.Lock()
		e := sh.m[c.Key]
		if e == nil {
			h := onceHash(c)
			if e = sh.seenOnce(c, h, now, s.opts.MaxLife.Milliseconds(), s.perShard); e == nil && x == 0 {
				// Seen once: remembered without an entry (shard.once).
				sh.once[h%onceSlots] = onceSeen{h: h, at: now, room: res[i].Remaining}
				sh.mu.Unlock()
				continue
			}
		}
		if e == nil || !e.sameLimit(c) {
			if e == nil && len(sh.m) >= s.perShard && !sh.evictIdle() {
				sh.mu.Unlock()
				continue
			}
			if e != nil && e.cur != nil {
				// Leased under another limit: stop spending it, and give
				// its rest back at once.
				s.endNow(e.cur)
			}
			e = &entry{alg: c.Algorithm, amount: c.Amount, window: c.Window, buckets: c.Buckets, next: firstLease}
			sh.m[c.Key] = e
		}
		e.room, e.seen, e.last = res[i].Remaining, now, now
		if x > 0 && res[i].Fits {
			s.grant(e, c, now, x, res[i])
			res[i].Remaining = min(c.Amount, res[i].Remaining+uint64(x))
		}
		sh.mu.Unlock()
	}
}

// grant records a lease of x units on e; the caller holds its shard lock.
func (s *Store) grant(e *entry, c *limit.Charge, now, x int64, r limit.Result) {
	s.granted.Add(1)
	s.grantedUnits.Add(uint64(x))
	end, by, _ := s.bounds(c, now)
	reset := now + r.ResetAfter.Milliseconds()
	if g := e.cur; g != nil && !g.ended && now < g.end && limit.BucketEnd(c, g.at) == limit.BucketEnd(c, now) {
		// Same bucket: one lease, returned at one At.
		g.balance += x
		g.size += x
		g.room, g.reset = r.Remaining, reset
		return
	}
	g := &grant{
		key:   c.Key,
		limit: limit.Charge{Key: c.Key, Algorithm: c.Algorithm, Amount: c.Amount, Window: c.Window, Buckets: c.Buckets},
		at:    now, end: end, by: by, size: x, balance: x, room: r.Remaining, reset: reset,
	}
	e.cur = g
	s.qmu.Lock()
	heap.Push(&s.queue, g)
	s.qmu.Unlock()
}

// endNow makes g end now: it admits nothing more, and Run gives its rest
// back on its next turn. The caller holds g's shard lock.
func (s *Store) endNow(g *grant) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	g.end = 0
	if g.index >= 0 {
		heap.Fix(&s.queue, g.index)
	}
}

// Run gives back the units of leases as they end, until ctx is done; then
// it ends every lease and gives back what is left (a replica shutting
// down returns its room to the others). It returns when that is done.
func (s *Store) Run(ctx context.Context) {
	t := time.NewTicker(returnTick)
	defer t.Stop()
	lastSweep := time.Time{}
	for {
		select {
		case <-ctx.Done():
			s.ReturnAll(context.WithoutCancel(ctx), s.opts.Clock.Now())
			return
		case <-t.C:
		}
		now := s.opts.Clock.Now()
		s.ReturnEnded(ctx, now)
		if now.Sub(lastSweep) >= time.Second {
			s.Forget(now)
			lastSweep = now
		}
	}
}

// ReturnEnded ends the leases whose time is up at now and gives back
// their unused units. Run calls it; tests call it directly.
func (s *Store) ReturnEnded(ctx context.Context, now time.Time) {
	s.returnGrants(ctx, now, false)
}

// ReturnAll ends every lease at now and gives back their unused units.
func (s *Store) ReturnAll(ctx context.Context, now time.Time) {
	s.returnGrants(ctx, now, true)
}

func (s *Store) returnGrants(ctx context.Context, now time.Time, all bool) {
	nowMs := now.UnixMilli()
	var refunds []limit.Charge
	for {
		s.qmu.Lock()
		var g *grant
		if len(s.queue) > 0 && (all || s.queue[0].end <= nowMs) {
			g = heap.Pop(&s.queue).(*grant)
		}
		s.qmu.Unlock()
		if g == nil {
			break
		}
		if bal := s.end(g); bal > 0 {
			if nowMs < g.by && nowMs >= g.at {
				r := g.limit
				r.Cost, r.At = -bal, g.at
				refunds = append(refunds, r)
			} else {
				s.dropped.Add(uint64(bal))
			}
		}
	}
	for len(refunds) > 0 {
		n := min(len(refunds), returnBatch)
		s.refund(ctx, now, refunds[:n])
		refunds = refunds[n:]
	}
}

// end ends g and returns its unused units.
func (s *Store) end(g *grant) int64 {
	sh := s.shardOf(g.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	bal := g.balance
	g.balance, g.ended = 0, true
	if e := sh.m[g.key]; e != nil && e.cur == g {
		e.cur = nil
		if used := g.size - bal; bal > 0 {
			// Ended with units left: ask next time for what was used, and
			// a quarter more.
			e.next = max(1, used+used/4)
			if g.end > g.at {
				e.rate = float64(used) / float64(g.end-g.at)
			}
		}
	}
	return bal
}

func (s *Store) refund(ctx context.Context, now time.Time, refunds []limit.Charge) {
	ctx, cancel := context.WithTimeout(ctx, returnTimeout)
	defer cancel()
	res := make([]limit.Result, len(refunds))
	var units uint64
	for i := range refunds {
		units += uint64(-refunds[i].Cost)
	}
	if _, err := s.inner.Apply(ctx, now, refunds, res); err != nil {
		s.dropped.Add(units)
		return
	}
	s.returned.Add(units)
}

// evictIdle makes room for one entry by dropping one with no lease, among
// the first few the map yields; the caller holds sh.mu. It reports
// whether it did.
func (sh *shard) evictIdle() bool {
	const look = 8
	n := 0
	for k, e := range sh.m {
		if e.cur == nil && e.refill == nil {
			delete(sh.m, k)
			return true
		}
		if n++; n == look {
			break
		}
	}
	return false
}

// Forget drops the sizing of keys with no lease for a while, so idle keys
// cost no memory. Run calls it every second.
func (s *Store) Forget(now time.Time) {
	cut := now.Add(-idleAfter).UnixMilli()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.cur == nil && e.seen < cut {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// grantHeap orders grants by end.
type grantHeap []*grant

func (h grantHeap) Len() int           { return len(h) }
func (h grantHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h grantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *grantHeap) Push(x any) { g := x.(*grant); g.index = len(*h); *h = append(*h, g) }
func (h *grantHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	g.index = -1
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return g
}

// fitsAlone corrects, in a denied decision's res, the answers to leased
// charges (extra[i] > 0) that did not fit only because of the lease they
// asked for: the room covers the charge's own cost, so it fits. Its
// Remaining stays the room, as in any denied decision, which keeps none.
func fitsAlone(charges []limit.Charge, extra []int64, res []limit.Result) {
	for i, x := range extra {
		if !res[i].Fits && fitsWithoutLease(charges[i].Cost, x, res[i]) {
			res[i].Fits, res[i].RetryAfter = true, 0
		}
	}
}

// fitsWithoutLease reports whether a charge of cost, asked for with a
// lease of extra > 0 and answered r, would have fit at its cost alone:
// the room r reports covers it. Apply's retry and fitsAlone both ask it.
func fitsWithoutLease(cost, extra int64, r limit.Result) bool {
	return extra > 0 && cost >= 0 && r.Remaining >= uint64(cost)
}
