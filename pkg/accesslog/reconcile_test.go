package accesslog

import (
	"context"
	"github.com/tollgate-dev/tollgate/test/testutil"
	"strconv"
	"sync"
	"testing"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// These tests run Check and the access log together, as one Envoy would
// call them, against the real limiter on memstore and on Redis.

const (
	budget = 10_000 // tokens an hour per tenant and model
	key    = "sk-acme-0123456789abcdef"
	// usageHeader is where the upstream reports the actual total tokens.
	usageHeader = "x-usage-total-tokens"
)

// rules: a token budget per tenant and model; capped is the same with at
// most 2 requests in flight, each lease lasting 30 s.
const rules = `
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000, name: tenant_requests}
    descriptors:
      - key: model
        token_limit: {unit: hour, tokens_per_unit: 10000, name: tenant_model_tokens}
`

const cappedRules = rules + `        max_concurrent: {limit: 2, lease: 30s}
`

const settings = `
domain: ai
keys_file: keys.yaml
descriptors:
  - [{key: tenant, from: tenant}]
  - [{key: tenant, from: tenant}, {key: model, from: model}]
estimate: {chars_per_token: 4, default_max_tokens: 100}
usage_header: x-usage-total-tokens
`

const keys = `
keys:
  - {key: "` + key + `", tenant: acme}
`

// replica is one Tollgate process: a limiter, and Check and the access
// log on one gRPC port. Replicas built on one store share their counters.
type replica struct {
	lim   *admission.Limiter
	authz authv3.AuthorizationClient
	als   alsv3.AccessLogServiceClient
	reg   *prometheus.Registry
}

func newReplica(t testing.TB, store limit.Store, clock limit.Clock, ruleYAML string) *replica {
	t.Helper()
	d, err := config.Parse("rules.yaml", []byte(ruleYAML))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := limit.NewRuleSet(d)
	if err != nil {
		t.Fatal(err)
	}
	set, err := extauthz.ParseSettings("authz.yaml", []byte(settings))
	if err != nil {
		t.Fatal(err)
	}
	if set.Keys, err = authn.Parse("keys.yaml", []byte(keys)); err != nil {
		t.Fatal(err)
	}
	lim := admission.NewLimiter(store, clock, rs)
	reg := prometheus.NewRegistry()
	authz, err := extauthz.New(lim, set, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	loop, err := outcome.New(testKeys, lim, nil, reg, outcome.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	authz.SetSealer(loop.Sealer())
	als, err := New(loop, nil, reg, Options{UsageHeader: set.UsageHeader})
	if err != nil {
		t.Fatal(err)
	}
	conn := testutil.Serve(t, authz, als)
	return &replica{lim: lim, authz: authv3.NewAuthorizationClient(conn), als: alsv3.NewAccessLogServiceClient(conn), reg: reg}
}

// chat is a request whose estimate is exactly tokens: a 400-character
// prompt (100 tokens) and max_tokens for the rest.
func chat(tokens int) *authv3.CheckRequest {
	prompt := make([]byte, 400)
	for i := range prompt {
		prompt[i] = 'a'
	}
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + string(prompt) + `"}],"max_tokens":` + strconv.Itoa(tokens-100) + `}`
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Id: "r", Method: "POST", Path: "/v1/chat/completions",
			Headers: map[string]string{"authorization": "Bearer " + key}, Body: body, Size: int64(len(body))},
	}}}
}

func (r *replica) check(t testing.TB, req *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.authz.Check(ctx, req)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return resp
}

// outcomeEntry is the access log entry Envoy sends for an admitted request:
// Check's dynamic metadata, and the upstream's usage header.
func outcomeEntry(resp *authv3.CheckResponse, actual int) *datav3.HTTPAccessLogEntry {
	e := entry(resp.GetDynamicMetadata().GetFields(), 200, usageHeader, strconv.Itoa(actual))
	if resp.GetDynamicMetadata() == nil {
		e.CommonProperties.Metadata = nil
	}
	return e
}

// counted is what the tenant's token budget has counted: a check (cost 0)
// under an override far above the budget, on the same counter (an
// override that keeps the window keeps the key), reports the room left.
func counted(t testing.TB, lim *admission.Limiter) uint64 {
	t.Helper()
	const probe = 1 << 40
	dec, err := lim.Decide(context.Background(), &limit.Request{
		Domain:      "ai",
		Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}, {Key: "model", Value: "gpt-4o"}}}},
		TokensSet:   true,
		Overrides:   map[string]limit.Override{"tenant_model_tokens": {Amount: probe}},
	})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	st := dec.Statuses[0]
	if st.Limit == nil || st.Limit.Amount != probe {
		t.Fatalf("probe reported %+v", st)
	}
	return probe - st.Remaining
}

// checkConcurrently makes n Check calls at once and returns the admitted
// answers.
func checkConcurrently(t *testing.T, r *replica, n int, req *authv3.CheckRequest) []*authv3.CheckResponse {
	t.Helper()
	var mu sync.Mutex
	var ok []*authv3.CheckResponse
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if resp := r.check(t, req); resp.GetOkResponse() != nil {
				mu.Lock()
				ok = append(ok, resp)
				mu.Unlock()
			} else if resp.GetDeniedResponse().GetStatus().GetCode() != 429 {
				t.Errorf("a denial that is not 429: %v", resp)
			}
		})
	}
	wg.Wait()
	return ok
}

// TestReserveThenReconcileHoldsTheBudget is the promise. A tenant
// sends 50 requests at once, each estimated at 1,000 tokens, against a
// budget of 10,000 an hour. Charged after the fact, every one would see an
// untouched budget and all 50 would run (TestChargeAfterTheFactOvershoots).
// Reserved at admission, 10 run; the access log then settles each at its
// actual usage. The budget ends up counting exactly the usage, and it can
// exceed the budget only by what the requests in flight together used
// beyond their estimates: in the example (some under, some over)
// less than one request's estimate error. Refunds make room: the next
// burst admits exactly what they freed.
func TestReserveThenReconcileHoldsTheBudget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		actuals []int // of the 10 admitted requests
		// oneError, when set, is one request's largest estimate error,
		// which the overshoot must stay within.
		oneError int
	}{
		{name: "some under, some over the estimate", actuals: []int{600, 1300, 900, 1250, 800, 1200, 1000, 1100, 700, 1300}, oneError: 400},
		// Ten requests in flight that all outgrow their estimates overshoot
		// by their ten errors: the reservation bounds what is admitted,
		// not what an admitted request goes on to use.
		{name: "all over the estimate by a little", actuals: []int{1010, 1010, 1010, 1010, 1010, 1010, 1010, 1010, 1010, 1010}},
		{name: "all under the estimate", actuals: []int{500, 500, 500, 500, 500, 500, 500, 500, 500, 500}, oneError: 500},
	}
	for _, sk := range testutil.StoreKinds {
		for _, tt := range tests {
			t.Run(sk.Name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				clock := storetest.NewFakeClock(t0)
				r := newReplica(t, sk.Make(t), clock, rules)

				admitted := checkConcurrently(t, r, 50, chat(1000))
				if len(admitted) != budget/1000 {
					t.Fatalf("admitted %d of 50 requests of 1,000 tokens under a %d budget, want %d", len(admitted), budget, budget/1000)
				}
				if got := counted(t, r.lim); got != budget {
					t.Fatalf("usage after admission = %d, want the %d reserved", got, budget)
				}
				clock.Advance(10 * time.Second)
				var batch []*datav3.HTTPAccessLogEntry
				total, refund, charge := 0, 0, 0
				for i, resp := range admitted {
					a := tt.actuals[i]
					batch = append(batch, outcomeEntry(resp, a))
					total += a
					refund += max(0, 1000-a)
					charge += max(0, a-1000)
				}
				send(t, r.als, batch)
				got := counted(t, r.lim)
				if got != uint64(total) {
					t.Errorf("usage after reconciliation = %d, want the actual %d", got, total)
				}
				overshoot := int(got) - budget
				if overshoot > charge {
					t.Errorf("usage %d is over the budget %d by more than the requests in flight outgrew their estimates (%d)", got, budget, charge)
				}
				if tt.oneError > 0 && overshoot > tt.oneError {
					t.Errorf("usage %d is over the budget %d by more than one estimate error (%d)", got, budget, tt.oneError)
				}
				want := map[string]float64{"entries:settled": 10, "reports:accesslog/settled": 10, "tickets:accesslog/verified": 10}
				if refund > 0 {
					want["tokens:accesslog/refund"] = float64(refund)
				}
				if charge > 0 {
					want["tokens:accesslog/charge"] = float64(charge)
				}
				if diff := cmp.Diff(want, counters(t, r.reg)); diff != "" {
					t.Errorf("metrics (-want +got):\n%s", diff)
				}

				room := (budget - min(total, budget)) / 1000
				if second := checkConcurrently(t, r, 50, chat(1000)); len(second) != room {
					t.Errorf("the next burst admitted %d, want the %d the refunds made room for", len(second), room)
				}
			})
		}
	}
}

// TestChargeAfterTheFactOvershoots is the baseline the reservation beats:
// checking the budget without reserving (what a usage report after the
// response amounts to) admits all 50 concurrent requests.
func TestChargeAfterTheFactOvershoots(t *testing.T) {
	t.Parallel()
	r := newReplica(t, memstore.New(), storetest.NewFakeClock(t0), rules)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 50 {
		wg.Go(func() {
			dec, err := r.lim.Decide(context.Background(), &limit.Request{
				Domain:      "ai",
				Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}, {Key: "model", Value: "gpt-4o"}}}},
				TokensSet:   true, // Tokens 0: only checks that budget is left
			})
			if err == nil && dec.Code == limit.CodeOK {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if admitted != 50 {
		t.Errorf("charge after the fact admitted %d of 50, want all 50 (which would then spend 50,000 tokens)", admitted)
	}
}

// TestReconcileExactlyOnce delivers one request's entry twice on one
// stream, then again on two streams to two replicas sharing the store:
// the usage changes once.
func TestReconcileExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewFakeClock(t0)
			store := sk.Make(t)
			a := newReplica(t, store, clock, rules)
			b := newReplica(t, store, clock, rules)
			resp := a.check(t, chat(1000))
			if resp.GetOkResponse() == nil {
				t.Fatalf("Check: %v", resp)
			}
			if got := counted(t, a.lim); got != 1000 {
				t.Fatalf("usage after admission = %d", got)
			}
			e := outcomeEntry(resp, 400)

			send(t, a.als, []*datav3.HTTPAccessLogEntry{e}, []*datav3.HTTPAccessLogEntry{e})
			if got := counted(t, a.lim); got != 400 {
				t.Errorf("usage after the entry twice on one stream = %d, want 400", got)
			}
			var wg sync.WaitGroup
			for _, r := range []*replica{a, b} {
				wg.Go(func() { send(t, r.als, []*datav3.HTTPAccessLogEntry{e}) })
			}
			wg.Wait()
			if got := counted(t, b.lim); got != 400 {
				t.Errorf("usage after the entry on two replicas = %d, want 400", got)
			}
			ma, mb := counters(t, a.reg), counters(t, b.reg)
			if ma["entries:settled"] != 1 || ma["entries:duplicate"]+mb["entries:duplicate"] != 3 || mb["entries:settled"] != 0 {
				t.Errorf("metrics: replica a %v, replica b %v; want 1 reconciled and 3 duplicates", ma, mb)
			}
		})
	}
}

// TestAccessLogReleasesLease: with at most 2 requests in flight, a third
// is refused (429) until the access log says one of the two finished.
func TestAccessLogReleasesLease(t *testing.T) {
	t.Parallel()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			r := newReplica(t, sk.Make(t), storetest.NewFakeClock(t0), cappedRules)
			first := r.check(t, chat(500))
			if first.GetOkResponse() == nil || r.check(t, chat(500)).GetOkResponse() == nil {
				t.Fatal("the first two requests were not admitted")
			}
			third := r.check(t, chat(500))
			if got := third.GetDeniedResponse(); got.GetStatus().GetCode() != 429 || !containsHeader(got, "retry-after", "30") {
				t.Fatalf("third request = %v, want 429 with retry-after 30", third)
			}
			send(t, r.als, []*datav3.HTTPAccessLogEntry{outcomeEntry(first, 500)})
			if resp := r.check(t, chat(500)); resp.GetOkResponse() == nil {
				t.Errorf("after the access log released a lease: %v", resp)
			}
		})
	}
}

// TestReservationWithoutOutcomeExpires: a request whose access log entry
// never comes holds its lease until the lease ends, and its tokens until
// they age out of the window.
func TestReservationWithoutOutcomeExpires(t *testing.T) {
	t.Parallel()
	for _, sk := range testutil.StoreKinds {
		t.Run(sk.Name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewFakeClock(t0)
			r := newReplica(t, sk.Make(t), clock, cappedRules)
			for range 2 {
				if resp := r.check(t, chat(1000)); resp.GetOkResponse() == nil {
					t.Fatalf("Check: %v", resp)
				}
			}
			if resp := r.check(t, chat(1000)); resp.GetOkResponse() != nil {
				t.Fatal("a third request in flight was admitted")
			}
			clock.Advance(29 * time.Second)
			if resp := r.check(t, chat(1000)); resp.GetOkResponse() != nil {
				t.Fatal("admitted before the leases ended")
			}
			clock.Advance(time.Second)
			if resp := r.check(t, chat(1000)); resp.GetOkResponse() == nil {
				t.Fatalf("the leases did not end after 30 s: %v", resp)
			}
			if got := counted(t, r.lim); got != 3000 {
				t.Fatalf("usage = %d, want the three reservations' 3000", got)
			}
			// An hour's sliding window counts 21 buckets of 180 s: tokens
			// reserved at t0 and t0+30s have left it 63 minutes on.
			clock.Set(t0.Add(63 * time.Minute))
			if got := counted(t, r.lim); got != 0 {
				t.Errorf("usage an hour on = %d, want 0", got)
			}
		})
	}
}

func containsHeader(d *authv3.DeniedHttpResponse, key, value string) bool {
	for _, h := range d.GetHeaders() {
		if h.GetHeader().GetKey() == key && h.GetHeader().GetValue() == value {
			return true
		}
	}
	return false
}
