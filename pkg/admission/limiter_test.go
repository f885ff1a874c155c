package admission

import (
	"math"

	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// recordStore records the charges it is given and denies the keys in deny.
type recordStore struct {
	charges []limit.Charge
	deny    map[string]bool
	err     error
}

func (s *recordStore) Apply(_ context.Context, _ time.Time, cs []limit.Charge, res []limit.Result) (bool, error) {
	if s.err != nil {
		return false, s.err
	}
	s.charges = append(s.charges, cs...)
	ok := true
	for i, c := range cs {
		fits := !s.deny[c.Key]
		res[i] = limit.Result{Fits: fits, Remaining: c.Amount / 2, ResetAfter: time.Second}
		if !fits {
			res[i].Remaining, res[i].RetryAfter = 0, 2*time.Second
			if !c.Shadow && !c.Force {
				ok = false
			}
		}
	}
	return ok, nil
}

func perMinute(n uint64) *limit.Limit { return &limit.Limit{Amount: n, Unit: limit.Minute} }

func testRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Descriptors: []*limit.Rule{
		{Key: "tenant", RateLimit: perMinute(100), Children: []*limit.Rule{
			{Key: "model", Value: "gpt-4o", RateLimit: perMinute(10), TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour}},
			{Key: "model", Value: "gpt-*", RateLimit: perMinute(20)},
			{Key: "model", Value: "gpt-4*", RateLimit: perMinute(30)},
			{Key: "model", RateLimit: perMinute(40)},
		}},
		{Key: "tenant", Value: "vip", Unlimited: true},
		{Key: "path", Value: "/a", Children: []*limit.Rule{{Key: "method", Value: "GET", RateLimit: perMinute(5)}}},
		{Key: "shadow", RateLimit: perMinute(1), Shadow: true},
		{Key: "old", RateLimit: &limit.Limit{Name: "old-limit", Amount: 1, Unit: limit.Second}},
		{Key: "new", RateLimit: perMinute(50), Replaces: []string{"old-limit"}},
		{Key: "budget", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 500, Unit: limit.Day}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func entries(kv ...string) []limit.Entry {
	var e []limit.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		e = append(e, limit.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return e
}

func TestMatch(t *testing.T) {
	t.Parallel()
	dom := testRules(t).Domain("d")
	tests := []struct {
		name string
		give []limit.Entry
		want string // rule ID, "" for no match
	}{
		{"key only", entries("tenant", "acme"), "tenant"},
		{"exact beats wildcard", entries("tenant", "a", "model", "gpt-4o"), "tenant.model_gpt-4o"},
		{"longest wildcard", entries("tenant", "a", "model", "gpt-4-turbo"), "tenant.model_gpt-4*"},
		{"shorter wildcard", entries("tenant", "a", "model", "gpt-3.5"), "tenant.model_gpt-*"},
		{"key only child", entries("tenant", "a", "model", "llama"), "tenant.model"},
		{"exact unlimited", entries("tenant", "vip"), "tenant_vip"},
		{"no limit on the last entry", entries("path", "/a"), ""},
		{"nested", entries("path", "/a", "method", "GET"), "path_/a.method_GET"},
		{"too deep", entries("path", "/a", "method", "GET", "x", "y"), ""},
		{"unknown key", entries("nope", "x"), ""},
		{"unknown second entry", entries("tenant", "a", "region", "eu"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ""
			if r := dom.Match(tt.give); r != nil {
				got = r.ID
			}
			if got != tt.want {
				t.Errorf("Match(%v) = %q, want %q", tt.give, got, tt.want)
			}
		})
	}
}

func TestNewRuleSetRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []*limit.Domain
		want string
	}{
		{"empty name", []*limit.Domain{{Source: "a.yaml"}}, "empty name"},
		{"twice", []*limit.Domain{{Name: "x", Source: "a"}, {Name: "x", Source: "b"}}, "defined twice"},
		{"dup exact", []*limit.Domain{{Name: "x", Descriptors: []*limit.Rule{{Key: "k", Value: "v"}, {Key: "k", Value: "v"}}}}, "duplicate"},
		{"dup key", []*limit.Domain{{Name: "x", Descriptors: []*limit.Rule{{Key: "k"}, {Key: "k"}}}}, "duplicate"},
		{"dup wildcard", []*limit.Domain{{Name: "x", Descriptors: []*limit.Rule{{Key: "k", Value: "a*"}, {Key: "k", Value: "a*"}}}}, "duplicate"},
		{"empty key", []*limit.Domain{{Name: "x", Descriptors: []*limit.Rule{{Value: "v"}}}}, "empty key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := limit.NewRuleSet(tt.give...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestDecideCosts(t *testing.T) {
	t.Parallel()
	tokenKey := limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("tenant", "a", "model", "gpt-4o"))
	rateKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a", "model", "gpt-4o"))
	type charge struct {
		key   string
		cost  int64
		force bool
	}
	tests := []struct {
		name string
		give limit.Request
		want []charge
	}{
		{
			name: "request limit charges hits_addend",
			give: limit.Request{Domain: "d", Hits: 7, Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			want: []charge{{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a")), 7, false}},
		},
		{
			name: "unset hits is one",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}},
			want: []charge{{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a")), 1, false}},
		},
		{
			name: "per-descriptor zero checks",
			give: limit.Request{Domain: "d", Hits: 5, Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a"), HitsSet: true}}},
			want: []charge{{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a")), 0, false}},
		},
		{
			name: "negative refunds",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a"), Hits: 3, HitsSet: true, Negative: true}}},
			want: []charge{{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a")), -3, false}},
		},
		{
			name: "token rule at request time: one request, budget checked",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "gpt-4o")}}},
			want: []charge{{rateKey, 1, false}, {tokenKey, 0, false}},
		},
		{
			name: "token rule with request-level cost",
			give: limit.Request{Domain: "d", Hits: 250, Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "gpt-4o")}}},
			want: []charge{{rateKey, 1, false}, {tokenKey, 250, false}},
		},
		{
			name: "token rule cost report charges tokens only",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "gpt-4o"), Hits: 900, HitsSet: true}}},
			want: []charge{{tokenKey, 900, true}},
		},
		{
			name: "token-only rule",
			give: limit.Request{Domain: "d", Hits: 40, Descriptors: []limit.Descriptor{{Entries: entries("budget", "x")}}},
			want: []charge{{limit.Key(limit.Tokens, limit.SlidingWindow, 24*time.Hour, "d", entries("budget", "x")), 40, false}},
		},
		{
			name: "unlimited and unmatched charge nothing",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "vip")}, {Entries: entries("nope", "x")}}},
			want: nil,
		},
		{
			name: "replaces drops the named limit",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("old", "x")}, {Entries: entries("new", "y")}}},
			want: []charge{{limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("new", "y")), 1, false}},
		},
		{
			name: "override without a rule",
			give: limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("nope", "x"), Override: &limit.Override{Amount: 3, Unit: limit.Second, Multiplier: 30}}}},
			want: []charge{{limit.Key(limit.Requests, limit.SlidingWindow, 30*time.Second, "d", entries("nope", "x")), 1, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			l := NewLimiter(st, nil, testRules(t))
			dec, err := l.Decide(context.Background(), &tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Code != limit.CodeOK || len(dec.Statuses) != len(tt.give.Descriptors) {
				t.Fatalf("decision %+v", dec)
			}
			var got []charge
			for _, c := range st.charges {
				got = append(got, charge{c.Key, c.Cost, c.Force})
			}
			if len(got) != len(tt.want) {
				t.Fatalf("charges %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("charge %d = %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestDecideStatuses(t *testing.T) {
	t.Parallel()
	rules := testRules(t)
	tenantKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("tenant", "a"))
	shadowKey := limit.Key(limit.Requests, limit.SlidingWindow, time.Minute, "d", entries("shadow", "s"))

	st := &recordStore{deny: map[string]bool{tenantKey: true, shadowKey: true}}
	dec, err := NewLimiter(st, nil, rules).Decide(context.Background(), &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
		{Entries: entries("tenant", "a")},
		{Entries: entries("shadow", "s")},
		{Entries: entries("tenant", "vip")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if dec.Code != limit.CodeOverLimit {
		t.Errorf("overall = %v, want over_limit", dec.Code)
	}
	s0, s1, s2 := dec.Statuses[0], dec.Statuses[1], dec.Statuses[2]
	if s0.Code != limit.CodeOverLimit || s0.Limit == nil || s0.Limit.Amount != 100 || s0.RetryAfter != 2*time.Second || s0.Remaining != 0 {
		t.Errorf("tenant status %+v", s0)
	}
	if s1.Code != limit.CodeOK || !s1.ShadowOver {
		t.Errorf("shadow status %+v, want OK with ShadowOver", s1)
	}
	if s2.Code != limit.CodeOK || s2.Limit != nil || s2.Rule == nil || !s2.Rule.Unlimited {
		t.Errorf("unlimited status %+v", s2)
	}

	// Only the shadow rule denies: the request is admitted.
	st = &recordStore{deny: map[string]bool{shadowKey: true}}
	dec, err = NewLimiter(st, nil, rules).Decide(context.Background(), &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("shadow", "s")}}})
	if err != nil || dec.Code != limit.CodeOK {
		t.Fatalf("shadow-only denial: %+v, %v", dec, err)
	}
}

func TestDecideReportsTighterLimit(t *testing.T) {
	t.Parallel()
	// recordStore reports Remaining = Amount/2 for both limits; the token
	// limit (1000/hour) and the request limit (10/minute) are both half
	// full, so the tie goes to the first, the request limit. With the token
	// limit denying, it is the one reported.
	tokenKey := limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("tenant", "a", "model", "gpt-4o"))
	req := &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "gpt-4o")}}}
	dec, err := NewLimiter(&recordStore{}, nil, testRules(t)).Decide(context.Background(), req)
	if err != nil || dec.Statuses[0].Limit.Kind != limit.Requests {
		t.Fatalf("got %+v, %v; want the request limit reported", dec.Statuses[0].Limit, err)
	}
	dec, err = NewLimiter(&recordStore{deny: map[string]bool{tokenKey: true}}, nil, testRules(t)).Decide(context.Background(), req)
	if err != nil || dec.Statuses[0].Limit.Kind != limit.Tokens || dec.Statuses[0].Code != limit.CodeOverLimit {
		t.Fatalf("got %+v, %v; want the denying token limit", dec.Statuses[0], err)
	}
}

func TestDecideInvalid(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", limit.MaxValueBytes+1)
	many := make([]limit.Descriptor, limit.MaxDescriptors+1)
	for i := range many {
		many[i].Entries = entries("tenant", "a")
	}
	tests := []struct {
		name string
		give limit.Request
		want string
	}{
		{"empty domain", limit.Request{Descriptors: []limit.Descriptor{{Entries: entries("a", "b")}}}, "domain is empty"},
		{"no descriptors", limit.Request{Domain: "d"}, "no descriptors"},
		{"empty key", limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("", "b")}}}, "empty key"},
		{"huge value", limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("a", big)}}}, "at most 1024"},
		{"too many", limit.Request{Domain: "d", Descriptors: many}, "65 descriptors"},
		{"bad override unit", limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a"), Override: &limit.Override{Amount: 1, Unit: 99}}}}, "unit 99"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewLimiter(&recordStore{}, nil, testRules(t)).Decide(context.Background(), &tt.give)
			if !errors.Is(err, limit.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want limit.ErrInvalid with %q", err, tt.want)
			}
		})
	}
}

func TestDecideUnknownDomainAndStoreError(t *testing.T) {
	t.Parallel()
	req := &limit.Request{Domain: "other", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}}}
	dec, err := NewLimiter(&recordStore{}, nil, testRules(t)).Decide(context.Background(), req)
	if err != nil || dec.Code != limit.CodeOK || dec.Statuses[0].Limit != nil {
		t.Fatalf("unknown domain: %+v, %v", dec, err)
	}
	boom := errors.New("boom")
	req.Domain = "d"
	_, err = NewLimiter(&recordStore{err: boom}, nil, testRules(t)).Decide(context.Background(), req)
	if !errors.Is(err, boom) || errors.Is(err, limit.ErrInvalid) {
		t.Fatalf("store error: %v", err)
	}
	// No rules loaded yet: everything is unknown.
	dec, err = NewLimiter(&recordStore{}, nil, nil).Decide(context.Background(), req)
	if err != nil || dec.Code != limit.CodeOK {
		t.Fatalf("no rules: %+v, %v", dec, err)
	}
}

func TestDecideShareThreshold(t *testing.T) {
	t.Parallel()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Descriptors: []*limit.Rule{
		{Key: "path", Value: "/api/*", ShareThreshold: true, Children: []*limit.Rule{
			{Key: "user", RateLimit: perMinute(5)},
		}},
		{Key: "path", Value: "/own/*", RateLimit: perMinute(5)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	keyOf := func(kv ...string) string {
		st := &recordStore{}
		if _, err := NewLimiter(st, nil, rs).Decide(context.Background(), &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: entries(kv...)}}}); err != nil {
			t.Fatal(err)
		}
		if len(st.charges) != 1 {
			t.Fatalf("%v: %d charges", kv, len(st.charges))
		}
		return st.charges[0].Key
	}
	a := keyOf("path", "/api/a", "user", "u1")
	b := keyOf("path", "/api/b", "user", "u1")
	c := keyOf("path", "/api/b", "user", "u2")
	if a != b {
		t.Errorf("share_threshold: /api/a and /api/b count apart: %q %q", a, b)
	}
	if a == c {
		t.Errorf("share_threshold shared the key-only level too")
	}
	if keyOf("path", "/own/a") == keyOf("path", "/own/b") {
		t.Errorf("a wildcard without share_threshold shared one counter")
	}
}

func reserveRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Descriptors: []*limit.Rule{
		{Key: "tenant", RateLimit: &limit.Limit{Name: "req", Amount: 100, Unit: limit.Minute}, Children: []*limit.Rule{
			{Key: "model", TokenLimit: &limit.Limit{Name: "tok", Kind: limit.Tokens, Amount: 1000, Unit: limit.Hour},
				MaxConcurrent: 2, Lease: time.Minute},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestDecideReservesTokensAndLease(t *testing.T) {
	t.Parallel()
	st := &recordStore{}
	clock := fixedClock{time.UnixMilli(1_000_000)}
	req := &limit.Request{Domain: "d", ID: "r1", Tokens: 300, TokensSet: true,
		Overrides:   map[string]limit.Override{"tok": {Amount: 5000}, "req": {Amount: 7, Unit: limit.Second}},
		Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a")}, {Entries: entries("tenant", "a", "model", "m")}}}
	dec, err := NewLimiter(st, clock, reserveRules(t)).Decide(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := []limit.Charge{
		{Key: limit.Key(limit.Requests, limit.SlidingWindow, time.Second, "d", entries("tenant", "a")), Amount: 7, Window: time.Second, Cost: 1},
		{Key: limit.Key(limit.Requests, limit.Concurrency, time.Minute, "d", entries("tenant", "a", "model", "m")), Algorithm: limit.Concurrency, Amount: 2, Window: time.Minute, Cost: 1, Member: "r1"},
		{Key: limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("tenant", "a", "model", "m")), Amount: 5000, Window: time.Hour, Cost: 300},
	}
	if len(st.charges) != len(want) {
		t.Fatalf("charges %+v", st.charges)
	}
	for i := range want {
		if st.charges[i] != want[i] {
			t.Errorf("charge %d = %+v\nwant %+v", i, st.charges[i], want[i])
		}
	}
	if dec.Reservation == nil || dec.Reservation.ID != "r1" || dec.Reservation.Tokens != 300 || !dec.Reservation.At.Equal(clock.t) {
		t.Errorf("reservation %+v", dec.Reservation)
	}
	if got := dec.Statuses[1].Limit; got == nil || got.Amount != 5000 {
		t.Errorf("status reports %+v, want the overridden token limit", got)
	}

	// Without an ID (an RLS call) there is no lease and no reservation.
	st = &recordStore{}
	req.ID = ""
	dec, err = NewLimiter(st, clock, reserveRules(t)).Decide(context.Background(), req)
	if err != nil || dec.Reservation != nil || len(st.charges) != 2 {
		t.Fatalf("no ID: reservation %+v, %d charges, %v", dec.Reservation, len(st.charges), err)
	}
}

func TestDecideConcurrencyDenial(t *testing.T) {
	t.Parallel()
	lease := limit.Key(limit.Requests, limit.Concurrency, time.Minute, "d", entries("tenant", "a", "model", "m"))
	st := &recordStore{deny: map[string]bool{lease: true}}
	dec, err := NewLimiter(st, nil, reserveRules(t)).Decide(context.Background(), &limit.Request{Domain: "d", ID: "r1",
		Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "m")}}})
	if err != nil {
		t.Fatal(err)
	}
	s := dec.Statuses[0]
	if dec.Code != limit.CodeOverLimit || s.Code != limit.CodeOverLimit || !s.Concurrency || dec.Reservation != nil {
		t.Fatalf("decision %+v, status %+v", dec, s)
	}
}

func TestSettleAndRelease(t *testing.T) {
	t.Parallel()
	at := time.UnixMilli(5_000_000)
	req := &limit.Request{Domain: "d", ID: "r1", Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "m")}}}
	tokKey := limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "d", entries("tenant", "a", "model", "m"))
	leaseKey := limit.Key(limit.Requests, limit.Concurrency, time.Minute, "d", entries("tenant", "a", "model", "m"))
	once := limit.OnceKey("d", entries("tenant", "a", "model", "m"), "r1")
	tests := []struct {
		name             string
		reserved, actual uint64
		have             bool
		want             []limit.Charge
	}{
		{"unused tokens go back to the reservation's bucket", 300, 120, true, []limit.Charge{
			{Key: leaseKey, Algorithm: limit.Concurrency, Amount: 2, Window: time.Minute, Cost: -1, Member: "r1"},
			{Key: tokKey, Amount: 1000, Window: time.Hour, Cost: -180, At: at.UnixMilli()},
			{Key: once, Algorithm: limit.Once, Window: time.Hour, Cost: 1},
		}},
		{"usage past the estimate is charged as spent", 300, 450, true, []limit.Charge{
			{Key: leaseKey, Algorithm: limit.Concurrency, Amount: 2, Window: time.Minute, Cost: -1, Member: "r1"},
			{Key: tokKey, Amount: 1000, Window: time.Hour, Cost: 150, Force: true},
			{Key: once, Algorithm: limit.Once, Window: time.Hour, Cost: 1},
		}},
		{"usage as estimated: the lease goes, the mark stays so no later report settles", 300, 300, true, []limit.Charge{
			{Key: leaseKey, Algorithm: limit.Concurrency, Amount: 2, Window: time.Minute, Cost: -1, Member: "r1"},
			{Key: once, Algorithm: limit.Once, Window: time.Hour, Cost: 1},
		}},
		{"no usage known: only the lease is released, with no mark", 300, 0, false, []limit.Charge{
			{Key: leaseKey, Algorithm: limit.Concurrency, Amount: 2, Window: time.Minute, Cost: -1, Member: "r1"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			l := NewLimiter(st, nil, reserveRules(t))
			done, err := true, error(nil)
			if tt.have {
				done, err = l.Settle(context.Background(), req, at, tt.reserved, tt.actual)
			} else {
				err = l.Release(context.Background(), req)
			}
			if err != nil || !done {
				t.Fatalf("Reconcile = %v, %v", done, err)
			}
			if len(st.charges) != len(tt.want) {
				t.Fatalf("charges %+v", st.charges)
			}
			for i := range tt.want {
				if st.charges[i] != tt.want[i] {
					t.Errorf("charge %d = %+v\nwant %+v", i, st.charges[i], tt.want[i])
				}
			}
		})
	}
	if _, err := NewLimiter(&recordStore{}, nil, reserveRules(t)).Settle(context.Background(), &limit.Request{Domain: "d", Descriptors: req.Descriptors}, at, 1, 1); !errors.Is(err, limit.ErrInvalid) {
		t.Errorf("reconcile without an ID: %v, want limit.ErrInvalid", err)
	}
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// longest is limit.MaxWindow, spelled out as pkg/limit's tests do.
const longest = time.Duration(math.MaxInt64)

// TestOverrideHugeMultiplier: a descriptor override of 3 per day with a
// huge unit_multiplier is charged at the longest window, not at the half
// second its product wraps to.
func TestOverrideHugeMultiplier(t *testing.T) {
	t.Parallel()
	st := &recordStore{}
	l := NewLimiter(st, nil, testRules(t))
	req := limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{
		Entries:  entries("nope", "x"),
		Override: &limit.Override{Amount: 3, Unit: limit.Day, Multiplier: 616385997},
	}}}
	if _, err := l.Decide(context.Background(), &req); err != nil {
		t.Fatal(err)
	}
	if len(st.charges) != 1 {
		t.Fatalf("charges %+v, want one", st.charges)
	}
	c := st.charges[0]
	if c.Window != longest || c.Amount != 3 {
		t.Errorf("charge window %v amount %d, want %v and 3", c.Window, c.Amount, longest)
	}
	if want := limit.Key(limit.Requests, limit.SlidingWindow, longest, "d", entries("nope", "x")); c.Key != want {
		t.Errorf("charge key %q, want %q", c.Key, want)
	}
}

// TestOverrideIsItsOwnLimit: a request's limit override is a limit of its
// own, as envoyproxy/ratelimit makes it (issue 18): it limits an
// unlimited rule's descriptor, is enforced under a shadow rule, carries
// no name (so no replaces), and counts with the file's algorithm where
// no rule matches.
func TestOverrideIsItsOwnLimit(t *testing.T) {
	t.Parallel()
	over := &limit.Override{Amount: 3, Unit: limit.Minute, Multiplier: 1}
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "d", Algorithm: limit.FixedWindow, Descriptors: []*limit.Rule{
		{Key: "free", Unlimited: true},
		{Key: "shadow", RateLimit: &limit.Limit{Name: "quiet", Amount: 1, Unit: limit.Minute, Algorithm: limit.SlidingWindow}, Shadow: true},
		{Key: "named", RateLimit: &limit.Limit{Name: "big", Amount: 100, Unit: limit.Hour, Algorithm: limit.TokenBucket}, Replaces: []string{"quiet"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		ents    []limit.Entry
		wantAlg limit.Algorithm
	}{
		{"unlimited", entries("free", "x"), limit.FixedWindow},
		{"shadow", entries("shadow", "x"), limit.SlidingWindow},
		{"named", entries("named", "x"), limit.TokenBucket},
		{"no rule", entries("other", "x"), limit.FixedWindow},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &recordStore{}
			req := &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: tt.ents, Override: over}}}
			dec, err := NewLimiter(st, nil, rs).Decide(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.charges) != 1 {
				t.Fatalf("charges %+v, want the override's one", st.charges)
			}
			c := st.charges[0]
			if c.Amount != 3 || c.Window != time.Minute || c.Shadow || c.Algorithm != tt.wantAlg {
				t.Errorf("charge %+v, want 3 a minute, %v, not shadow", c, tt.wantAlg)
			}
			if l := dec.Statuses[0].Limit; l == nil || l.Name != "" || l.Amount != 3 {
				t.Errorf("status limit %+v, want the override's, without a name", l)
			}
			// Denied, it is refused: the rule's shadow_mode is not its.
			st.deny = map[string]bool{c.Key: true}
			if dec, err := NewLimiter(st, nil, rs).Decide(context.Background(), req); err != nil || dec.Code != limit.CodeOverLimit {
				t.Errorf("over the override: %+v, %v; want OVER_LIMIT", dec, err)
			}
		})
	}
	// A rule whose descriptor is overridden replaces nothing: the shadow
	// rule's own limit still counts beside it.
	st := &recordStore{}
	req := &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{
		{Entries: entries("named", "x"), Override: over},
		{Entries: entries("shadow", "y")},
	}}
	if _, err := NewLimiter(st, nil, rs).Decide(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if len(st.charges) != 2 {
		t.Errorf("charges %+v, want the override's and the shadow rule's", st.charges)
	}
}
