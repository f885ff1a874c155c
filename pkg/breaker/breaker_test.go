package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

var t0 = time.UnixMilli(1_700_000_000_000)

func cfg() breaker.Config {
	return breaker.Config{Key: "model", FailureThreshold: 2, Window: time.Minute, OpenFor: 30 * time.Second, Timeout: 10 * time.Second}
}

// TestClassify: the rules of Classify in their order; the table of
// Envoy's entries is pkg/accesslog's TestOutcomeClasses.
func TestClassify(t *testing.T) {
	t.Parallel()
	up := func(status uint32) breaker.Facts {
		return breaker.Facts{Status: status, Details: breaker.DetailsViaUpstream, Upstream: "gpu", Received: true, Sent: true, SentAt: time.Millisecond, Answered: true}
	}
	with := func(f breaker.Facts, fl breaker.Flags) breaker.Facts { f.Flags |= fl; return f }
	left := func(d time.Duration) breaker.Facts {
		return breaker.Facts{Details: "downstream_remote_disconnect", Flags: breaker.FlagDownstreamConnectionTermination,
			Duration: d, Upstream: "gpu", Received: true, Sent: true, SentAt: time.Second}
	}
	busy := func(f breaker.Facts) breaker.Facts { f.Upstream = "busy"; return f }
	tests := []struct {
		name string
		give breaker.Facts
		want breaker.Class
	}{
		{name: "200", give: up(200), want: breaker.Success},
		{name: "399", give: up(399), want: breaker.Success},
		{name: "101", give: up(101), want: breaker.Neutral},
		{name: "429 from the upstream", give: up(429), want: breaker.Overload},
		{name: "503 from a busy upstream", give: busy(up(503)), want: breaker.Overload},
		{name: "504 from a busy upstream", give: busy(up(504)), want: breaker.Overload},
		{name: "500 from a busy upstream", give: busy(up(500)), want: breaker.Failure},
		{name: "503", give: up(503), want: breaker.Failure},
		{name: "504", give: up(504), want: breaker.Failure},
		{name: "timeout on a busy upstream", give: busy(with(up(0), breaker.FlagUpstreamRequestTimeout)), want: breaker.Overload},
		{name: "reset on a busy upstream", give: busy(with(up(503), breaker.FlagUpstreamRemoteReset)), want: breaker.Failure},
		{name: "envoy overflow", give: with(breaker.Facts{Status: 503}, breaker.FlagUpstreamOverflow), want: breaker.Overload},
		{name: "404", give: up(404), want: breaker.Neutral},
		{name: "408", give: up(408), want: breaker.Neutral},
		{name: "500", give: up(500), want: breaker.Failure},
		{name: "599", give: up(599), want: breaker.Failure},
		{name: "600", give: up(600), want: breaker.Neutral},
		{name: "200 with another flag", give: with(up(200), breaker.FlagOther), want: breaker.Neutral},
		{name: "503 with another flag", give: with(up(503), breaker.FlagOther), want: breaker.Failure},
		{name: "200 then upstream reset", give: with(up(200), breaker.FlagUpstreamRemoteReset), want: breaker.Failure},
		{name: "200 then client reset", give: with(up(200), breaker.FlagDownstreamRemoteReset), want: breaker.Neutral},
		{name: "upstream timeout whatever the status", give: with(up(204), breaker.FlagUpstreamRequestTimeout), want: breaker.Failure},
		{name: "client left past the timeout", give: left(12 * time.Second), want: breaker.Failure},
		{name: "client left at the timeout", give: left(11 * time.Second), want: breaker.Failure},
		{name: "client left just before", give: left(11*time.Second - time.Millisecond), want: breaker.Neutral},
		{name: "client left after an answer", give: func() breaker.Facts { f := left(time.Hour); f.Answered = true; return f }(), want: breaker.Neutral},
		{name: "client left before the request went upstream", give: func() breaker.Facts { f := left(time.Hour); f.Sent = false; return f }(), want: breaker.Neutral},
		{name: "status 0 without flags past the timeout", give: breaker.Facts{Duration: time.Hour, Received: true, Sent: true}, want: breaker.Failure},
		{name: "local reply without details", give: breaker.Facts{Status: 503}, want: breaker.Neutral},
		{name: "local reply with details", give: breaker.Facts{Status: 503, Details: "ext_authz_denied", Upstream: "gpu"}, want: breaker.Neutral},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The upstream named "busy" stands for one at its capacity.
			o := breaker.Outcome{Facts: tt.give, Name: "m", Busy: tt.give.Upstream == "busy"}
			if got := breaker.Classify(cfg(), o); got != tt.want {
				t.Errorf("Classify = %v, want %v", got, tt.want)
			}
		})
	}
	if got := breaker.Classify(cfg(), breaker.Outcome{Facts: up(500)}); got != breaker.Neutral {
		t.Errorf("Classify without a name = %v, want neutral", got)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give func(*breaker.Config)
		want string
	}{
		{name: "no key", give: func(c *breaker.Config) { c.Key = "" }, want: "key is required"},
		{name: "no threshold", give: func(c *breaker.Config) { c.FailureThreshold = 0 }, want: "failure_threshold must be at least 1"},
		{name: "no window", give: func(c *breaker.Config) { c.Window = 0 }, want: "window must be at least 1ms"},
		{name: "no open_for", give: func(c *breaker.Config) { c.OpenFor = time.Microsecond }, want: "open_for must be at least 1ms"},
		{name: "negative timeout", give: func(c *breaker.Config) { c.Timeout = -1 }, want: "timeout must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := cfg()
			tt.give(&c)
			_, err := breaker.New(c, memstore.NewBreakers())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tt.want)
			}
		})
	}
	b, err := breaker.New(cfg(), memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	got := b.Config()
	if got.HalfOpenProbes != 1 || got.CloseAfter != 1 || got.ProbeLease != breaker.DefaultProbeLease {
		t.Errorf("defaults: %+v", got)
	}
}

func TestStoreKeyHashTag(t *testing.T) {
	t.Parallel()
	a := breaker.StoreKey("model", "a}b{")
	if tag := limit.HashTag(a); len(tag) != 16 {
		t.Errorf("hash tag of %q is %q", a, tag)
	}
	if breaker.StoreKey("mo", "del") == breaker.StoreKey("mod", "el") {
		t.Error("keys collide")
	}
}

// TestBreakerObserveOpensForAll: failures observed through one replica's
// Breaker deny the next decision on another's, and the transitions and
// snapshots follow.
func TestBreakerObserveOpensForAll(t *testing.T) {
	t.Parallel()
	store := memstore.NewBreakers()
	clock := storetest.NewFakeClock(t0)
	ctx := context.Background()
	a, err := breaker.New(cfg(), store)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := breaker.New(cfg(), store)
	fail := breaker.Outcome{Facts: breaker.Facts{Status: 502, Details: breaker.DetailsViaUpstream}, Name: "gpt-4o"}
	for range 2 {
		if err := a.Observe(ctx, clock.Now(), fail); err != nil {
			t.Fatal(err)
		}
	}
	v, err := b.Allow(ctx, clock.Now(), "gpt-4o")
	if err != nil || v.Allowed || v.State != breaker.Open || v.RetryAfter != 30*time.Second {
		t.Fatalf("Allow on B = %+v, %v; want open for 30s", v, err)
	}
	if v, _ := b.Allow(ctx, clock.Now(), "llama"); !v.Allowed {
		t.Fatalf("another model is denied: %+v", v)
	}
	if v, _ := b.Allow(ctx, clock.Now(), ""); !v.Allowed {
		t.Fatalf("no name is denied: %+v", v)
	}
	snap := a.Snapshot(clock.Now())
	if len(snap) != 1 || snap[0].State != breaker.Open || !snap[0].OpenUntil.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("A's snapshot = %+v", snap)
	}
	now := clock.Advance(30 * time.Second)
	if snap := a.Snapshot(now); snap[0].State != breaker.HalfOpen {
		t.Fatalf("A's snapshot after the open period = %+v", snap)
	}
	p, _ := b.Allow(ctx, now, "gpt-4o")
	if !p.Probe {
		t.Fatalf("no probe: %+v", p)
	}
	if err := a.Observe(ctx, now, breaker.Outcome{Facts: breaker.Facts{Status: 200, Details: breaker.DetailsViaUpstream}, Name: "gpt-4o", ProbeID: p.ProbeID}); err != nil {
		t.Fatal(err)
	}
	st, err := b.State(ctx, now, "gpt-4o")
	if err != nil || st.State != breaker.Closed {
		t.Fatalf("State = %+v, %v; want closed", st, err)
	}
	count := func(br *breaker.Breaker) string {
		var s []string
		for _, c := range br.Transitions() {
			s = append(s, fmt.Sprintf("%v>%v=%d", c.From, c.To, c.N))
		}
		return strings.Join(s, " ")
	}
	if got, want := count(a), "closed>open=1 open>half_open=0 half_open>open=0 half_open>closed=1"; got != want {
		t.Errorf("A's transitions: %s, want %s", got, want)
	}
	if got, want := count(b), "closed>open=0 open>half_open=1 half_open>open=0 half_open>closed=0"; got != want {
		t.Errorf("B's transitions: %s, want %s", got, want)
	}
}

func TestBreakerTracksBoundedNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := cfg()
	c.FailureThreshold = 1
	b, err := breaker.New(c, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	for i := range breaker.MaxTracked + 10 {
		if _, err := b.Allow(ctx, t0, fmt.Sprint("m", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.Snapshot(t0)); n != breaker.MaxTracked {
		t.Fatalf("%d tracked, want %d", n, breaker.MaxTracked)
	}
	if b.Untracked() != 10 {
		t.Fatalf("Untracked = %d, want 10", b.Untracked())
	}
	// An opening breaker makes room by dropping a closed one.
	fail := breaker.Outcome{Facts: breaker.Facts{Status: 500, Details: breaker.DetailsViaUpstream}, Name: "new"}
	if err := b.Observe(ctx, t0, fail); err != nil {
		t.Fatal(err)
	}
	snap := b.Snapshot(t0)
	open := 0
	for _, n := range snap {
		if n.State == breaker.Open {
			open++
			if n.Name != "new" {
				t.Errorf("open breaker %q", n.Name)
			}
		}
	}
	if len(snap) != breaker.MaxTracked || open != 1 {
		t.Fatalf("%d tracked, %d open; want %d, 1", len(snap), open, breaker.MaxTracked)
	}
}

func TestBreakerRejectsLongNames(t *testing.T) {
	t.Parallel()
	b, _ := breaker.New(cfg(), memstore.NewBreakers())
	_, err := b.Allow(context.Background(), t0, strings.Repeat("x", limit.MaxValueBytes+1))
	if !errors.Is(err, limit.ErrInvalid) {
		t.Fatalf("Allow: %v, want ErrInvalid", err)
	}
}

// countingBreakers counts the Allow calls that reach the store.
type countingBreakers struct {
	breaker.Store
	allows int
}

func (c *countingBreakers) Allow(ctx context.Context, now time.Time, key string, p breaker.Params, probeID string) (breaker.Verdict, breaker.Transition, error) {
	c.allows++
	return c.Store.Allow(ctx, now, key, p, probeID)
}

// TestBreakerCache: a replica answers a closed breaker from its last read
// for Cache, an open one until its period ends, and a half-open one never;
// a breaker opened on another replica is seen once Cache has passed.
func TestBreakerCache(t *testing.T) {
	t.Parallel()
	shared := memstore.NewBreakers()
	store := &countingBreakers{Store: shared}
	ctx := context.Background()
	c := cfg()
	c.Cache = 250 * time.Millisecond
	b, err := breaker.New(c, store)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := breaker.New(c, shared)
	allow := func(at time.Duration) breaker.Verdict {
		t.Helper()
		v, err := b.Allow(ctx, t0.Add(at), "gpt-4o")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	wantCalls := func(n int) {
		t.Helper()
		if store.allows != n {
			t.Fatalf("%d store reads, want %d", store.allows, n)
		}
	}
	allow(0)
	allow(100 * time.Millisecond)
	allow(249 * time.Millisecond)
	wantCalls(1)
	// Opened elsewhere: still answered closed until the read is Cache old.
	fail := breaker.Outcome{Facts: breaker.Facts{Status: 502, Details: breaker.DetailsViaUpstream}, Name: "gpt-4o"}
	for range 2 {
		if err := other.Observe(ctx, t0.Add(249*time.Millisecond), fail); err != nil {
			t.Fatal(err)
		}
	}
	if v := allow(249 * time.Millisecond); !v.Allowed {
		t.Fatalf("denied from a fresh closed read: %+v", v)
	}
	if v := allow(250 * time.Millisecond); v.Allowed || v.State != breaker.Open {
		t.Fatalf("after Cache the open breaker is not seen: %+v", v)
	}
	wantCalls(2)
	// Open until 249ms+30s: answered locally, with the time left.
	if v := allow(10 * time.Second); v.Allowed || v.RetryAfter != 20249*time.Millisecond {
		t.Fatalf("open breaker answered %+v, want denied for 20.249s", v)
	}
	wantCalls(2)
	// Half-open: the store hands out the probe, and counts every ask.
	half := 30*time.Second + 249*time.Millisecond
	if v := allow(half); !v.Probe {
		t.Fatalf("no probe after the open period: %+v", v)
	}
	if v := allow(half); v.Allowed {
		t.Fatalf("a second probe while the first is out: %+v", v)
	}
	wantCalls(4)
}

func TestNewProbeID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := breaker.NewProbeID()
		if len(id) != 32 || !breaker.ValidProbeID(id) || seen[id] {
			t.Fatalf("probe ID %q: want 32 hex digits, never repeated", id)
		}
		seen[id] = true
	}
}

func TestValidProbeID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want bool
	}{
		{name: "hex", give: "0123456789abcdefABCDEF", want: true},
		{name: "empty", give: ""},
		{name: "old form", give: "1700000000000.1"},
		{name: "separator", give: "ab=12"},
		{name: "longest", give: strings.Repeat("f", breaker.MaxProbeIDBytes), want: true},
		{name: "too long", give: strings.Repeat("f", breaker.MaxProbeIDBytes+1)},
		{name: "not ascii", give: "ab\xffcd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := breaker.ValidProbeID(tt.give); got != tt.want {
				t.Errorf("ValidProbeID(%q) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
}

// BenchmarkBreakerAllowStore is a decision that reaches the store (a
// half-open breaker, or a closed one once per Cache): a new probe ID and
// the memstore call.
func BenchmarkBreakerAllowStore(b *testing.B) {
	c := cfg()
	c.Cache = time.Millisecond
	br, err := breaker.New(c, memstore.NewBreakers())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond) // past Cache: every call reads the store
		if _, err := br.Allow(ctx, now, "gpt-4o"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewProbeID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = breaker.NewProbeID()
	}
}

// TestSettlingIgnoresBreakers: with the real Set and stores, a cost report
// and a refund (Envoy's apply_on_stream_done call) arriving while the
// model's breaker is open or half-open are charged and refunded, and the
// half-open one's probe slot stays free for a real request.
func TestSettlingIgnoresBreakers(t *testing.T) {
	t.Parallel()
	c := breaker.Config{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: 30 * time.Second}
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:     "d",
		Breakers: []limit.BreakerConfig{c},
		Descriptors: []*limit.Rule{
			{Key: "model", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	br, err := breaker.New(c, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	set := breaker.NewSet()
	set.Replace(breaker.SetEntry{Domain: "d", Breaker: br})
	clock := storetest.NewFakeClock(t0)
	lim := admission.NewLimiter(memstore.New(), clock, rs, admission.WithBreakers(set))
	ctx := context.Background()
	decide := func(d limit.Descriptor) *admission.Decision {
		t.Helper()
		d.Entries = []limit.Entry{{Key: "model", Value: "m"}}
		dec, err := lim.Decide(ctx, &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return dec
	}
	// remaining is the budget left, read with a check (hits_addend 0)
	// while the breaker is closed.
	remaining := func() uint64 {
		t.Helper()
		dec := decide(limit.Descriptor{HitsSet: true})
		if dec.Code != limit.CodeOK || dec.Statuses[0].Limit == nil {
			t.Fatalf("check: %+v", dec)
		}
		return dec.Statuses[0].Remaining
	}
	if got := remaining(); got != 1000 {
		t.Fatalf("budget %d, want 1000", got)
	}
	fail := breaker.Outcome{Facts: breaker.Facts{Status: 503, Details: breaker.DetailsViaUpstream}, Name: "m"}
	if err := br.Observe(ctx, clock.Now(), fail); err != nil {
		t.Fatal(err)
	}
	report := limit.Descriptor{Hits: 400, HitsSet: true}
	refund := limit.Descriptor{Hits: 100, HitsSet: true, Negative: true}
	for _, d := range []limit.Descriptor{report, refund} {
		if dec := decide(d); dec.Code != limit.CodeOK || dec.Reason != admission.ReasonNone {
			t.Fatalf("settling while open: %v %v", dec.Code, dec.Reason)
		}
	}
	if dec := decide(limit.Descriptor{}); dec.Reason != admission.ReasonBreaker {
		t.Fatalf("a request while open: %v %v, want refused by the breaker", dec.Code, dec.Reason)
	}

	clock.Advance(30 * time.Second)
	for _, d := range []limit.Descriptor{report, refund} {
		if dec := decide(d); dec.Code != limit.CodeOK || len(dec.Probes) != 0 {
			t.Fatalf("settling while half-open: %v, probes %+v", dec.Code, dec.Probes)
		}
	}
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.HalfOpen || st.Probes != 0 {
		t.Fatalf("after settling while half-open: %+v, want no probe out", st)
	}
	dec := decide(limit.Descriptor{})
	if dec.Code != limit.CodeOK || len(dec.Probes) != 1 {
		t.Fatalf("the first request while half-open: %v, probes %+v; want the probe", dec.Code, dec.Probes)
	}
	ok := breaker.Outcome{Facts: breaker.Facts{Status: 200, Details: breaker.DetailsViaUpstream}, Name: "m", ProbeID: dec.Probes[0].ID}
	if err := br.Observe(ctx, clock.Now(), ok); err != nil {
		t.Fatal(err)
	}
	// 1000 - 400 + 100 twice: both settlements, open and half-open.
	if got := remaining(); got != 400 {
		t.Fatalf("budget %d after two reports of 400 and two refunds of 100, want 400", got)
	}
}

// recordingBreakers keeps the Reports that reach the store.
type recordingBreakers struct {
	breaker.Store
	reports []breaker.Report
}

func (r *recordingBreakers) Record(ctx context.Context, now time.Time, key string, p breaker.Params, rep breaker.Report) (breaker.Transition, error) {
	r.reports = append(r.reports, rep)
	return r.Store.Record(ctx, now, key, p, rep)
}

// TestBreakerRatedBatches: a rated breaker's successes reach the store in
// batches, about one per Cache, not one per request; a failure sends the
// waiting batch first, so the store weighs it against every success; an
// unrated breaker sends each success as before.
func TestBreakerRatedBatches(t *testing.T) {
	t.Parallel()
	ok := breaker.Outcome{Facts: breaker.Facts{Status: 200, Details: breaker.DetailsViaUpstream}, Name: "m"}
	fail := breaker.Outcome{Facts: breaker.Facts{Status: 500, Details: breaker.DetailsViaUpstream}, Name: "m"}
	tests := []struct {
		name        string
		rate        float64
		min         uint64
		wantRecords int // for 1000 successes over 1s
		wantState   breaker.State
	}{
		{name: "rated", rate: 0.5, min: 10, wantRecords: 9, wantState: breaker.Closed},
		// 1 failure >= failure_threshold 1, in 1001 >= min_requests 10.
		{name: "min requests alone", min: 10, wantRecords: 9, wantState: breaker.Open},
		{name: "unrated", wantRecords: 1000, wantState: breaker.Open},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &recordingBreakers{Store: memstore.NewBreakers()}
			c := breaker.Config{Key: "model", FailureThreshold: 1, FailureRate: tt.rate, MinRequests: tt.min,
				Window: 10 * time.Second, OpenFor: time.Second, Cache: 100 * time.Millisecond}
			b, err := breaker.New(c, store)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i := range 1000 {
				if err := b.Observe(ctx, t0.Add(time.Duration(i)*time.Millisecond), ok); err != nil {
					t.Fatal(err)
				}
			}
			if got := len(store.reports); got != tt.wantRecords {
				t.Errorf("%d store calls for 1000 successes, want %d", got, tt.wantRecords)
			}
			now := t0.Add(time.Second)
			if err := b.Observe(ctx, now, fail); err != nil {
				t.Fatal(err)
			}
			st, err := b.State(ctx, now, "m")
			if err != nil {
				t.Fatal(err)
			}
			if st.State != tt.wantState {
				t.Errorf("after the failure: %v, want %v", st.State, tt.wantState)
			}
			if tt.wantState == breaker.Closed && (st.Volume != 1001 || st.Failures != 1) {
				t.Errorf("status %+v, want 1 failure in 1001: the batch waiting went first", st)
			}
			if c.FailureRate > 0 || c.MinRequests > 0 {
				var sent uint64
				for _, r := range store.reports {
					sent += r.Successes
				}
				if sent != 1000 {
					t.Errorf("%d successes sent, want 1000", sent)
				}
			}
		})
	}
}

// TestBreakerRatedOutage: a vendor outage at low load (10 requests a
// second, all failing) opens a breaker sized as docs/breaker.md says
// (failure_rate 0.5, min_requests 10, window 10s) at the tenth failure,
// about a second in; the same load with one failure in ten never does.
func TestBreakerRatedOutage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		failEvery int
		wantOpen  time.Duration // -1: never
	}{
		{name: "every request fails", failEvery: 1, wantOpen: 900 * time.Millisecond},
		{name: "one in ten fails", failEvery: 10, wantOpen: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := breaker.Config{Key: "model", FailureThreshold: 5, FailureRate: 0.5, MinRequests: 10,
				Window: 10 * time.Second, OpenFor: time.Second}
			b, err := breaker.New(c, memstore.NewBreakers())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			opened := time.Duration(-1)
			for i := range 300 { // 30s
				at := time.Duration(i) * 100 * time.Millisecond
				o := breaker.Outcome{Facts: breaker.Facts{Status: 200, Details: breaker.DetailsViaUpstream}, Name: "m"}
				if i%tt.failEvery == 0 {
					o.Status = 500
				}
				if err := b.Observe(ctx, t0.Add(at), o); err != nil {
					t.Fatal(err)
				}
				if st, _ := b.State(ctx, t0.Add(at), "m"); st.State == breaker.Open {
					opened = at
					break
				}
			}
			if opened != tt.wantOpen {
				t.Errorf("opened at %v, want %v (-1: never)", opened, tt.wantOpen)
			}
		})
	}
}

// BenchmarkBreakerObserveSuccess measures a success outcome through a
// Breaker on memstore: unrated, it is one store call; rated, it joins a
// batch (one store call per Cache).
func BenchmarkBreakerObserveSuccess(b *testing.B) {
	for _, bb := range []struct {
		name string
		rate float64
	}{{"Unrated", 0}, {"Rated", 0.5}} {
		b.Run(bb.name, func(b *testing.B) {
			br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 5, FailureRate: bb.rate,
				Window: 10 * time.Second, OpenFor: time.Second}, memstore.NewBreakers())
			if err != nil {
				b.Fatal(err)
			}
			o := breaker.Outcome{Facts: breaker.Facts{Status: 200, Details: breaker.DetailsViaUpstream}, Name: "gpt-4o"}
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := br.Observe(ctx, t0.Add(time.Duration(i)*time.Microsecond), o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Set is the admission pipeline's Breakers.
var _ admission.Breakers = (*breaker.Set)(nil)
