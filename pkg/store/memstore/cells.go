package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Cells is the in-process limit.Cells. The zero value is not usable; call
// NewCells.
//
// An expired cell reads as absent (version 0) but is kept until a sweep,
// and a Swap onto it numbers its version after the expired one's: a
// writer still holding a version of the cell's last life cannot swap it
// by chance. Each Swap sweeps sharedSweep other cells and drops those
// expired, so memory follows the live cells; a cell dropped so starts its
// versions at 1 again.
type Cells struct {
	mu    sync.Mutex
	cells map[string]*cell
}

var _ limit.Cells = (*Cells)(nil)

type cell struct {
	value   []byte
	version uint64
	expires int64 // Unix ms
}

// NewCells returns empty Cells.
func NewCells() *Cells { return &Cells{cells: make(map[string]*cell)} }

// Load implements limit.Cells.
func (c *Cells) Load(ctx context.Context, now time.Time, key string) ([]byte, uint64, error) {
	if err := limit.CheckScope("cell key", key); err != nil {
		return nil, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.cells[key]
	if e == nil || e.expires <= now.UnixMilli() {
		return nil, 0, nil
	}
	return append([]byte{}, e.value...), e.version, nil
}

// Swap implements limit.Cells.
func (c *Cells) Swap(ctx context.Context, now time.Time, key string, version uint64, value []byte, ttl time.Duration) (bool, uint64, error) {
	exp, err := limit.CheckCellSwap(now, key, value, ttl)
	if err != nil {
		return false, 0, err
	}
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	ms := now.UnixMilli()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.cells[key]
	var cur, last uint64
	if e != nil {
		last = e.version
		if e.expires > ms {
			cur = e.version
		}
	}
	if cur != version {
		return false, cur, nil
	}
	if e == nil {
		e = &cell{}
		c.cells[key] = e
	}
	e.value = append(e.value[:0:0], value...)
	e.version = last + 1
	e.expires = exp
	i := 0
	for k, o := range c.cells {
		if i == sharedSweep {
			break
		}
		i++
		if o.expires <= ms {
			delete(c.cells, k)
		}
	}
	return true, e.version, nil
}

// held reports how many cells c holds, for tests of its memory.
func (c *Cells) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cells)
}
