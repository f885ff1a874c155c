package limit

import (
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"time"
)

// Fair share of one shared limit (issue 16; docs/fair-share.md has the
// design and why it keeps the laws). The shared limit's own counter keeps
// the hard cap; the fair gate only decides which fairness key may take
// the room the counter has, so it can deny more but never admit more.
//
// Each key k has a virtual finish F_k, the cost it was admitted over its
// (effective) weight as in weighted fair queuing. A key is waiting for
// FairPolicy.Backlog after a denial on the shared limit, as long as it was
// denied recently a fair part (fairUnmet) of what it asked. The state keeps a
// virtual Clock: every admission of cost c advances it by c over the sum
// of the weights of the waiting keys and the admitted one, so it is the F
// of a key that got exactly its share. The gate lets k ask the counter
// when k is less than a quantum of cost ahead of every waiting key, or
// when the counter's room left after k's cost still covers the reserve:
// what the waiting keys behind k need to catch up with it. So a waiting
// key keeps the room it is owed, freed room goes to keys in the order
// they are owed it, and room no waiting key is owed is not left unused.
// Whenever a key's F is read it is lifted to at most Credit behind the
// Clock in virtual time (w x Credit of cost for a key of weight w), so an
// idle or returning key is owed a bounded amount and banks no more.

// FairMaxKeys caps FairPolicy.MaxKeys: the state is read and written whole
// in every decision, in Go and in Lua.
const FairMaxKeys = 1024

// FairOverflowKey is the key every fairness key shares once the state
// holds MaxKeys others: hostile descriptor values cannot grow the state.
const FairOverflowKey = ""

// FairPolicy is how one shared limit is shared.
type FairPolicy struct {
	// MinShare is the fraction every key with demand gets at least, in
	// [0, 1). When n keys have n*MinShare >= 1 they share equally.
	MinShare float64
	// Backlog is how long a key has demand after it last asked, and the
	// longest a denial keeps it waiting.
	Backlog time.Duration
	// Quantum is how much cost a key may run ahead of the most owed
	// waiting key whatever the room (at least 1).
	Quantum float64
	// Credit is the most cost a key of weight 1 can be owed (at least
	// Quantum; a key of weight w, w times as much): how far behind its
	// share a key may fall and still catch up.
	Credit float64
	// MaxKeys caps the keys kept; others share FairOverflowKey. 0 means
	// FairMaxKeys.
	MaxKeys int
}

// FairKey is one fairness key's state.
type FairKey struct {
	Key string
	// Weight is the weight the key last asked with.
	Weight float64
	// Finish is the key's virtual finish F_k.
	Finish float64
	// Asked, Denied and Admitted are the Unix ms of the key's latest ask,
	// denial and admission on the shared limit (0: none).
	Asked, Denied, Admitted int64
	// Asks and Admits are the cost the key asked and was admitted,
	// decayed with a time constant of Backlog, as of Aged (Unix ms).
	Asks, Admits float64
	Aged         int64
}

// FairState is the fair-share state of one shared limit. A Store keeps it
// under the shared limit's hash tag and changes it only through Record,
// in the same atomic step as the shared limit's counter.
type FairState struct {
	// Clock is the virtual time of an exact weighted sharing: every
	// admission of cost c advances it by c over the sum of the weights of
	// the keys with demand.
	Clock float64
	// Keys are sorted by Key, so every computation over them visits them
	// in one order and Go and Lua agree to the bit.
	Keys []FairKey
}

// FairOutcome is what a decision did on the shared limit, for Record.
type FairOutcome uint8

const (
	// FairAdmitted: the decision was admitted and charged the shared limit.
	FairAdmitted FairOutcome = iota
	// FairDenied: the gate or the shared limit's own counter denied it.
	FairDenied
	// FairElsewhere: another charge denied the decision; it says nothing
	// of the key's share.
	FairElsewhere
)

func (p *FairPolicy) quantum() float64 { return max(p.Quantum, 1) }

func (p *FairPolicy) credit() float64 { return max(p.Credit, p.quantum()) }

func (p *FairPolicy) maxKeys() int {
	if p.MaxKeys <= 0 || p.MaxKeys > FairMaxKeys {
		return FairMaxKeys
	}
	return p.MaxKeys
}

// FairWeight clamps a weight to what the state can count: at least a
// millionth and at most MaxMultiplier (weights come from plan multipliers
// or a rule's map), NaN as 1.
func FairWeight(w float64) float64 {
	if math.IsNaN(w) {
		return 1
	}
	return min(max(w, 1e-6), MaxMultiplier)
}

func (k *FairKey) demand(p *FairPolicy, now int64) bool {
	return k.Asked > 0 && now-k.Asked < p.Backlog.Milliseconds()
}

// fairUnmet is the part of what a key asked, recently, that it must have
// been denied to count as waiting. A sliding window frees its room in
// lumps and denies everyone between them, light keys too: judged by
// denials alone, a key that asks less than its share would be waiting
// all the time, and the room kept for it would go unused. Measured on the
// light-tenant cases (docs/fair-share.md): 0.5 gives the light key about
// half of what it asks, 0.05 uses under 95% of the limit; 0.25 uses 99%
// and gives it three quarters.
const fairUnmet = 0.25

// waiting reports whether the key was denied within Backlog and, over
// about the last Backlog, was admitted less than 1-fairUnmet of what it
// asked.
func (k *FairKey) waiting(p *FairPolicy, now int64) bool {
	return k.Denied > 0 && now-k.Denied < p.Backlog.Milliseconds() && k.Admits < (1-fairUnmet)*k.Asks
}

// decay ages the key's ask and admission counts to now, with a time
// constant of Backlog.
func (k *FairKey) decay(p *FairPolicy, now int64) {
	if now > k.Aged {
		f := fairDecay(float64(now-k.Aged) / float64(max(p.Backlog.Milliseconds(), 1)))
		k.Asks *= f
		k.Admits *= f
		k.Aged = now
	}
}

// recentAsks is the cost the key asked over about the last Backlog: Asks
// aged to now as decay would age it, without writing the state. Gate holds
// no more room for a waiting key than this, as it would not ask for more
// before its waiting mark lapses. Without the cap, hundreds of slow
// waiting keys, each owed the whole lead of the key asking, made a reserve
// larger than the counter can ever hold: with a 5 s backlog the limit sat
// full after a spike while every key ahead was refused
// (docs/fair-share.md, "Defaults"). Capping by what the key asked and was
// not admitted (Asks - Admits) does as well there but breaks work
// conservation where a heavy key's unmet demand dips (TestFairWorkConserving,
// premium goes idle: one window at 94%).
func (k *FairKey) recentAsks(p *FairPolicy, now int64) float64 {
	if now > k.Aged {
		return float64(k.Asks * fairDecay(float64(now-k.Aged)/float64(max(p.Backlog.Milliseconds(), 1))))
	}
	return k.Asks
}

// fairDecay is e^-x for x >= 0, computed with + - * / only, each rounded
// on its own (the float64 conversions stop the compiler fusing them), so
// that Lua, whose math.exp is the C library's, repeats it to the bit:
// halve x to at most 1/2 (exact), sum the Taylor series there in Horner
// form, square back. Relative error about 1e-14; 0 past x = 64.
func fairDecay(x float64) float64 {
	if !(x > 0) {
		return 1
	}
	if x > 64 {
		return 0
	}
	k := 0
	for x > 0.5 {
		x /= 2
		k++
	}
	r := 1.0
	for i := 14; i >= 1; i-- {
		r = 1 - float64(float64(x/float64(i))*r)
	}
	for ; k > 0; k-- {
		r = float64(r * r)
	}
	return r
}

// find returns key's index, or where it goes and false.
func (s *FairState) find(key string) (int, bool) {
	return slices.BinarySearchFunc(s.Keys, key, func(k FairKey, key string) int { return strings.Compare(k.Key, key) })
}

// slot returns the key a decision counts under: key itself when known or
// when there is room, else FairOverflowKey.
func (s *FairState) slot(p *FairPolicy, key string) string {
	if _, ok := s.find(key); ok || len(s.Keys) < p.maxKeys() {
		return key
	}
	return FairOverflowKey
}

// lift returns a key's Finish f raised to at most Credit behind the
// Clock, in virtual time: a key of weight w is then owed at most w x
// Credit of cost. The floor is the same for every weight on purpose: a
// floor of Credit/w (the same cost for everyone) put a heavy key that had
// been refused for a while ahead of the light ones at their floors, by
// Credit x (1 - 1/w); the gate then held it back until every light key
// caught up. On spike-queue's traffic that starved premium for 8 s after
// the spike began, and a 10-window block's shares were off by up to 37%
// (docs/fair-share.md, "Lift").
func (s *FairState) lift(p *FairPolicy, f, _ float64) float64 {
	return max(f, s.Clock-p.credit())
}

// fairStack is how many keys' weights Gate, Record and fairFloor keep in
// a buffer on the stack: every decision on a fair-shared limit computes
// them, and up to this many keys it allocates nothing for them.
const fairStack = 64

// weights returns the effective weight of every key with demand at now
// (0 for the others), with key counted as having demand at weight w, in
// ws[:0]'s backing array when it is large enough.
func (s *FairState) weights(ws []float64, p *FairPolicy, now int64, key string, w float64) []float64 {
	ws = slices.Grow(ws[:0], len(s.Keys))
	for i := range s.Keys {
		k := &s.Keys[i]
		x := 0.0
		switch {
		case k.Key == key:
			x = w
		case k.waiting(p, now):
			x = k.Weight
		}
		ws = append(ws, x)
	}
	fairFloor(p.MinShare, ws)
	return ws
}

// Gate reports whether key, asking with weight for cost at now (Unix ms),
// may ask the shared limit, whose counter has room left (its Remaining
// before this decision). It changes nothing.
func (s *FairState) Gate(p *FairPolicy, now int64, key string, weight float64, cost, room int64) bool {
	key = s.slot(p, key)
	weight = FairWeight(weight)
	i, known := s.find(key)
	var buf [fairStack]float64
	ws := s.weights(buf[:0], p, now, key, weight)
	w := weight
	f := s.lift(p, s.Clock, w)
	if known {
		w = ws[i]
		f = s.lift(p, s.Keys[i].Finish, w)
	}
	if w <= 0 {
		w = weight
	}
	var reserve float64
	ahead := false
	for j := range s.Keys {
		k := &s.Keys[j]
		if k.Key == key || !k.waiting(p, now) {
			continue
		}
		kw := ws[j]
		g := s.lift(p, k.Finish, kw)
		if f >= g+p.quantum()/w {
			ahead = true
		}
		d := float64(kw * max(f-g, 0)) // rounded alone, as Lua does
		if d > 0 {
			d = min(d, k.recentAsks(p, now))
		}
		reserve += d
	}
	// In floats: a hostile cost must not wrap the subtraction.
	return !ahead || float64(room)-float64(max(cost, 0)) >= reserve
}

// Record writes what the decision at now did for key, asking with weight
// for cost, on the shared limit.
func (s *FairState) Record(p *FairPolicy, now int64, key string, weight float64, cost int64, out FairOutcome) {
	key = s.slot(p, key)
	weight = FairWeight(weight)
	i, ok := s.find(key)
	if !ok {
		s.Keys = slices.Insert(s.Keys, i, FairKey{Key: key, Finish: s.Clock})
	}
	var buf [fairStack]float64
	ws := s.weights(buf[:0], p, now, key, weight)
	k := &s.Keys[i]
	k.Weight, k.Asked = weight, now
	k.decay(p, now)
	if out != FairElsewhere {
		// A decision another charge denied says nothing of the key's
		// demand on this limit.
		k.Asks += float64(max(cost, 0))
	}
	if out == FairAdmitted {
		k.Admits += float64(max(cost, 0))
	}
	k.Finish = s.lift(p, k.Finish, ws[i])
	switch out {
	case FairAdmitted:
		c := float64(max(cost, 0))
		k.Finish += c / ws[i]
		k.Admitted = now
		var total float64
		for _, w := range ws {
			total += w
		}
		s.Clock += c / total
	case FairDenied:
		k.Denied = now
	}
	s.settle(p, now)
	s.forget(p, now)
}

// settle holds the Clock at or behind the weighted mean F of the waiting
// keys. Without it the Clock runs ahead whenever nobody waits (each
// admission then advances it by its cost over the admitted key's weight
// alone), and once contention starts every key is lifted to Credit behind
// it and stays at that floor: a backlogged key that did not ask in the
// moment room freed fell under the floor and lost what it was owed. On
// spike-queue's traffic (docs/fair-share.md, "Clock") the tier whose
// tenants ask least often lost 3% of its share that way. With the Clock at
// the mean, a waiting key is lifted only when it lags the waiting keys'
// mean by more than Credit, and a key that joins or comes back starts
// among them. The sums run in key order, each product rounded alone, as
// apply.lua repeats them.
func (s *FairState) settle(p *FairPolicy, now int64) {
	var sw, sf float64
	for i := range s.Keys {
		if k := &s.Keys[i]; k.waiting(p, now) {
			sw += k.Weight
			sf += float64(k.Weight * k.Finish)
		}
	}
	if sw > 0 {
		if m := sf / sw; s.Clock > m {
			s.Clock = m
		}
	}
}

// forget drops the keys that stopped asking and owe nothing (Finish at or
// behind the Clock): one that comes back starts at the Clock, as it would
// be lifted to it anyway. A key ahead of the Clock is kept until the
// Clock passes it, or leaving and coming back would wipe its debt.
func (s *FairState) forget(p *FairPolicy, now int64) {
	s.Keys = slices.DeleteFunc(s.Keys, func(k FairKey) bool {
		return !k.demand(p, now) && k.Finish <= s.Clock
	})
}

// fairFloor raises the weights ws (0: no demand) that are below share of
// the total to it, by water-filling: the weights that meet the floor stay,
// so shares stay proportional wherever the floor does not bind.
func fairFloor(share float64, ws []float64) {
	if share <= 0 {
		return
	}
	var buf [fairStack]float64
	n := 0
	for _, w := range ws {
		if w > 0 {
			n++
		}
	}
	sorted := slices.Grow(buf[:0], n)
	var total float64
	for _, w := range ws {
		if w > 0 {
			sorted = append(sorted, w)
			total += w
		}
	}
	slices.Sort(sorted)
	// Raise the r lightest to share*S', where S' = (the others' sum) /
	// (1 - r*share) is the total after raising; stop at the first r whose
	// lightest unraised weight already meets the floor.
	raised, rest := math.Inf(1), total
	for r, w := range sorted {
		left := 1 - float64(float64(r)*share)
		if left <= 0 {
			break
		}
		if x := share * rest / left; w >= x {
			raised = x
			break
		}
		rest -= w
	}
	for i, w := range ws {
		switch {
		case w == 0:
		case math.IsInf(raised, 1):
			// Every weight is under the floor (n*share >= 1): equal,
			// at the mean so the scale of F does not jump.
			ws[i] = total / float64(len(sorted))
		default:
			ws[i] = max(w, raised)
		}
	}
}

// FairShare is a rule's fair_share: each of the rule's limits is one
// absolute budget (never scaled by the plan multiplier) that the values
// of Key share by weight.
type FairShare struct {
	// Key is the descriptor entry key whose value is the fairness member.
	// It is looked up in every descriptor of the request, as the tiers
	// key is; a request without it asks as FairOverflowKey.
	Key string
	// Plan makes the request's plan multiplier its weight. Otherwise a
	// member weighs Weights[value], or DefaultWeight when not listed.
	Plan          bool
	Weights       map[string]float64
	DefaultWeight float64
	// Rate and Token are the policies of the rule's rate_limit and
	// token_limit, defaults resolved from each limit (Backlog: the
	// window; Credit: one bucket's share of the amount). nil when the
	// rule has no such limit.
	Rate, Token *FairPolicy
}

// FairCharge marks a Charge on a fair-shared limit. Policy nil means the
// charge is not fair-shared.
type FairCharge struct {
	Policy *FairPolicy
	// Member is FairMember of the fairness key's value.
	Member string
	// Weight is the member's weight (FairWeight clamps it).
	Weight float64
}

// FairMember is how a fairness key's value is kept in the state: a
// fixed-size hash (16 hex digits, FNV-64a), so hostile values of up to
// MaxValueBytes cannot make the state that every decision reads and
// writes whole any larger. FairOverflowKey ("") stays itself.
func FairMember(value string) string {
	if value == "" {
		return FairOverflowKey
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(value))
	return string(appendHex(make([]byte, 0, 16), h.Sum64()))
}
