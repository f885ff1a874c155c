package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// group is the charges of one slot, by index into the decision.
type group struct {
	idx []int
	// Filled by trySlots.
	charges []limit.Charge
	call    *call
	rep     []any
	err     error
}

// bySlot groups charge indexes by the slot of their key, in order of first
// appearance; nil when there is one slot. Most decisions have one slot;
// that case allocates nothing.
func bySlot(charges []limit.Charge) []group {
	first := slot(charges[0].Key)
	i := 1
	for i < len(charges) && slot(charges[i].Key) == first {
		i++
	}
	if i == len(charges) {
		return nil
	}
	return slotGroups(charges)
}

// slotGroups groups charge indexes by the slot of their key, in order of
// first appearance.
func slotGroups(charges []limit.Charge) []group {
	var groups []group
	slots := map[int]int{}
	for j := range charges {
		sl := slot(charges[j].Key)
		g, ok := slots[sl]
		if !ok {
			g = len(groups)
			slots[sl] = g
			groups = append(groups, group{})
		}
		groups[g].idx = append(groups[g].idx, j)
	}
	return groups
}

// fairSlots checks that every fair charge's state is on its counter's
// slot. bySlot groups charges by their counter key, and newCall puts a
// fair charge's state key (limit.FairStateKey: the counter key plus a
// suffix) in the same call, so the two must share a slot: they do
// whenever the counter key has a hash tag, as limit.Key's always have.
func fairSlots(charges []limit.Charge) error {
	for i := range charges {
		ch := &charges[i]
		if fairGated(ch) && slot(limit.FairStateKey(ch.Key)) != slot(ch.Key) {
			return fmt.Errorf("charges[%d]: fair-shared counter %q has no hash tag to keep its state on its slot", i, ch.Key)
		}
	}
	return nil
}

// attempt is a decision's charges run slot by slot: what each slot said,
// and what a take-back needs.
type attempt struct {
	charges []limit.Charge
	groups  []group
	sub     [][]limit.Result // per group, in the order of its idx
}

// fill copies the results into res, the decision's, through at: the
// index in the decision of each of the attempt's charges (nil: the same).
func (a *attempt) fill(res []limit.Result, at []int) {
	for i := range a.groups {
		for j, ci := range a.groups[i].idx {
			if at != nil {
				ci = at[ci]
			}
			res[ci] = a.sub[i][j]
		}
	}
}

// applySlots applies a decision whose keys span several cluster slots.
//
// Without Once charges: one "try" call per slot, run concurrently, then an
// "undo" call for every slot that kept a positive charge when another
// slot denied or failed.
//
// With Once charges, the marks go first, so that a mark that does not fit
// voids the decision before anything else is written: the Once charges
// alone are tried on their slots; when one does not fit (or a slot
// fails), the marks the other slots set are taken back, and the other
// charges are only evaluated ("void" calls, which write nothing) for their
// Results. When every mark fits, the other charges run as any decision
// does, and the marks stay whether those admit or deny (a denial keeps
// the refunds and Force charges the marks guard); only a failure takes
// them back. Between the two phases, another decision can see marks that
// a void or failure takes back.
func (s *Store) applySlots(ctx context.Context, now int64, charges []limit.Charge, groups []group, res []limit.Result) (bool, error) {
	var marks, rest []int
	for i := range charges {
		if charges[i].Algorithm == limit.Once {
			marks = append(marks, i)
		} else {
			rest = append(rest, i)
		}
	}
	if len(marks) == 0 {
		a, admitted, err := s.tryAll(ctx, now, charges, groups)
		if err != nil {
			return false, err
		}
		a.fill(res, nil)
		return admitted, nil
	}

	markCharges := pick(charges, marks)
	m, marked, err := s.tryAll(ctx, now, markCharges, slotGroups(markCharges))
	if err != nil {
		return false, err
	}
	m.fill(res, marks)
	if len(rest) == 0 {
		return marked, nil
	}
	restCharges := pick(charges, rest)
	restRes := make([]limit.Result, len(rest))
	if !marked {
		v, err := s.trySlots(ctx, "void", now, restCharges, slotGroups(restCharges))
		if err != nil {
			return false, err
		}
		v.fill(res, rest)
		return false, nil
	}
	admitted, err := s.applyRest(ctx, now, restCharges, restRes)
	if err != nil {
		// The decision failed: its marks must not make a retry void.
		if errs := s.takeBack(ctx, m); len(errs) > 0 {
			err = errors.Join(append([]error{err}, errs...)...)
		}
		return false, err
	}
	for i, ci := range rest {
		res[ci] = restRes[i]
	}
	return admitted, nil
}

// applyRest applies the charges of a decision that are not Once charges,
// after its marks were set: in one call when they share a slot.
func (s *Store) applyRest(ctx context.Context, now int64, charges []limit.Charge, res []limit.Result) (bool, error) {
	if groups := bySlot(charges); groups != nil {
		a, admitted, err := s.tryAll(ctx, now, charges, groups)
		if err != nil {
			return false, err
		}
		a.fill(res, nil)
		return admitted, nil
	}
	call, err := newCall("apply", now, charges)
	if err != nil {
		return false, err
	}
	rep, err := s.run(ctx, call)
	if err != nil {
		return false, err
	}
	return call.decode(rep, charges, res)
}

func pick(charges []limit.Charge, idx []int) []limit.Charge {
	out := make([]limit.Charge, len(idx))
	for i, ci := range idx {
		out[i] = charges[ci]
	}
	return out
}

// tryAll runs a "try" call per group and, when a slot denies or fails,
// takes back what the slots that admitted kept: all or nothing across
// slots, by compensation.
func (s *Store) tryAll(ctx context.Context, now int64, charges []limit.Charge, groups []group) (*attempt, bool, error) {
	a, err := s.trySlots(ctx, "try", now, charges, groups)
	if a == nil {
		return nil, false, err
	}
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	admitted := err == nil
	for i := range a.groups {
		admitted = admitted && a.groups[i].err == nil && a.groups[i].call.admitted
	}
	if !admitted {
		errs = append(errs, s.takeBack(ctx, a)...)
	}
	if len(errs) > 0 {
		return nil, false, errors.Join(errs...)
	}
	return a, admitted, nil
}

// trySlots runs one call per group, concurrently, and decodes the replies;
// the error joins the groups' errors. The attempt is nil when no call ran.
func (s *Store) trySlots(ctx context.Context, mode string, now int64, charges []limit.Charge, groups []group) (*attempt, error) {
	a := &attempt{charges: charges, groups: groups, sub: make([][]limit.Result, len(groups))}
	for i := range groups {
		g := &groups[i]
		g.charges = pick(charges, g.idx)
		var err error
		if g.call, err = newCall(mode, now, g.charges); err != nil {
			return nil, err
		}
	}
	s.runGroups(ctx, groups)
	var errs []error
	for i := range groups {
		g := &groups[i]
		a.sub[i] = make([]limit.Result, len(g.idx))
		if g.err == nil {
			_, g.err = g.call.decode(g.rep, g.charges, a.sub[i])
		}
		if g.err != nil {
			errs = append(errs, g.err)
		}
	}
	return a, errors.Join(errs...)
}

// takeBack runs an "undo" call for every slot of a that admitted and kept
// something, and puts the counters after it in a's results.
func (s *Store) takeBack(ctx context.Context, a *attempt) []error {
	var errs []error
	var undo []group
	var from []int
	for i := range a.groups {
		g := &a.groups[i]
		if g.err != nil || !g.call.admitted {
			continue
		}
		u, ok, err := g.call.undoCall(g.rep)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		undo = append(undo, group{idx: g.idx, charges: g.charges, call: u})
		from = append(from, i)
	}
	// A caller that gave up must not leave the charges behind: the undo
	// runs to the client's own timeouts.
	s.runGroups(context.WithoutCancel(ctx), undo)
	for k := range undo {
		u := &undo[k]
		if u.err == nil {
			u.err = u.call.decodeUndo(u.rep, u.charges, a.sub[from[k]])
		}
		if u.err != nil {
			// The charges stay kept: their keys under-admit until the
			// charges leave the count.
			errs = append(errs, fmt.Errorf("take back charges on the slot of %q: %w", u.charges[0].Key, u.err))
		}
	}
	return errs
}

// runGroups runs one script call per group in one pipeline; the cluster
// client sends each to its slot's master, the masters in parallel. A
// group the pipeline could not run for want of the code (see applier)
// runs again on its own, which loads it.
func (s *Store) runGroups(ctx context.Context, groups []group) {
	if len(groups) == 0 {
		return
	}
	cmds := make([]*redis.Cmd, len(groups))
	pipe := s.cluster.Pipeline()
	for i := range groups {
		cmds[i] = s.apply.cmd(ctx, pipe, groups[i].call)
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		g := &groups[i]
		var err error
		if retryable(cmd.Err()) {
			g.rep, err = s.apply.run(ctx, s.cluster, g.call)
		} else {
			g.rep, err = cmd.Slice()
		}
		if err != nil {
			g.err = fmt.Errorf("run apply script: %w", err)
		}
	}
}

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// slot is the Redis Cluster hash slot of key: CRC16/XMODEM of its hash
// tag, as the cluster and go-redis compute it (go-redis keeps its copy
// internal).
func slot(key string) int {
	return int(crc16(limit.HashTag(key)) % slotCount)
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
