package outcome

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

var t0 = time.UnixMilli(1_800_000_000_000)

type call struct {
	Settle           bool
	ID               string
	Reserved, Actual uint64
}

type fakeLimiter struct {
	mu    sync.Mutex
	calls []call
	done  bool
	err   error
	rules *limit.RuleSet
}

func (f *fakeLimiter) Settle(_ context.Context, req *limit.Request, _ time.Time, reserved, actual uint64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{true, req.ID, reserved, actual})
	return f.done, f.err
}

func (f *fakeLimiter) Release(_ context.Context, req *limit.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{ID: req.ID})
	return f.err
}

func (f *fakeLimiter) Rules() *limit.RuleSet { return f.rules }

func rules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "ai",
		Descriptors: []*limit.Rule{{Key: "tenant", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 10, Unit: limit.Hour}}},
		Breakers: []limit.BreakerConfig{
			{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute},
			{Key: "region", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func newTestLoop(t testing.TB, lim Limiter, log *zap.Logger) (*Loop, *prometheus.Registry, *storetest.FakeClock) {
	t.Helper()
	reg := prometheus.NewRegistry()
	clock := storetest.NewFakeClock(t0)
	l, err := New(ticket.RandomKeys(), lim, log, reg, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return l, reg, clock
}

func reservedTicket() *ticket.Ticket {
	return &ticket.Ticket{ID: "r.1", Domain: "ai", Model: "gpt-4o", Reserved: true, Tokens: 1000, Prompt: 200, At: t0,
		Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}}}}}
}

// TestReport: usage settles; no usage releases and leaves the tokens to a
// report with usage; a stream without usage is charged what it visibly
// used when that is more than the reservation, and never refunded.
func TestReport(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      Usage
		done      bool
		err       error
		ticket    func(*ticket.Ticket)
		cpt       float64 // characters per token; default 4
		want      Result
		wantCalls []call
	}{
		{name: "usage settles", give: Usage{Total: 300, Reported: true}, done: true, want: Settled,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000, Actual: 300}}},
		{name: "a usage of zero settles at zero", give: Usage{Reported: true}, done: true, want: Settled,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000}}},
		{name: "settled before", give: Usage{Total: 300, Reported: true}, want: Duplicate,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000, Actual: 300}}},
		{name: "no usage releases only", give: Usage{}, done: true, want: Released,
			wantCalls: []call{{ID: "r.1"}}},
		// 3,000 characters at 4 a token: 750, plus the prompt's 200, is
		// under the 1,000 reserved: the reservation stands.
		{name: "a short stream without usage keeps the reservation", give: Usage{StreamedChars: 3000}, done: true, want: Released,
			wantCalls: []call{{ID: "r.1"}}},
		// 4,001 characters: 1,001 tokens (rounded up), plus 200.
		{name: "a long stream without usage is charged what it streamed", give: Usage{StreamedChars: 4001}, done: true, want: Settled,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000, Actual: 1201}}},
		{name: "streamed characters cannot overflow", give: Usage{StreamedChars: math.MaxUint64}, cpt: 0.5, done: true, want: Settled,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000, Actual: math.MaxUint64}}},
		{name: "a store failure", give: Usage{Total: 3, Reported: true}, err: errors.New("down"), want: Failed,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000, Actual: 3}}},
		{name: "a request the rules now refuse", give: Usage{Total: 3, Reported: true}, err: limit.ErrInvalid, want: Nothing,
			wantCalls: []call{{Settle: true, ID: "r.1", Reserved: 1000, Actual: 3}}},
		{name: "nothing reserved", give: Usage{Total: 3, Reported: true}, ticket: func(t *ticket.Ticket) { t.Reserved = false }, want: Nothing},
		{name: "a domain the rules dropped", give: Usage{Total: 3, Reported: true}, ticket: func(t *ticket.Ticket) { t.Domain = "gone" }, want: Nothing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lim := &fakeLimiter{done: tt.done, err: tt.err, rules: rules(t)}
			l, reg, _ := newTestLoop(t, lim, nil)
			if tt.cpt != 0 {
				l.SetCharsPerToken(tt.cpt)
			}
			tk := reservedTicket()
			if tt.ticket != nil {
				tt.ticket(tk)
			}
			if got := l.Report(context.Background(), ChannelExtProc, tk, tt.give); got != tt.want {
				t.Errorf("Report = %v, want %v", got, tt.want)
			}
			if diff := cmp.Diff(tt.wantCalls, lim.calls); diff != "" {
				t.Errorf("limiter calls (-want +got):\n%s", diff)
			}
			if tt.want != Nothing || tt.err != nil {
				key := `tollgate_outcome_reports_total{channel="extproc",result="` + tt.want.String() + `"}`
				if got := testutil.Gather(t, reg)[key]; got != 1 {
					t.Errorf("%s = %v, want 1", key, got)
				}
			}
		})
	}
}

// TestOpen: a genuine ticket opens; anything else is counted by reason
// and logged at most once per interval, never quoting the ticket.
func TestOpen(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.WarnLevel)
	l, reg, clock := newTestLoop(t, &fakeLimiter{rules: rules(t)}, zap.New(core))
	genuine := l.Sealer().Seal(reservedTicket())
	if tk := l.Open(ChannelAccessLog, genuine); tk == nil || tk.ID != "r.1" {
		t.Fatalf("Open(genuine) = %+v", tk)
	}
	other, err := ticket.NewSealer(ticket.RandomKeys(), 0)
	if err != nil {
		t.Fatal(err)
	}
	forged := other.Seal(reservedTicket())
	for range 5 {
		if tk := l.Open(ChannelAccessLog, forged); tk != nil {
			t.Fatalf("Open(forged) = %+v, want nil", tk)
		}
	}
	if tk := l.Open(ChannelExtProc, "garbage"); tk != nil {
		t.Fatalf("Open(garbage) = %+v", tk)
	}
	clock.Advance(11 * time.Second)
	if tk := l.Open(ChannelExtProc, genuine[:len(genuine)-2]); tk != nil {
		t.Fatalf("Open(cut) = %+v", tk)
	}
	m := testutil.Gather(t, reg)
	for key, want := range map[string]float64{
		`tollgate_outcome_tickets_total{channel="accesslog",result="verified"}`: 1,
		`tollgate_outcome_tickets_total{channel="accesslog",result="forged"}`:   5,
		`tollgate_outcome_tickets_total{channel="extproc",result="malformed"}`:  2,
	} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v", key, m[key], want)
		}
	}
	// One line for the first refusal; the next five within 10 s are
	// held back and counted on the line after them, with its own.
	entries := logs.All()
	if len(entries) != 2 {
		t.Fatalf("%d warnings, want 2: %v", len(entries), entries)
	}
	if n := entries[0].ContextMap()["refused"]; n != uint64(1) {
		t.Errorf("first line counts %v refusals, want 1", n)
	}
	if n := entries[1].ContextMap()["refused"]; n != uint64(6) {
		t.Errorf("second line counts %v refusals, want 6", n)
	}
	for _, e := range entries {
		for _, v := range e.ContextMap() {
			if s, ok := v.(string); ok && len(s) > 20 && (strings.Contains(genuine, s) || strings.Contains(forged, s)) {
				t.Errorf("a log line quotes a ticket: %v", e.ContextMap())
			}
		}
	}
}

func TestBreakers(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLoop(t, &fakeLimiter{rules: rules(t)}, nil)
	tk := reservedTicket()
	tk.Probes = []limit.Probe{{Key: "model", Name: "gpt-4o", ID: "p1"}, {Key: "model", Name: "other", ID: "p2"}}
	// model comes from the ticket's Model; region is carried by no
	// descriptor, so it is left out.
	want := []Breaker{{Key: "model", Name: "gpt-4o", ProbeID: "p1"}}
	if diff := cmp.Diff(want, l.Breakers(tk)); diff != "" {
		t.Errorf("Breakers (-want +got):\n%s", diff)
	}
	tk.Domain = "gone"
	if got := l.Breakers(tk); got != nil {
		t.Errorf("Breakers of a dropped domain = %v", got)
	}
}

// TestReportLogsSettlement: each report is one debug line with the
// ticket's ID (its only field that names the request), the reserved and
// actual tokens and the result; at info level nothing is written.
func TestReportLogsSettlement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		level zapcore.Level
		give  Usage
		done  bool
		want  []map[string]any // each line's context
	}{
		{name: "settled", level: zap.DebugLevel, give: Usage{Total: 300, Reported: true}, done: true,
			want: []map[string]any{{"channel": ChannelAccessLog, "ticket_id": "r.1", "domain": "ai", "reserved": uint64(1000),
				"actual": uint64(300), "usage_reported": true, "result": "settled"}}},
		{name: "duplicate", level: zap.DebugLevel, give: Usage{Total: 300, Reported: true},
			want: []map[string]any{{"channel": ChannelAccessLog, "ticket_id": "r.1", "domain": "ai", "reserved": uint64(1000),
				"actual": uint64(300), "usage_reported": true, "result": "duplicate"}}},
		{name: "released", level: zap.DebugLevel, give: Usage{}, done: true,
			want: []map[string]any{{"channel": ChannelAccessLog, "ticket_id": "r.1", "domain": "ai", "reserved": uint64(1000),
				"actual": uint64(0), "usage_reported": false, "result": "released"}}},
		{name: "info level writes nothing", level: zap.InfoLevel, give: Usage{Total: 300, Reported: true}, done: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			core, logs := observer.New(tt.level)
			l, _, _ := newTestLoop(t, &fakeLimiter{done: tt.done, rules: rules(t)}, zap.New(core))
			tk := reservedTicket()
			l.Report(context.Background(), ChannelAccessLog, tk, tt.give)
			var got []map[string]any
			for _, e := range logs.All() {
				if e.Message != "settlement" || e.Level != zap.DebugLevel {
					t.Errorf("log %q at %v, want settlement at debug", e.Message, e.Level)
				}
				got = append(got, e.ContextMap())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("log lines (-want +got):\n%s", diff)
			}
		})
	}
}
