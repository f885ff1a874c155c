package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

var healthT0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// fakePeers answers Beat with n, or err.
type fakePeers struct {
	n   int
	err error
}

func (p *fakePeers) Beat(context.Context, time.Time, string, time.Duration) (int, error) {
	return p.n, p.err
}

func newTestHealth(t *testing.T, f failureFlags) (*storeHealth, *observer.ObservedLogs, *storetest.FakeClock, *fakePeers) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	peers := &fakePeers{n: 1}
	h := newStoreHealth(zap.New(core), f, peers, "host")
	clk := storetest.NewFakeClock(healthT0)
	h.clock = clk
	h.since = healthT0
	return h, logs, clk, peers
}

// TestStoreHealthLogsAreRateLimited: the first event of each kind is
// logged at once; the rest are counted into one line per logEvery, by
// flush, and a quiet kind logs nothing.
func TestStoreHealthLogsAreRateLimited(t *testing.T) {
	t.Parallel()
	h, logs, clk, _ := newTestHealth(t, defaultFailure)
	cause := errors.New("run apply script: i/o timeout")
	for i := range 1000 {
		h.degradedDecision(limit.FailureLocal)
		if i%100 == 0 {
			h.degradedDecision(limit.FailureDeny)
		}
		if i%250 == 0 { // the circuit flaps
			h.circuitChanged(storeguard.Closed, storeguard.Open, cause)
			h.circuitChanged(storeguard.Open, storeguard.HalfOpen, nil)
			h.circuitChanged(storeguard.HalfOpen, storeguard.Closed, nil)
		}
		clk.Advance(time.Millisecond) // a second in all
	}
	h.flush() // under logEvery since the first lines: nothing yet
	type line struct {
		msg    string
		fields map[string]any
	}
	var got []line
	take := func() {
		for _, e := range logs.TakeAll() {
			got = append(got, line{e.Message, e.ContextMap()})
		}
	}
	take()
	clk.Advance(logEvery)
	h.flush()
	h.flush() // nothing new
	take()
	want := []struct {
		msgPrefix string
		field     string
		value     any
	}{
		{"degraded decisions", "decisions", uint64(1)},
		{"store circuit opened:", "times", uint64(1)},
		{"store circuit closed:", "times", uint64(1)},
		{"store circuit opened again", "times", uint64(3)},
		{"store circuit closed again", "times", uint64(3)},
		{"degraded decisions", "decisions", uint64(1000 + 10 - 1)},
	}
	if len(got) != len(want) {
		t.Fatalf("log lines = %+v, want %d", got, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i].msg, w.msgPrefix) || got[i].fields[w.field] != w.value {
			t.Errorf("line %d = %q %v, want %q with %s=%v", i, got[i].msg, got[i].fields, w.msgPrefix, w.field, w.value)
		}
	}
	if got[1].fields["error"] != cause.Error() {
		t.Errorf("the opening's line says %v, want the error that opened it", got[1].fields["error"])
	}
	// The first local decision had a line of its own.
	if got[5].fields["deny"] != uint64(10) || got[5].fields["local"] != uint64(999) {
		t.Errorf("the degraded decisions' line = %v, want 999 local and 10 deny", got[5].fields)
	}
	clk.Advance(logEvery)
	h.flush()
	if n := logs.Len(); n != 0 {
		t.Errorf("a quiet spell logged %d lines", n)
	}
}

// TestStoreHealthDetail: /readyz's lines say the circuit's state and
// since when, the degraded decisions of the last minute, and the share.
func TestStoreHealthDetail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		flags failureFlags
		do    func(t *testing.T, h *storeHealth, clk *storetest.FakeClock, peers *fakePeers)
		want  []string
	}{
		{
			name:  "healthy",
			flags: defaultFailure,
			do:    func(*testing.T, *storeHealth, *storetest.FakeClock, *fakePeers) {},
			want: []string{
				"store circuit: closed",
				"degraded decisions in the last minute: 0 (local 0, deny 0, allow 0)",
				"store_failure default: local; 1 replicas share the store: local rules keep 0.1/1 of each window limit and 1/1 of each concurrency cap on this replica",
			},
		},
		{
			name:  "open, with decisions that age out of the minute",
			flags: defaultFailure,
			do: func(t *testing.T, h *storeHealth, clk *storetest.FakeClock, peers *fakePeers) {
				peers.n = 3
				if err := h.beat(context.Background()); err != nil {
					t.Fatal(err)
				}
				h.degradedDecision(limit.FailureLocal) // ages out
				clk.Advance(30 * time.Second)
				h.circuitChanged(storeguard.Closed, storeguard.Open, errors.New("dial tcp 10.0.0.7:6379: connect: connection refused"))
				for range 5 {
					h.degradedDecision(limit.FailureLocal)
				}
				h.degradedDecision(limit.FailureDeny)
				clk.Advance(2 * time.Second)
				h.circuitChanged(storeguard.Open, storeguard.HalfOpen, nil)
				h.circuitChanged(storeguard.HalfOpen, storeguard.Open, errors.New("dial tcp 10.0.0.7:6379: connect: connection refused"))
				clk.Advance(30 * time.Second)
			},
			want: []string{
				"store circuit: open since 2026-11-22T10:00:30Z (32s), after: dial tcp 10.0.0.7:6379: connect: connection refused",
				"degraded decisions in the last minute: 6 (local 5, deny 1, allow 0)",
				"store_failure default: local; 3 replicas share the store: local rules keep 0.1/3 of each window limit and 1/3 of each concurrency cap on this replica",
			},
		},
		{
			name:  "a fixed fraction",
			flags: failureFlags{policy: "deny", parsed: limit.FailureDeny, fraction: 0.25},
			do: func(_ *testing.T, h *storeHealth, clk *storetest.FakeClock, _ *fakePeers) {
				h.circuitChanged(storeguard.Closed, storeguard.Open, errors.New("x"))
				clk.Advance(time.Second)
				h.circuitChanged(storeguard.Open, storeguard.HalfOpen, nil)
				h.circuitChanged(storeguard.HalfOpen, storeguard.Closed, nil)
			},
			want: []string{
				"store circuit: closed",
				"degraded decisions in the last minute: 0 (local 0, deny 0, allow 0)",
				"store_failure default: deny; local rules keep 0.25 of each limit on this replica; 1 replicas share the store",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, _, clk, peers := newTestHealth(t, tt.flags)
			tt.do(t, h, clk, peers)
			if got, want := h.detail(), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("detail =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestReplicaCount: the count in force is the most read within beatTTL,
// so a beat that raced a new replica's first does not grow the shares;
// a failed beat keeps the count.
func TestReplicaCount(t *testing.T) {
	t.Parallel()
	h, _, clk, peers := newTestHealth(t, defaultFailure)
	ctx := context.Background()
	steps := []struct {
		name  string
		after time.Duration
		give  int
		err   error
		want  int
	}{
		{name: "alone", give: 1, want: 1},
		{name: "two more start", after: beatEvery, give: 3, want: 3},
		{name: "a read that missed one", after: beatEvery, give: 2, want: 3},
		{name: "a failed beat keeps the count", after: beatEvery, err: errors.New("i/o timeout"), want: 3},
		{name: "one left, counted until beatTTL", after: beatTTL - 3*beatEvery, give: 2, want: 3},
		{name: "one left, beatTTL later", after: 3 * beatEvery, give: 2, want: 2},
		{name: "a zero read counts this replica", after: beatTTL, give: 0, want: 1},
	}
	for _, st := range steps {
		clk.Advance(st.after)
		peers.n, peers.err = st.give, st.err
		err := h.beat(ctx)
		if (err != nil) != (st.err != nil) {
			t.Fatalf("%s: beat = %v", st.name, err)
		}
		if got := h.replicas.get(); got != st.want {
			t.Errorf("%s: %d replicas, want %d", st.name, got, st.want)
		}
	}
}
