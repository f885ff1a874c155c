package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

var t0 = time.Unix(1_700_000_000, 0)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// downStore fails every call; blocking, it waits for the context first.
type downStore struct {
	blocking bool
	mu       sync.Mutex
	calls    int
}

var errDown = errors.New("dial tcp 10.0.0.7:6379: connect: connection refused")

func (s *downStore) Apply(ctx context.Context, _ time.Time, _ []limit.Charge, _ []limit.Result) (bool, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.blocking {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return false, errDown
}

// deadlineStore fails at once and records its context's deadline.
type deadlineStore struct{ deadline time.Time }

func (s *deadlineStore) Apply(ctx context.Context, _ time.Time, _ []limit.Charge, _ []limit.Result) (bool, error) {
	s.deadline, _ = ctx.Deadline()
	return false, errDown
}

// observer records what the Limiter reports.
type observer struct {
	mu       sync.Mutex
	failed   int
	degraded map[string]int // "domain/policy"
	dropped  int
}

func (o *observer) StoreFailed(string) {
	o.mu.Lock()
	o.failed++
	o.mu.Unlock()
}

func (o *observer) Degraded(domain string, p limit.StoreFailure, dropped int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.degraded == nil {
		o.degraded = map[string]int{}
	}
	o.degraded[domain+"/"+p.String()]++
	o.dropped += dropped
}

func perMinute(n uint64) *limit.Limit {
	return &limit.Limit{Kind: limit.Requests, Amount: n, Unit: limit.Minute}
}

// failureRules: tenant (deny), model (local, with a child that says
// allow), path (inherits the domain's local), user (the flag's default,
// in domain "flag"), and a concurrency cap under local.
func failureRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	d := &limit.Domain{Name: "d", StoreFailure: limit.FailureLocal, Descriptors: []*limit.Rule{
		{Key: "tenant", RateLimit: perMinute(100), StoreFailure: limit.FailureDeny},
		{Key: "model", RateLimit: perMinute(100), Children: []*limit.Rule{
			{Key: "user", RateLimit: perMinute(100), StoreFailure: limit.FailureAllow},
			{Key: "region", RateLimit: perMinute(100)},
		}},
		{Key: "path", RateLimit: perMinute(100)},
		{Key: "shadow", RateLimit: perMinute(1), Shadow: true, StoreFailure: limit.FailureDeny},
		{Key: "slots", MaxConcurrent: 20, Lease: time.Minute},
	}}
	flag := &limit.Domain{Name: "flag", Descriptors: []*limit.Rule{{Key: "user", RateLimit: perMinute(100)}}}
	rs, err := limit.NewRuleSet(d, flag)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func req(domain string, descs ...[]string) *limit.Request {
	r := &limit.Request{Domain: domain}
	for _, kv := range descs {
		var d limit.Descriptor
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, limit.Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

func newFailing(t testing.TB, def limit.StoreFailure, o *observer) *admission.Limiter {
	t.Helper()
	if o == nil {
		o = &observer{}
	}
	return admission.NewLimiter(&downStore{}, fixedClock{t0}, failureRules(t), admission.WithStoreFailure(admission.FailurePolicy{
		Timeout: 10 * time.Millisecond, Default: def, LocalFraction: 0.1, Local: memstore.New(), Observer: o,
	}))
}

func TestDegradedPolicies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		def        limit.StoreFailure
		give       *limit.Request
		wantCode   limit.Code
		wantPolicy limit.StoreFailure
		wantCodes  []limit.Code
		wantRetry  []time.Duration
		wantLimit  []uint64 // reported limit amount, 0 for none
	}{
		{
			name: "deny", give: req("d", []string{"tenant", "a"}),
			wantCode: limit.CodeOverLimit, wantPolicy: limit.FailureDeny,
			wantCodes: []limit.Code{limit.CodeOverLimit}, wantRetry: []time.Duration{time.Second}, wantLimit: []uint64{100},
		},
		{
			name: "allow, nearest rule wins over its parent's and the domain's", give: req("d", []string{"model", "m", "user", "u"}),
			wantCode: limit.CodeOK, wantPolicy: limit.FailureAllow,
			wantCodes: []limit.Code{limit.CodeOK}, wantRetry: []time.Duration{0}, wantLimit: []uint64{0},
		},
		{
			name: "local, inherited from the domain, reports the local limit", give: req("d", []string{"path", "/p"}),
			wantCode: limit.CodeOK, wantPolicy: limit.FailureLocal,
			wantCodes: []limit.Code{limit.CodeOK}, wantRetry: []time.Duration{0}, wantLimit: []uint64{10},
		},
		{
			name: "local, inherited from the parent rule", give: req("d", []string{"model", "m", "region", "eu"}),
			wantCode: limit.CodeOK, wantPolicy: limit.FailureLocal,
			wantCodes: []limit.Code{limit.CodeOK}, wantRetry: []time.Duration{0}, wantLimit: []uint64{10},
		},
		{
			name: "the flag's default without a rule or domain policy", def: limit.FailureDeny, give: req("flag", []string{"user", "u"}),
			wantCode: limit.CodeOverLimit, wantPolicy: limit.FailureDeny,
			wantCodes: []limit.Code{limit.CodeOverLimit}, wantRetry: []time.Duration{time.Second}, wantLimit: []uint64{100},
		},
		{
			name: "the default default is local", give: req("flag", []string{"user", "u"}),
			wantCode: limit.CodeOK, wantPolicy: limit.FailureLocal,
			wantCodes: []limit.Code{limit.CodeOK}, wantRetry: []time.Duration{0}, wantLimit: []uint64{10},
		},
		{
			name: "deny wins over local and allow; each status keeps its own", give: req("d", []string{"path", "/p"}, []string{"tenant", "a"}, []string{"model", "m", "user", "u"}),
			wantCode: limit.CodeOverLimit, wantPolicy: limit.FailureDeny,
			wantCodes: []limit.Code{limit.CodeOK, limit.CodeOverLimit, limit.CodeOK},
			wantRetry: []time.Duration{0, time.Second, 0}, wantLimit: []uint64{0, 100, 0},
		},
		{
			name: "local wins over allow", give: req("d", []string{"model", "m", "user", "u"}, []string{"path", "/p"}),
			wantCode: limit.CodeOK, wantPolicy: limit.FailureLocal,
			wantCodes: []limit.Code{limit.CodeOK, limit.CodeOK}, wantRetry: []time.Duration{0, 0}, wantLimit: []uint64{0, 10},
		},
		{
			name: "a shadow rule under deny never denies", give: req("d", []string{"shadow", "s"}),
			wantCode: limit.CodeOK, wantPolicy: limit.FailureDeny,
			wantCodes: []limit.Code{limit.CodeOK}, wantRetry: []time.Duration{0}, wantLimit: []uint64{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := &observer{}
			dec, err := newFailing(t, tt.def, o).Decide(context.Background(), tt.give)
			if err != nil {
				t.Fatalf("Decide: %v, want a degraded answer", err)
			}
			if !dec.Degraded || dec.Code != tt.wantCode || dec.Policy != tt.wantPolicy {
				t.Fatalf("decision = degraded %v, %v, policy %v; want degraded, %v, %v", dec.Degraded, dec.Code, dec.Policy, tt.wantCode, tt.wantPolicy)
			}
			for i, st := range dec.Statuses {
				var amount uint64
				if st.Limit != nil {
					amount = st.Limit.Amount
				}
				if st.Code != tt.wantCodes[i] || st.RetryAfter != tt.wantRetry[i] || amount != tt.wantLimit[i] {
					t.Errorf("status %d = %v retry %v limit %d, want %v retry %v limit %d", i, st.Code, st.RetryAfter, amount, tt.wantCodes[i], tt.wantRetry[i], tt.wantLimit[i])
				}
			}
			if o.failed != 1 || o.degraded[tt.give.Domain+"/"+tt.wantPolicy.String()] != 1 {
				t.Errorf("observer: %d failures, degraded %v; want 1 and one %s", o.failed, o.degraded, tt.wantPolicy)
			}
		})
	}
}

func TestDegradedLocalFraction(t *testing.T) {
	t.Parallel()
	l := newFailing(t, limit.FailureAllow, nil)
	admitted := 0
	for range 30 {
		dec, err := l.Decide(context.Background(), req("d", []string{"path", "/p"}))
		if err != nil {
			t.Fatal(err)
		}
		if dec.Code == limit.CodeOK {
			admitted++
		} else if r := dec.Statuses[0].RetryAfter; r <= 0 {
			t.Errorf("local denial with RetryAfter %v", r)
		}
	}
	// A limit of 100 with a fraction of 0.1: 10 a minute on this replica.
	if admitted != 10 {
		t.Errorf("admitted %d of 30, want 10", admitted)
	}
	// A denial by deny charges nothing locally: the local room is kept.
	other := req("d", []string{"path", "/q"}, []string{"tenant", "a"})
	for range 20 {
		if dec, _ := l.Decide(context.Background(), other); dec.Code != limit.CodeOverLimit {
			t.Fatalf("mixed deny and local = %v, want over limit", dec.Code)
		}
	}
	if dec, _ := l.Decide(context.Background(), req("d", []string{"path", "/q"})); dec.Code != limit.CodeOK || dec.Statuses[0].Remaining != 9 {
		t.Errorf("after denied mixed decisions: %v with %d left, want OK with 9", dec.Code, dec.Statuses[0].Remaining)
	}
}

func TestDegradedDropsRefundsAndReports(t *testing.T) {
	t.Parallel()
	o := &observer{}
	l := newFailing(t, limit.FailureAllow, o)
	r := req("flag", []string{"user", "u"})
	r.Descriptors[0].Negative = true
	dec, err := l.Decide(context.Background(), r)
	if err != nil || dec.Code != limit.CodeOK || !dec.Degraded {
		t.Fatalf("refund = %+v, %v; want OK, degraded", dec, err)
	}
	if o.dropped != 1 {
		t.Errorf("dropped = %d, want the refund counted", o.dropped)
	}
}

func TestDegradedLocalLeaseReleasedByRelease(t *testing.T) {
	t.Parallel()
	l := newFailing(t, limit.FailureAllow, nil)
	// A cap of 20 with a fraction of 0.1: 2 in flight on this replica.
	var held []*limit.Request
	for i := range 3 {
		r := req("d", []string{"slots", "s"})
		r.ID = fmt.Sprintf("r%d", i)
		dec, err := l.Decide(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; (dec.Code == limit.CodeOK) != want {
			t.Fatalf("request %d: %v, want admitted %v", i, dec.Code, want)
		}
		if dec.Code == limit.CodeOK {
			if dec.Reservation == nil || dec.Reservation.Tokens != 0 {
				t.Fatalf("request %d: reservation %+v, want one with no tokens", i, dec.Reservation)
			}
			held = append(held, r)
		} else if !dec.Statuses[0].Concurrency {
			t.Errorf("request %d denied without Concurrency", i)
		}
	}
	// The store is still down: Release fails, and the local lease goes.
	if err := l.Release(context.Background(), held[0]); err == nil {
		t.Error("Release with the store down succeeded")
	}
	r := req("d", []string{"slots", "s"})
	r.ID = "r9"
	if dec, _ := l.Decide(context.Background(), r); dec.Code != limit.CodeOK {
		t.Errorf("after a release: %v, want admitted", dec.Code)
	}
}

// TestDecideHonoursStoreTimeout: a store that hangs until its context ends
// delays a decision by the store timeout, not more.
func TestDecideHonoursStoreTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 10 * time.Millisecond
	s := &downStore{blocking: true}
	l := admission.NewLimiter(s, nil, failureRules(t), admission.WithStoreFailure(admission.FailurePolicy{Timeout: timeout, Default: limit.FailureDeny}))
	for _, r := range []*limit.Request{req("flag", []string{"user", "u"}), req("d", []string{"path", "/p"})} {
		start := time.Now()
		dec, err := l.Decide(context.Background(), r)
		took := time.Since(start)
		if err != nil || !dec.Degraded {
			t.Fatalf("Decide = %+v, %v; want a degraded answer", dec, err)
		}
		// Generous: a loaded CI machine schedules late, never early.
		if took < timeout || took > timeout+200*time.Millisecond {
			t.Errorf("Decide took %v, want %v plus a small margin", took, timeout)
		}
	}
	// A caller's deadline leaves StoreReserve for the answer to get back,
	// but never less than a millisecond for the store.
	for _, tt := range []struct {
		name     string
		left     time.Duration // before the caller's deadline
		timeout  time.Duration
		wantLeft time.Duration // before the caller's deadline, when the store call's ends
	}{
		{name: "a close deadline", left: time.Second, timeout: time.Hour, wantLeft: admission.StoreReserve},
		{name: "a far deadline", left: time.Hour, timeout: time.Second, wantLeft: time.Hour - time.Second},
		{name: "a deadline inside the reserve", left: 2 * time.Millisecond, timeout: time.Second, wantLeft: time.Millisecond},
	} {
		ds := &deadlineStore{}
		l := admission.NewLimiter(ds, nil, failureRules(t), admission.WithStoreFailure(admission.FailurePolicy{Timeout: tt.timeout, Default: limit.FailureDeny}))
		ctx, cancel := context.WithTimeout(context.Background(), tt.left)
		callerDL, _ := ctx.Deadline()
		_, _ = l.Decide(ctx, req("flag", []string{"user", "u"}))
		cancel()
		// The store call's deadline is set from the clock a little after
		// the caller's, so it may be later by that: a few milliseconds on
		// a busy machine, never earlier.
		got := callerDL.Sub(ds.deadline)
		if got > tt.wantLeft || got < tt.wantLeft-50*time.Millisecond {
			t.Errorf("%s: the store call ends %v before the caller's deadline, want %v", tt.name, got, tt.wantLeft)
		}
	}
	// local without an in-process store is deny: the conservative reading.
	if dec, _ := l.Decide(context.Background(), req("d", []string{"path", "/p"})); dec.Code != limit.CodeOverLimit {
		t.Errorf("local without a Local store = %v, want over limit", dec.Code)
	}

	// The caller's own, shorter deadline wins, and a caller that gave up
	// gets its error, not a policy answer.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := l.Decide(ctx, req("flag", []string{"user", "u"})); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Decide past the caller's deadline = %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > timeout+200*time.Millisecond {
		t.Errorf("took %v", took)
	}
}

func TestDecideWithoutStoreFailureReturnsTheError(t *testing.T) {
	t.Parallel()
	l := admission.NewLimiter(&downStore{}, nil, failureRules(t))
	if _, err := l.Decide(context.Background(), req("d", []string{"path", "/p"})); !errors.Is(err, errDown) {
		t.Errorf("Decide = %v, want the store's error", err)
	}
}

func TestParseStoreFailure(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"allow", "deny", "local"} {
		p, ok := limit.ParseStoreFailure(name)
		if !ok || p.String() != name {
			t.Errorf("ParseStoreFailure(%q) = %v, %v", name, p, ok)
		}
	}
	for _, bad := range []string{"", "unset", "Allow", "open"} {
		if _, ok := limit.ParseStoreFailure(bad); ok {
			t.Errorf("ParseStoreFailure(%q) accepted", bad)
		}
	}
}

// BenchmarkDecideStoreFailure is a healthy decision (the store answers)
// with and without the store failure policy serve wires for Redis: what
// the policy costs a decision when nothing fails.
func BenchmarkDecideStoreFailure(b *testing.B) {
	stores := []struct {
		name string
		make func(b *testing.B) limit.Store
	}{
		{"memstore", func(*testing.B) limit.Store { return memstore.New() }},
		{"redis", func(b *testing.B) limit.Store { return testutil.RedisStore(b) }},
	}
	policies := []struct {
		name string
		opts []admission.Option
	}{
		{"none", nil},
		{"default", []admission.Option{admission.WithStoreFailure(admission.FailurePolicy{Timeout: admission.DefaultStoreTimeout, Local: memstore.New()})}},
	}
	d := &limit.Domain{Name: "bench", Descriptors: []*limit.Rule{{Key: "tenant", RateLimit: perMinute(1 << 40)}}}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		b.Fatal(err)
	}
	for _, st := range stores {
		for _, p := range policies {
			b.Run(st.name+"/"+p.name, func(b *testing.B) {
				l := admission.NewLimiter(st.make(b), nil, rs, p.opts...)
				reqs := make([]*limit.Request, 1000)
				for i := range reqs {
					reqs[i] = req("bench", []string{"tenant", fmt.Sprintf("t%d", i)})
				}
				ctx := context.Background()
				var degraded atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						dec, err := l.Decide(ctx, reqs[i%len(reqs)])
						if err != nil {
							b.Errorf("Decide: %v", err)
							return
						}
						if dec.Degraded {
							// A busy machine can hold a decision past the
							// store timeout: counted, not a failure.
							degraded.Add(1)
						}
						i++
					}
				})
				b.ReportMetric(float64(degraded.Load())/float64(b.N), "degraded/op")
			})
		}
	}
}

// TestDegradedTooLarge: with the store down, a request that can never
// fit is marked so whichever store_failure answers it by denying: deny,
// or local (whose share it would not fit either).
func TestDegradedTooLarge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give *limit.Request
		want bool
	}{
		{name: "deny", give: &limit.Request{Domain: "d", Hits: 101, Descriptors: req("d", []string{"tenant", "a"}).Descriptors}, want: true},
		{name: "local", give: &limit.Request{Domain: "d", Hits: 101, Descriptors: req("d", []string{"path", "a"}).Descriptors}, want: true},
		{name: "local: within the limit, beyond the local share", give: &limit.Request{Domain: "d", Hits: 50, Descriptors: req("d", []string{"path", "a"}).Descriptors}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dec, err := newFailing(t, limit.FailureLocal, nil).Decide(context.Background(), tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if !dec.Degraded || dec.Code != limit.CodeOverLimit {
				t.Fatalf("decision = %+v, want degraded and denied", dec)
			}
			st := dec.TooLarge()
			if (st != nil) != tt.want {
				t.Fatalf("TooLarge() = %+v, want one: %v", st, tt.want)
			}
			if (dec.Reason == admission.ReasonTooLarge) != tt.want {
				t.Errorf("Reason = %v, want too_large: %v", dec.Reason, tt.want)
			}
			if st != nil && (st.Cost != 101 || st.Capacity != 100 || st.Limit == nil || st.Limit.Amount != 100) {
				t.Errorf("status = %+v, want cost 101 of capacity 100", st)
			}
		})
	}
}
