package accesslog

import (
	"context"
	"testing"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit/memstore"
	"github.com/tollgate-dev/tollgate/pkg/limit/storetest"
)

func TestBreakerObserverOpens(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_700_000_000_000)
	br, err := breaker.New(breaker.Config{Key: "model", FailureThreshold: 2, Window: time.Minute, OpenFor: time.Minute}, memstore.NewBreakers())
	if err != nil {
		t.Fatal(err)
	}
	obs := NewBreakerObserver(storetest.NewFakeClock(now), nil, 0, br)
	ctx := context.Background()
	outcomes := []Outcome{
		{Status: 500, UpstreamCluster: "gpu", Facts: upstream(500), Model: "llama"},  // another breaker
		{Status: 504, UpstreamCluster: "gpu", Facts: upstream(504), Model: "gpt-4o"}, // failure 1
		{Status: 200, UpstreamCluster: "gpu", Facts: upstream(200), Model: "gpt-4o"}, // success
		{Status: 500, UpstreamCluster: "gpu", Facts: upstream(500), Tenant: "acme"},  // no model
		{Status: 502, UpstreamCluster: "gpu", Facts: upstream(502), Model: "gpt-4o"}, // failure 2
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
	obs := NewBreakerObserver(clock, nil, 0, br)
	ctx := context.Background()
	obs.Observe(ctx, &Outcome{Status: 500, UpstreamCluster: "gpu", Facts: upstream(500), Model: "m", Final: true})
	clock.Advance(time.Second)
	v, err := br.Allow(ctx, clock.Now(), "m")
	if err != nil || !v.Probe {
		t.Fatalf("Allow after open_for = %+v, %v; want a probe", v, err)
	}
	obs.Observe(ctx, &Outcome{Status: 200, UpstreamCluster: "gpu", Facts: upstream(200), Model: "m", Final: true})
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.HalfOpen {
		t.Fatalf("a success without the probe ID moved the breaker to %v", st.State)
	}
	obs.Observe(ctx, &Outcome{Status: 200, UpstreamCluster: "gpu", Facts: upstream(200), Model: "m", Final: true, Probes: map[string]string{"model": v.ProbeID}})
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Closed {
		t.Fatalf("the probe's success left the breaker %v, want closed", st.State)
	}
}

// upstream is the facts of an entry of status from the upstream.
func upstream(status uint32) breaker.Facts {
	return Facts(envoyEntry(status, breaker.DetailsViaUpstream, nil))
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
	obs := NewBreakerObserver(clock, nil, 0, br)
	ctx := context.Background()
	neutral := []*datav3.HTTPAccessLogEntry{
		notSent(envoyEntry(503, "ext_authz_denied", &datav3.ResponseFlags{
			UnauthorizedDetails: &datav3.ResponseFlags_Unauthorized{Reason: datav3.ResponseFlags_Unauthorized_EXTERNAL_SERVICE},
		})),
		lasting(time.Hour, incomplete(envoyEntry(0, clientLeft, &datav3.ResponseFlags{DownstreamConnectionTermination: true}))),
		incomplete(envoyEntry(408, "stream_idle_timeout", &datav3.ResponseFlags{StreamIdleTimeout: true})),
		envoyEntry(400, breaker.DetailsViaUpstream, nil),
	}
	for range 10 {
		for _, e := range neutral {
			obs.Observe(ctx, &Outcome{Facts: Facts(e), Model: "m", Final: true})
		}
	}
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Closed {
		t.Fatalf("neutral outcomes moved the breaker to %v", st.State)
	}

	obs.Observe(ctx, &Outcome{Facts: upstream(503), Model: "m", Final: true})
	clock.Advance(time.Second)
	p1, err := br.Allow(ctx, clock.Now(), "m")
	if err != nil || !p1.Probe {
		t.Fatalf("Allow after open_for = %+v, %v; want a probe", p1, err)
	}
	if v, _ := br.Allow(ctx, clock.Now(), "m"); v.Allowed {
		t.Fatalf("a second request while the probe is out was allowed: %+v", v)
	}
	for _, e := range neutral {
		obs.Observe(ctx, &Outcome{Facts: Facts(e), Model: "m", Final: true, Probes: map[string]string{"model": p1.ProbeID}})
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
	obs := NewBreakerObserver(clock, nil, 0, br)
	ctx := context.Background()
	fail := func(once string) *Outcome {
		return &Outcome{Status: 503, UpstreamCluster: "llm", Facts: upstream(503), Model: "m", Final: true, Once: once}
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
