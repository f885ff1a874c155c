package redisstore

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// call is one run of apply.lua: its KEYS and ARGV, and what decoding its
// reply needs.
type call struct {
	mode    string   // "apply", "try", "undo" or "void"
	keys    []string // counts: two per charge (see countsCall)
	args    []any
	now     int64
	charges int
	// admitted is the reply's verdict, once decoded.
	admitted bool
	// fn is the function the call runs: apply, counts (countsCall; ends
	// is then each charge's time to its window's end, should it count in
	// the window now is in) or plains (plainsCall).
	fn   fnKind
	ends []int64
	// keyBuf and argBuf back keys and args for a call of one charge
	// without a fair gate, the common one: in the call's allocation
	// rather than two of their own.
	keyBuf [2]string
	argBuf [argsHead + argsPerCharge + 1]any
	endBuf [1]int64
	// pend is the call's place in a batching store's queue (batcher.do).
	pend pending
	// incr runs a counts call by plain commands (WithOptimisticFixed),
	// ops holding them while they run.
	incr bool
	ops  []incrOp
}

// fnKind names one of the library's functions (see apply.lua).
type fnKind uint8

const (
	fnApply fnKind = iota
	fnCounts
	fnPlains
	fnKinds
)

// fnNames are the functions' names in apply.lua.
var fnNames = [fnKinds]string{fnApply: "apply", fnCounts: "counts", fnPlains: "plains"}

const (
	argsHead      = 3
	argsPerCharge = 8
	argsPerFair   = 11
	repPerCharge  = 4
)

func newCall(mode string, now int64, charges []limit.Charge) (*call, error) {
	if mode == "apply" {
		switch leanFn(charges) {
		case fnCounts:
			return countsCall(now, charges), nil
		case fnPlains:
			return plainsCall(now, charges)
		}
	}
	return applyCall(mode, now, charges)
}

// leanFn is the lean function that can run a decision: counts when every
// charge is a fixed window on a Countable key with Amount at most
// limit.MaxCount; plains when every charge is a sliding window, a token
// bucket or a fixed window on a key that is not Countable; fnApply for
// any other decision, and for any with a charge with Shadow, Force or a
// fair gate, or two charges on one key. (A Countable fixed window is
// always counted in its count key: a decision with one and charges of
// other kinds runs apply, which knows that layout too.)
func leanFn(charges []limit.Charge) fnKind {
	counts, plains := true, true
	for i := range charges {
		ch := &charges[i]
		if ch.Shadow || ch.Force || fairGated(ch) {
			return fnApply
		}
		for j := range i {
			if charges[j].Key == ch.Key {
				return fnApply
			}
		}
		switch ch.Algorithm {
		case limit.SlidingWindow, limit.TokenBucket:
			counts = false
		case limit.FixedWindow:
			if limit.Countable(ch.Key) {
				plains = false
				counts = counts && ch.Amount <= limit.MaxCount
			} else {
				counts = false
			}
		default:
			return fnApply
		}
	}
	switch {
	case counts:
		return fnCounts
	case plains:
		return fnPlains
	}
	return fnApply
}

// applyCall is the call of apply, the function that runs any decision.
func applyCall(mode string, now int64, charges []limit.Charge) (*call, error) {
	// Count the fair charges first so that keys and args are allocated
	// once at their final size: each fair charge adds a state key and its
	// script entry, which outgrew the per-charge capacity and copied both.
	fair := 0
	for i := range charges {
		if fairGated(&charges[i]) {
			fair++
		}
	}
	c := &call{mode: mode, now: now, charges: len(charges)}
	if nk, na := len(charges)+fair, argsHead+argsPerCharge*len(charges)+1+argsPerFair*fair; nk <= len(c.keyBuf) && na <= len(c.argBuf) {
		c.keys, c.args = c.keyBuf[:0], c.argBuf[:argsHead]
	} else {
		c.keys, c.args = make([]string, 0, nk), make([]any, argsHead, na)
	}
	c.args[0], c.args[1], c.args[2] = modeArg(mode), now, len(charges)
	for i := range charges {
		ch := &charges[i]
		kind, p1, p2, p3, err := params(ch)
		if err != nil {
			return nil, fmt.Errorf("charges[%d]: %w", i, err)
		}
		if fairGated(ch) {
			if err := checkFair(ch); err != nil {
				return nil, fmt.Errorf("charges[%d]: %w", i, err)
			}
		}
		key := ch.Key
		if kind == kindF {
			if k, ok := limit.CountKey(ch, now); ok {
				kind, key = kindI, k
			}
		}
		c.args = append(c.args, c.key(key), kind, ch.Amount, p1, p2, p3, ch.Cost, flags(ch))
	}
	c.args = append(c.args, fair)
	for i := range charges {
		if ch := &charges[i]; fairGated(ch) {
			c.args = fairArgs(c.args, i+1, c.key(limit.FairStateKey(ch.Key)), ch)
		}
	}
	return c, nil
}

// The script's string arguments, each boxed once here: a string value
// put in an any is copied to the heap each time, an allocation per
// argument. params and flags return these; modeArg picks the mode's.
var (
	argApply, argTry, argUndo, argVoid       any = "apply", "try", "undo", "void"
	kindS, kindF, kindI, kindT, kindC, kindO any = "s", "f", "i", "t", "c", "o"
	flagS, flagF, flagSF, flagNone           any = "s", "f", "sf", ""
)

// ttlMargin is apply.lua's: a key lives this long (ms) past the time its
// counter is equivalent to a fresh one.
const ttlMargin = 1000

// countsCall returns the call of counts for a decision leanFn gives to
// it: per charge, the count keys (limit.CountKey) of the window now is
// in and of the next one, and amount, cost and the key's expiry.
func countsCall(now int64, charges []limit.Charge) *call {
	c := &call{mode: "apply", now: now, charges: len(charges), fn: fnCounts}
	if len(charges) == 1 {
		c.keys, c.args, c.ends = c.keyBuf[:0], c.argBuf[:1], c.endBuf[:0]
	} else {
		c.keys, c.args, c.ends = make([]string, 0, 2*len(charges)), make([]any, 1, 1+3*len(charges)), make([]int64, 0, len(charges))
	}
	c.args[0] = len(charges)
	for i := range charges {
		ch := &charges[i]
		end := limit.BucketEnd(ch, now) // a fixed window is one bucket
		key, next, _ := limit.CountKeys(ch, now)
		c.ends = append(c.ends, end-now)
		c.keys = append(c.keys, key, next)
		c.args = append(c.args, ch.Amount, clampCost(ch.Cost), end-now+ttlMargin)
	}
	return c
}

// plainsCall returns the call of plains for a decision leanFn gives to it.
func plainsCall(now int64, charges []limit.Charge) (*call, error) {
	c := &call{mode: "apply", now: now, charges: len(charges), fn: fnPlains}
	if na := 2 + argsPlain*len(charges); len(charges) <= len(c.keyBuf) && na <= len(c.argBuf) {
		c.keys, c.args = c.keyBuf[:0], c.argBuf[:2]
	} else {
		c.keys, c.args = make([]string, 0, len(charges)), make([]any, 2, na)
	}
	c.args[0], c.args[1] = len(charges), now
	for i := range charges {
		ch := &charges[i]
		kind, p1, p2, p3, err := params(ch)
		if err != nil {
			return nil, fmt.Errorf("charges[%d]: %w", i, err)
		}
		c.keys = append(c.keys, ch.Key)
		c.args = append(c.args, kind, ch.Amount, p1, p2, p3, ch.Cost)
	}
	return c, nil
}

// argsPlain is how many arguments plains takes per charge.
const argsPlain = 6

// clampCost is the script's cost: |Cost| saturated at limit.MaxCount.
func clampCost(x int64) int64 {
	return max(min(x, limit.MaxCount), -limit.MaxCount)
}

// decodeCounts reads the part of a counts reply that is c's, one count
// per charge (what the charge's window held), into res, as apply.lua's
// fixed-window step and report would have: see counts.
func (c *call) decodeCounts(rep []any, charges []limit.Charge, res []limit.Result) (bool, error) {
	if len(rep) != len(charges) {
		return false, malformed("%d counts for %d charges", len(rep), len(charges))
	}
	admitted := true
	for i := range charges {
		n, end, err := c.found(rep, charges, i)
		if err != nil {
			return false, err
		}
		ch, r := &charges[i], &res[i]
		x, amount := clampCost(ch.Cost), ch.Amount
		switch {
		case x > 0:
			r.Fits = uint64(x) <= amount && uint64(n) <= amount-uint64(x)
		case x == 0:
			r.Fits = amount > 0 && uint64(n) <= amount
		default:
			r.Fits = true
		}
		r.RetryAfter = 0
		if !r.Fits {
			r.RetryAfter = limit.Millis(end)
			admitted = false
		}
	}
	for i := range charges {
		n, end, _ := c.found(rep, charges, i)
		ch, r := &charges[i], &res[i]
		switch x := clampCost(ch.Cost); {
		case x > 0 && admitted:
			n += x
		case x < 0:
			n = max(n+x, 0)
		}
		r.Remaining = ch.Amount - min(uint64(n), ch.Amount)
		r.ResetAfter = limit.Millis(end)
	}
	c.admitted = admitted
	return admitted, nil
}

// found reads counts' value for charges[i]: the count the charge found,
// and the time (ms) to the end of the window it counted in, the next one
// when a clock ahead had started it (-2 - count).
func (c *call) found(rep []any, charges []limit.Charge, i int) (n, end int64, err error) {
	n, err = integer(rep[i])
	switch {
	case err != nil:
		return 0, 0, malformed("charges[%d]: count: %v", i, err)
	case n == -1:
		return 0, 0, fmt.Errorf("%w: charges[%d]: key %q holds no count", errReply, i, c.keys[2*i])
	case n < -1:
		return -2 - n, c.ends[i] + limit.WindowMillis(&charges[i]), nil
	}
	return n, c.ends[i], nil
}

// modeArg is mode as the script's first argument.
func modeArg(mode string) any {
	switch mode {
	case "apply":
		return argApply
	case "try":
		return argTry
	case "undo":
		return argUndo
	case "void":
		return argVoid
	}
	return mode
}

// key returns the KEYS index (from 1) of key, adding it if new.
func (c *call) key(key string) int {
	for j, k := range c.keys {
		if k == key {
			return j + 1
		}
	}
	c.keys = append(c.keys, key)
	return len(c.keys)
}

// fairGated reports whether ch goes through its fair gate and is
// recorded, as memstore decides: a charge or a check on a window or token
// bucket with a policy. A refund or a Force charge records cost already
// spent and asks nobody; Concurrency and Once have no room to share.
func fairGated(ch *limit.Charge) bool {
	return ch.Fair.Policy != nil && ch.Cost >= 0 && !ch.Force &&
		(ch.Algorithm == limit.SlidingWindow || ch.Algorithm == limit.FixedWindow || ch.Algorithm == limit.TokenBucket)
}

// checkFair refuses what the script's fair gate cannot repeat to the bit:
// a member that is not limit.FairMember's (the script keeps a member as
// the two numbers of its hex halves, which order members as bytes only in
// that form), and a policy
// value that is NaN or infinite (Go's max and Lua's differ on NaN).
func checkFair(ch *limit.Charge) error {
	if !fairMember(ch.Fair.Member) {
		return fmt.Errorf("fair member %q is not a limit.FairMember", ch.Fair.Member)
	}
	p := ch.Fair.Policy
	if !(p.MinShare >= 0 && p.MinShare < 1) || !finite(p.Quantum) || !finite(p.Credit) {
		return fmt.Errorf("fair policy %+v out of range", *p)
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// fairMember reports whether m is "" or 16 lowercase hex digits.
func fairMember(m string) bool {
	if m == limit.FairOverflowKey {
		return true
	}
	if len(m) != 16 {
		return false
	}
	for i := range len(m) {
		if c := m[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// fairArgs appends the script's fair entry for charges[j-1], ch, whose
// state is KEYS[ki] (see apply.lua). Floats go as go-redis writes them,
// the shortest decimal that reads back as the same double. The weight is
// clamped here and again in the script; the cost is max(Cost, 0) as the
// float64 limit.FairState sees, not the script's saturated count.
func fairArgs(args []any, j, ki int, ch *limit.Charge) []any {
	p := ch.Fair.Policy
	backlog := p.Backlog.Milliseconds()
	maxKeys := p.MaxKeys
	if maxKeys <= 0 || maxKeys > limit.FairMaxKeys {
		maxKeys = limit.FairMaxKeys
	}
	// The state lives a window past the last asking key's backlog (the
	// script adds ttlMargin).
	ttl := max(backlog, 0) + limit.WindowMillis(ch)
	return append(args, j, ki, p.MinShare, backlog, p.Quantum, p.Credit, maxKeys,
		ch.Fair.Member, limit.FairWeight(ch.Fair.Weight), float64(max(ch.Cost, 0)), ttl)
}

// flags are the script's spelling of Shadow and Force.
func flags(ch *limit.Charge) any {
	switch {
	case ch.Shadow && ch.Force:
		return flagSF
	case ch.Shadow:
		return flagS
	case ch.Force:
		return flagF
	}
	return flagNone
}

// params maps a charge to the script's kind and parameters (see
// apply.lua), with limit.Counter's readings (limit.WindowMillis and
// limit.Geometry): a window under 1ms is 1ms, Buckets above
// limit.MaxBuckets is limit.MaxBuckets, At counts on a sliding window
// only.
func params(ch *limit.Charge) (kind any, p1, p2 uint64, p3 any, err error) {
	W := uint64(limit.WindowMillis(ch))
	switch ch.Algorithm {
	case limit.SlidingWindow:
		w, m := limit.Geometry(ch)
		return kindS, uint64(w), uint64(m), ch.At, nil
	case limit.FixedWindow:
		return kindF, W, 0, 0, nil
	case limit.TokenBucket:
		b := ch.Burst
		if b == 0 {
			b = ch.Amount
		}
		return kindT, W, b, 0, nil
	case limit.Concurrency:
		if ch.Cost != 0 && ch.Member == "" {
			return nil, 0, 0, nil, fmt.Errorf("concurrency charge of cost %d has no member", ch.Cost)
		}
		return kindC, W, 0, ch.Member, nil
	case limit.Once:
		return kindO, W, 0, 0, nil
	}
	return nil, 0, 0, nil, fmt.Errorf("unknown algorithm %v", ch.Algorithm)
}

var errReply = errors.New("malformed reply from the apply script")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errReply, fmt.Sprintf(format, args...))
}

// decode reads an apply reply into res.
func (c *call) decode(rep []any, charges []limit.Charge, res []limit.Result) (bool, error) {
	switch c.fn {
	case fnCounts:
		return c.decodeCounts(rep, charges, res)
	case fnPlains:
		if len(rep) == 2 {
			if n, _ := integer(rep[0]); n == -1 {
				return false, fmt.Errorf("run apply script: %v", rep[1])
			}
		}
	}
	if len(rep) < 1 {
		return false, malformed("empty")
	}
	admitted, err := flag(rep[0])
	if err != nil {
		return false, malformed("admitted: %v", err)
	}
	c.admitted = admitted
	want := 1 + repPerCharge*len(charges)
	if admitted && c.mode == "try" {
		want += len(c.keys)
	}
	if len(rep) != want {
		return false, malformed("%d values for %d charges on %d keys", len(rep), len(charges), len(c.keys))
	}
	for i := range charges {
		v := rep[1+repPerCharge*i : 1+repPerCharge*(i+1)]
		fits, err := flag(v[0])
		if err != nil {
			return false, malformed("charges[%d]: fits: %v", i, err)
		}
		retry, err := integer(v[1])
		if err != nil || retry < 0 {
			return false, malformed("charges[%d]: retry after %d: %v", i, retry, err)
		}
		r := &res[i]
		r.Fits, r.RetryAfter = fits, limit.Millis(retry)
		if err := c.report(&charges[i], v[2:], r); err != nil {
			return false, malformed("charges[%d]: %v", i, err)
		}
	}
	return admitted, nil
}

// report fills Remaining and ResetAfter from what the script says of the
// charge's counter after the Apply. A window's usage and reset, and a
// concurrency counter's live leases and reset, are the script's; a token
// bucket's debt goes through limit.Counter's own Report, so its float
// arithmetic lives in one place. Once reports nothing.
func (c *call) report(ch *limit.Charge, v []any, r *limit.Result) error {
	if ch.Algorithm == limit.TokenBucket {
		s, ok := v[0].(string)
		if !ok {
			return fmt.Errorf("debt: got %T, want a number as a string", v[0])
		}
		d, err := strconv.ParseFloat(s, 64)
		if err != nil || !(d >= 0) {
			return fmt.Errorf("debt %q is not a number >= 0", s)
		}
		counter := limit.Counter{At: c.now, Debt: d}
		rem, reset := counter.Report(ch, c.now)
		r.Remaining, r.ResetAfter = rem, limit.Millis(reset)
		return nil
	}
	used, err := integer(v[0])
	if err != nil || used < 0 {
		return fmt.Errorf("usage %d: %v", used, err)
	}
	reset, err := integer(v[1])
	if err != nil || reset < 0 {
		return fmt.Errorf("reset after %d: %v", reset, err)
	}
	r.Remaining = ch.Amount - min(uint64(used), ch.Amount)
	r.ResetAfter = limit.Millis(reset)
	if ch.Algorithm == limit.Once {
		r.Remaining, r.ResetAfter = 0, 0
	}
	return nil
}

// undoCall builds the call that takes back what an admitted try kept,
// from the value per key that follows the charges in its reply; ok is
// false when it kept nothing.
func (c *call) undoCall(rep []any) (u *call, ok bool, err error) {
	tail := rep[1+repPerCharge*c.charges:]
	if len(tail) != len(c.keys) {
		return nil, false, malformed("%d undo values for %d keys", len(tail), len(c.keys))
	}
	u = &call{mode: "undo", now: c.now, charges: c.charges, keys: c.keys, args: make([]any, len(c.args), len(c.args)+len(tail))}
	copy(u.args, c.args)
	u.args[0] = argUndo
	for i, v := range tail {
		s, isString := v.(string)
		if !isString {
			return nil, false, malformed("undo value %d: got %T, want a string", i, v)
		}
		ok = ok || s != ""
		u.args = append(u.args, s)
	}
	return u, ok, nil
}

// decodeUndo reads an undo reply: the counters after the undo replace
// Remaining and ResetAfter in res; Fits and RetryAfter stay as the try
// found them.
func (c *call) decodeUndo(rep []any, charges []limit.Charge, res []limit.Result) error {
	if len(rep) != 1+repPerCharge*len(charges) {
		return malformed("%d values for %d charges", len(rep), len(charges))
	}
	for i := range charges {
		v := rep[1+repPerCharge*i : 1+repPerCharge*(i+1)]
		if err := c.report(&charges[i], v[2:], &res[i]); err != nil {
			return malformed("charges[%d]: %v", i, err)
		}
	}
	return nil
}

func flag(v any) (bool, error) {
	i, err := integer(v)
	if err != nil {
		return false, err
	}
	switch i {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("flag %d is neither 0 nor 1", i)
}

func integer(v any) (int64, error) {
	i, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("got %T, want an integer", v)
	}
	return i, nil
}
