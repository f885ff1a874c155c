package accesslog

import (
	"context"
	"fmt"
	"testing"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit/memstore"
	"github.com/tollgate-dev/tollgate/pkg/limit/storetest"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
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
