package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// RunCells runs the limit.Cells conformance suite.
func RunCells(t *testing.T, newCells func(testing.TB) limit.Cells) {
	runSuite(t, newCells, 20, []suiteCase[limit.Cells]{
		{name: "Swap", run: testCellsSwap},
		{name: "Expiry", run: testCellsExpiry},
		{name: "KeysIndependent", run: testCellsKeys},
		{name: "Bad", run: testCellsBad},
		{name: "OneWinner", run: testCellsOneWinner},
		{name: "CounterByCAS", run: testCellsCounter},
	})
}

type cells struct {
	sharedEnv
	c limit.Cells
}

func (x cells) load(ms int64, key string) ([]byte, uint64) {
	x.tb.Helper()
	v, n, err := x.c.Load(context.Background(), x.at(ms), x.scope(key))
	if err != nil {
		x.tb.Fatalf("Load(%d, %q): %v", ms, key, err)
	}
	return v, n
}

func (x cells) swap(ms int64, key string, version uint64, value string, ttl time.Duration) (bool, uint64) {
	x.tb.Helper()
	ok, n, err := x.c.Swap(context.Background(), x.at(ms), x.scope(key), version, []byte(value), ttl)
	if err != nil {
		x.tb.Fatalf("Swap(%d, %q, %d, %q, %v): %v", ms, key, version, value, ttl, err)
	}
	return ok, n
}

// cellStep is a Load (op "load": want value and version) or a Swap (op
// "swap": want ok and version).
type cellStep struct {
	name    string
	at      int64
	op      string
	key     string
	version uint64
	value   string
	ttl     time.Duration
	wantOK  bool
	wantVal []byte
	wantVer uint64
}

func (x cells) run(t *testing.T, steps []cellStep) {
	t.Helper()
	for _, s := range steps {
		switch s.op {
		case "load":
			v, n := x.load(s.at, s.key)
			if string(v) != string(s.wantVal) || (v == nil) != (s.wantVal == nil) || n != s.wantVer {
				t.Fatalf("%s: Load(%d, %q) = %q (nil %v), %d; want %q (nil %v), %d", s.name, s.at, s.key, v, v == nil, n, s.wantVal, s.wantVal == nil, s.wantVer)
			}
		case "swap":
			ok, n := x.swap(s.at, s.key, s.version, s.value, s.ttl)
			if ok != s.wantOK || n != s.wantVer {
				t.Fatalf("%s: Swap(%d, %q, %d, %q) = %v, %d; want %v, %d", s.name, s.at, s.key, s.version, s.value, ok, n, s.wantOK, s.wantVer)
			}
		default:
			t.Fatalf("%s: unknown op %q", s.name, s.op)
		}
	}
}

func testCellsSwap(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	const ttl = time.Minute
	x.run(t, []cellStep{
		{name: "absent", at: 0, op: "load", key: "k"},
		{name: "absent, not version 0", at: 0, op: "swap", key: "k", version: 1, value: "x", ttl: ttl, wantVer: 0},
		{name: "create", at: 0, op: "swap", key: "k", version: 0, value: "x", ttl: ttl, wantOK: true, wantVer: 1},
		{name: "read", at: 1, op: "load", key: "k", wantVal: []byte("x"), wantVer: 1},
		{name: "create again loses", at: 2, op: "swap", key: "k", version: 0, value: "y", ttl: ttl, wantVer: 1},
		{name: "a future version loses", at: 2, op: "swap", key: "k", version: 2, value: "y", ttl: ttl, wantVer: 1},
		{name: "the current version wins", at: 3, op: "swap", key: "k", version: 1, value: "y", ttl: ttl, wantOK: true, wantVer: 2},
		{name: "the old version loses", at: 4, op: "swap", key: "k", version: 1, value: "z", ttl: ttl, wantVer: 2},
		{name: "the loser changed nothing", at: 5, op: "load", key: "k", wantVal: []byte("y"), wantVer: 2},
		{name: "empty value", at: 6, op: "swap", key: "k", version: 2, value: "", ttl: ttl, wantOK: true, wantVer: 3},
		{name: "empty value reads as empty, not absent", at: 7, op: "load", key: "k", wantVal: []byte{}, wantVer: 3},
		{name: "binary value", at: 8, op: "swap", key: "k", version: 3, value: "\x00\xff\n{}", ttl: ttl, wantOK: true, wantVer: 4},
		{name: "binary read", at: 9, op: "load", key: "k", wantVal: []byte("\x00\xff\n{}"), wantVer: 4},
	})
	// The value Load returns is the caller's to change.
	v, _ := x.load(10, "k")
	v[0] = 'X'
	if v2, _ := x.load(10, "k"); v2[0] != 0 {
		t.Errorf("changing a loaded value changed the cell: %q", v2)
	}
}

// testCellsExpiry: a cell is live until now+ttl; then it reads as absent
// and only version 0 swaps it. The version that swap gives is after the
// expired one, not 1 again: a writer still holding the expired version
// must not find it current by chance. (A store may forget an expired
// cell's version once it drops the cell; nothing here drops it: Redis
// keeps the key ttl plus a margin of real time, memstore until a sweep.)
func testCellsExpiry(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	x.run(t, []cellStep{
		{name: "create", at: 0, op: "swap", key: "k", version: 0, value: "x", ttl: 20 * time.Second, wantOK: true, wantVer: 1},
		{name: "renew", at: 1000, op: "swap", key: "k", version: 1, value: "x", ttl: 20 * time.Second, wantOK: true, wantVer: 2},
		{name: "live", at: 20_999, op: "load", key: "k", wantVal: []byte("x"), wantVer: 2},
		{name: "expired exactly at now+ttl", at: 21_000, op: "load", key: "k"},
		{name: "the expired version loses", at: 21_000, op: "swap", key: "k", version: 2, value: "y", ttl: time.Second, wantVer: 0},
		{name: "a reader behind still sees it", at: 20_000, op: "load", key: "k", wantVal: []byte("x"), wantVer: 2},
		{name: "version 0 wins, numbered after the expired", at: 21_000, op: "swap", key: "k", version: 0, value: "y", ttl: 1500*time.Millisecond + time.Microsecond, wantOK: true, wantVer: 3},
		// ttl rounds up to whole milliseconds: live until 22_501.
		{name: "rounded up", at: 22_500, op: "load", key: "k", wantVal: []byte("y"), wantVer: 3},
		{name: "rounded up, gone", at: 22_501, op: "load", key: "k"},
	})
}

func testCellsKeys(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	keys := []string{"k", "k:x", "{k}", "k}", "shed/gpt-4o"}
	for i, k := range keys {
		for v := range uint64(i + 1) {
			if ok, _ := x.swap(0, k, v, k, time.Minute); !ok {
				t.Fatalf("Swap(%q, %d) lost", k, v)
			}
		}
	}
	for i, k := range keys {
		if v, n := x.load(1, k); string(v) != k || n != uint64(i+1) {
			t.Errorf("Load(%q) = %q, %d; want %q, %d", k, v, n, k, i+1)
		}
	}
}

func testCellsBad(t *testing.T, c limit.Cells, e sharedEnv) {
	ctx := context.Background()
	now := e.at(0)
	good := e.scope("g")
	tests := []struct {
		name  string
		key   string
		value []byte
		ttl   time.Duration
	}{
		{name: "EmptyKey", key: "", value: []byte("x"), ttl: time.Second},
		{name: "LongKey", key: strings.Repeat("k", limit.MaxScopeBytes+1), value: []byte("x"), ttl: time.Second},
		{name: "LongValue", key: good, value: make([]byte, limit.MaxCellBytes+1), ttl: time.Second},
		{name: "ZeroTTL", key: good, value: []byte("x"), ttl: 0},
		{name: "SubMillisecondTTL", key: good, value: []byte("x"), ttl: time.Microsecond},
	}
	for _, tt := range tests {
		if _, _, err := c.Swap(ctx, now, tt.key, 0, tt.value, tt.ttl); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Swap %s: error = %v, want limit.ErrInvalid", tt.name, err)
		}
	}
	for _, key := range []string{"", strings.Repeat("k", limit.MaxScopeBytes+1)} {
		if _, _, err := c.Load(ctx, now, key); !errors.Is(err, limit.ErrInvalid) {
			t.Errorf("Load(%.20q): error = %v, want limit.ErrInvalid", key, err)
		}
	}
	x := cells{e, c}
	x.run(t, []cellStep{{name: "rejected swaps changed nothing", at: 0, op: "load", key: "g"}})
	big := strings.Repeat("v", limit.MaxCellBytes)
	x.run(t, []cellStep{
		{name: "the cap is allowed", at: 0, op: "swap", key: "g", value: big, ttl: time.Second, wantOK: true, wantVer: 1},
		{name: "read at the cap", at: 0, op: "load", key: "g", wantVal: []byte(big), wantVer: 1},
	})
}

// testCellsOneWinner: of N writers swapping the same version at once,
// exactly one wins, and every loser is told the winner's version.
func testCellsOneWinner(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	const writers = 16
	if ok, _ := x.swap(0, "k", 0, "start", time.Minute); !ok {
		t.Fatal("first Swap lost")
	}
	type result struct {
		ok  bool
		ver uint64
		val string
		err error
	}
	results := make([]result, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			<-start
			val := fmt.Sprint("w", w)
			ok, ver, err := c.Swap(context.Background(), e.at(1), e.scope("k"), 1, []byte(val), time.Minute)
			results[w] = result{ok, ver, val, err}
		})
	}
	close(start)
	wg.Wait()
	var winner string
	for _, r := range results {
		switch {
		case r.err != nil:
			t.Fatal(r.err)
		case r.ver != 2:
			t.Errorf("%s: Swap = %v, %d; want version 2", r.val, r.ok, r.ver)
		case r.ok && winner != "":
			t.Errorf("%s and %s both won", winner, r.val)
		case r.ok:
			winner = r.val
		}
	}
	if winner == "" {
		t.Fatal("no writer won")
	}
	x.run(t, []cellStep{{name: "the winner's value", at: 2, op: "load", key: "k", wantVal: []byte(winner), wantVer: 2}})
}

// testCellsCounter: writers increment a counter by load and swap,
// retrying on a lost swap; no increment is lost.
func testCellsCounter(t *testing.T, c limit.Cells, e sharedEnv) {
	x := cells{e, c}
	const writers, incs = 8, 15
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			ctx, key, now := context.Background(), e.scope("n"), e.at(0)
			for range incs {
				// Bounded: each lost swap means another writer won.
				for try := 0; ; try++ {
					if try == writers*incs {
						errs <- errors.New("an increment lost every swap")
						return
					}
					v, ver, err := c.Load(ctx, now, key)
					if err != nil {
						errs <- err
						return
					}
					var n int
					if v != nil {
						if _, err := fmt.Sscan(string(v), &n); err != nil {
							errs <- err
							return
						}
					}
					ok, _, err := c.Swap(ctx, now, key, ver, []byte(fmt.Sprint(n+1)), time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	x.run(t, []cellStep{{name: "every increment", at: 0, op: "load", key: "n", wantVal: []byte(fmt.Sprint(writers * incs)), wantVer: writers * incs}})
}
