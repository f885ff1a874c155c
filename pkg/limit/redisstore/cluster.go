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
	// Filled by applySlots.
	charges []limit.Charge
	call    *call
	rep     []any
	err     error
}

// bySlot groups charge indexes by the slot of their key, in order of first
// appearance. Most decisions have one slot; that case allocates nothing.
func bySlot(charges []limit.Charge) []group {
	first := slot(charges[0].Key)
	i := 1
	for i < len(charges) && slot(charges[i].Key) == first {
		i++
	}
	if i == len(charges) {
		return nil
	}
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

// applySlots applies a decision whose keys span several cluster slots:
// one script call per slot, run concurrently, then an undo call for every
// slot that kept a positive charge when another slot denied or failed.
func (s *Store) applySlots(ctx context.Context, now int64, charges []limit.Charge, groups []group, res []limit.Result) (bool, error) {
	for i := range groups {
		g := &groups[i]
		g.charges = make([]limit.Charge, len(g.idx))
		for j, ci := range g.idx {
			g.charges[j] = charges[ci]
		}
		var err error
		if g.call, err = newCall("try", now, g.charges); err != nil {
			return false, err
		}
	}
	s.runGroups(ctx, groups)

	admitted := true
	var errs []error
	sub := make([][]limit.Result, len(groups))
	for i := range groups {
		g := &groups[i]
		sub[i] = make([]limit.Result, len(g.idx))
		if g.err == nil {
			var ok bool
			ok, g.err = g.call.decode(g.rep, g.charges, sub[i])
			admitted = admitted && ok
		}
		if g.err != nil {
			errs = append(errs, g.err)
		}
	}

	if !admitted || len(errs) > 0 {
		// Take back what the slots that admitted kept.
		var undo []group
		var from []int
		for i := range groups {
			g := &groups[i]
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
		// A caller that gave up must not leave the charges behind: the
		// undo runs to the client's own timeouts.
		s.runGroups(context.WithoutCancel(ctx), undo)
		for k := range undo {
			u := &undo[k]
			if u.err == nil {
				u.err = u.call.decodeUndo(u.rep, u.charges, sub[from[k]])
			}
			if u.err != nil {
				// The charges stay kept: their keys under-admit until the
				// charges leave the count.
				errs = append(errs, fmt.Errorf("take back charges on the slot of %q: %w", u.charges[0].Key, u.err))
			}
		}
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	for i := range groups {
		for j, ci := range groups[i].idx {
			res[ci] = sub[i][j]
		}
	}
	return admitted, nil
}

// runGroups runs one script call per group in one pipeline; the cluster
// client sends each to its slot's master, the masters in parallel. The
// pipeline cannot fall back from EVALSHA to EVAL, so a group that gets
// NOSCRIPT runs again with EVAL, which loads the script on its master.
func (s *Store) runGroups(ctx context.Context, groups []group) {
	if len(groups) == 0 {
		return
	}
	cmds := make([]*redis.Cmd, len(groups))
	pipe := s.cluster.Pipeline()
	for i := range groups {
		cmds[i] = s.script.EvalSha(ctx, pipe, groups[i].call.keys, groups[i].call.args...)
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		g := &groups[i]
		err := cmd.Err()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd = s.script.Eval(ctx, s.cluster, g.call.keys, g.call.args...)
			err = cmd.Err()
		}
		if err != nil {
			g.err = fmt.Errorf("run apply script: %w", err)
			continue
		}
		if g.rep, err = cmd.Slice(); err != nil {
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
