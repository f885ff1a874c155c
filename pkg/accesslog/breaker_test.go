package accesslog

import (
	"context"
	"fmt"
	"testing"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestBreakerObserverOpens(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_700_000_000_000)
	br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 2, Window: time.Minute, OpenFor: time.Minute}, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	obs := NewBreakerObserver(storetest.NewFakeClock(now), nil, 0, breaker.SetEntry{Domain: "ai", Breaker: br})
	ctx := context.Background()
	on := func(name string) []outcome.Breaker { return []outcome.Breaker{{Key: "model", Name: name}} }
	outcomes := []Outcome{
		{Facts: notSentFacts(503), Domain: "ai", Breakers: on("gpt-4o"), ID: "t0"},                         // no upstream: a denial, ignored
		{Facts: upstream(500), Domain: "ai", Breakers: on("llama"), ID: "t1"},                              // another breaker
		{Facts: upstream(504), Domain: "ai", Breakers: on("gpt-4o"), ID: "t2"},                             // failure 1
		{Facts: upstream(200), Domain: "ai", Breakers: on("gpt-4o"), ID: "t3"},                             // success
		{Facts: upstream(500), Domain: "ai", ID: "t4"},                                                     // no breaker
		{Facts: upstream(500), Domain: "other", Breakers: on("gpt-4o"), ID: "t5"},                          // another domain's
		{Facts: upstream(500), Domain: "ai", Breakers: []outcome.Breaker{{Key: "tenant", Name: "gpt-4o"}}}, // another key's
		{Facts: upstream(502), Domain: "ai", Breakers: on("gpt-4o"), ID: "t6"},                             // failure 2
	}
	for i := range outcomes {
		obs.Observe(ctx, &outcomes[i])
	}
	for name, want := range map[string]breaker.State{"gpt-4o": breaker.Open, "llama": breaker.Closed} {
		st, err := br.State(ctx, now, name)
		if err != nil || st.State != want {
			t.Errorf("State(%q) = %+v, %v; want %v", name, st, err, want)
		}
	}
}

// TestBreakerObserverProbe: a probe's outcome carries its probe ID by
// the breaker's key, and its success closes a half-open breaker; the
// same success without the ID would not.
func TestBreakerObserverProbe(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_700_000_000_000)
	clock := storetest.NewFakeClock(t0)
	br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Second}, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	obs := NewBreakerObserver(clock, nil, 0, breaker.SetEntry{Domain: "ai", Breaker: br})
	ctx := context.Background()
	on := func(probe string) []outcome.Breaker {
		return []outcome.Breaker{{Key: "model", Name: "m", ProbeID: probe}}
	}
	obs.Observe(ctx, &Outcome{Facts: upstream(500), Domain: "ai", Breakers: on("")})
	clock.Advance(time.Second)
	v, err := br.Allow(ctx, clock.Now(), "m")
	if err != nil || !v.Probe {
		t.Fatalf("Allow after open_for = %+v, %v; want a probe", v, err)
	}
	obs.Observe(ctx, &Outcome{Facts: upstream(200), Domain: "ai", Breakers: on("")})
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.HalfOpen {
		t.Fatalf("a success without the probe ID moved the breaker to %v", st.State)
	}
	obs.Observe(ctx, &Outcome{Facts: upstream(200), Domain: "ai", Breakers: on(v.ProbeID)})
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Closed {
		t.Fatalf("the probe's success left the breaker %v, want closed", st.State)
	}
}

// upstream is the facts of an entry of status from the upstream.
func upstream(status uint32) breaker.Facts {
	return Facts(envoyEntry(status, breaker.DetailsViaUpstream, nil))
}

// notSentFacts is the facts of a reply of status Envoy made itself: an
// ext_authz denial that never reached the upstream.
func notSentFacts(status uint32) breaker.Facts {
	return Facts(notSent(envoyEntry(status, "ext_authz_denied", &datav3.ResponseFlags{
		UnauthorizedDetails: &datav3.ResponseFlags_Unauthorized{Reason: datav3.ResponseFlags_Unauthorized_EXTERNAL_SERVICE},
	})))
}

// TestBreakerObserverNeutral: outcomes that say nothing of the upstream
// (Tollgate's own denial, a client that left, a client's 4xx) never open
// a breaker however many arrive; a probe's neutral outcome frees its slot
// for the next request and does not close the breaker.
func TestBreakerObserverNeutral(t *testing.T) {
	t.Parallel()
	clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
	br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Second,
		Timeout: time.Second}, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	obs := NewBreakerObserver(clock, nil, 0, breaker.SetEntry{Domain: "ai", Breaker: br})
	ctx := context.Background()
	on := func(probe string) []outcome.Breaker {
		return []outcome.Breaker{{Key: "model", Name: "m", ProbeID: probe}}
	}
	neutral := []breaker.Facts{
		notSentFacts(503),
		Facts(lasting(time.Hour, incomplete(envoyEntry(0, clientLeft, &datav3.ResponseFlags{DownstreamConnectionTermination: true})))),
		Facts(incomplete(envoyEntry(408, "stream_idle_timeout", &datav3.ResponseFlags{StreamIdleTimeout: true}))),
		upstream(400),
	}
	for i := range 10 {
		for j, f := range neutral {
			obs.Observe(ctx, &Outcome{Facts: f, Domain: "ai", Breakers: on(""), ID: fmt.Sprintf("n%d.%d", i, j)})
		}
	}
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Closed {
		t.Fatalf("neutral outcomes moved the breaker to %v", st.State)
	}

	obs.Observe(ctx, &Outcome{Facts: upstream(503), Domain: "ai", Breakers: on(""), ID: "f1"})
	clock.Advance(time.Second)
	p1, err := br.Allow(ctx, clock.Now(), "m")
	if err != nil || !p1.Probe {
		t.Fatalf("Allow after open_for = %+v, %v; want a probe", p1, err)
	}
	if v, _ := br.Allow(ctx, clock.Now(), "m"); v.Allowed {
		t.Fatalf("a second request while the probe is out was allowed: %+v", v)
	}
	for j, f := range neutral {
		obs.Observe(ctx, &Outcome{Facts: f, Domain: "ai", Breakers: on(p1.ProbeID), ID: fmt.Sprintf("p%d", j)})
	}
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.HalfOpen || st.Probes != 0 || st.Successes != 0 {
		t.Fatalf("after the probe's neutral outcome: %+v; want half-open, slot free, no success", st)
	}
	p2, err := br.Allow(ctx, clock.Now(), "m")
	if err != nil || !p2.Probe {
		t.Fatalf("Allow after the freed slot = %+v, %v; want a probe", p2, err)
	}
}

// TestBreakerObserverOnce: a failure delivered again (Envoy resending a
// batch, or a replay) with the same ticket ID counts once; another
// ticket's failure counts.
func TestBreakerObserverOnce(t *testing.T) {
	t.Parallel()
	clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
	br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 2, Window: time.Minute, OpenFor: time.Minute}, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	obs := NewBreakerObserver(clock, nil, 0, breaker.SetEntry{Domain: "ai", Breaker: br})
	ctx := context.Background()
	fail := func(id string) *Outcome {
		return &Outcome{Facts: upstream(503), Domain: "ai", Breakers: []outcome.Breaker{{Key: "model", Name: "m"}}, ID: id}
	}
	for range 5 {
		obs.Observe(ctx, fail("ticket-1"))
		clock.Advance(time.Second)
	}
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Closed || st.Failures != 1 {
		t.Fatalf("one failure delivered 5 times: %+v; want closed with 1 failure", st)
	}
	obs.Observe(ctx, fail("ticket-2"))
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Open {
		t.Fatalf("a second ticket's failure: %+v; want open", st)
	}
}

// TestBreakerObserverBusy: the issue-13 spike. A full upstream's 503s and
// 504s, with its BusyFunc saying it is at capacity, and the vendor's 429s
// at any load, are overload: however many arrive they never open the
// breaker, and they are counted as such. The same 503 while the upstream
// is not busy is a failure and opens it. The BusyFunc is asked only for
// outcomes whose class depends on it, with the outcome's domain and
// breaker name.
func TestBreakerObserverBusy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      breaker.Facts
		busy      bool
		want      breaker.State
		wantAsked bool
		wantClass breaker.Class
	}{
		{name: "503 busy", give: upstream(503), busy: true, want: breaker.Closed, wantAsked: true, wantClass: breaker.Overload},
		{name: "504 busy", give: upstream(504), busy: true, want: breaker.Closed, wantAsked: true, wantClass: breaker.Overload},
		{name: "UT busy", give: Facts(noAnswer(envoyEntry(504, "response_timeout", &datav3.ResponseFlags{UpstreamRequestTimeout: true}))),
			busy: true, want: breaker.Closed, wantAsked: true, wantClass: breaker.Overload},
		{name: "429 not busy", give: upstream(429), want: breaker.Closed, wantClass: breaker.Overload},
		{name: "503 not busy", give: upstream(503), want: breaker.Open, wantAsked: true, wantClass: breaker.Failure},
		{name: "500 busy", give: upstream(500), busy: true, want: breaker.Open, wantClass: breaker.Failure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
			br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 5, Window: time.Minute, OpenFor: 30 * time.Second}, memstore.NewBreakers())
			if err != nil {
				t.Fatal(err)
			}
			var asked []string
			obs := NewBreakerObserver(clock, nil, 0, breaker.SetEntry{Domain: "ai", Breaker: br}).WithBusy(func(domain, name string) bool {
				asked = append(asked, domain+"/"+name)
				return tt.busy
			})
			ctx := context.Background()
			const n = 20
			for i := range n {
				obs.Observe(ctx, &Outcome{Facts: tt.give, Domain: "ai", Breakers: []outcome.Breaker{{Key: "model", Name: "m"}}, ID: fmt.Sprintf("t%d", i)})
				clock.Advance(10 * time.Millisecond)
			}
			if st, _ := br.State(ctx, clock.Now(), "m"); st.State != tt.want {
				t.Errorf("after %d outcomes: %v, want %v", n, st.State, tt.want)
			}
			if got := len(asked) > 0; got != tt.wantAsked {
				t.Errorf("BusyFunc asked %d times, want asked: %v", len(asked), tt.wantAsked)
			}
			for _, a := range asked {
				if a != "ai/m" {
					t.Fatalf("BusyFunc asked for %q, want ai/m", a)
				}
			}
			if got := br.Outcomes()[tt.wantClass].N; got == 0 {
				t.Errorf("Outcomes()[%v] = 0, want the outcomes counted there (%+v)", tt.wantClass, br.Outcomes())
			}
		})
	}
}
