package accesslog

import (
	"context"
	"testing"
	"time"

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
		{Status: 503, Domain: "ai", Breakers: on("gpt-4o")},                                                               // no upstream: a denial, ignored
		{Status: 500, UpstreamCluster: "gpu", Domain: "ai", Breakers: on("llama")},                                        // another breaker
		{Status: 504, UpstreamCluster: "gpu", Domain: "ai", Breakers: on("gpt-4o")},                                       // failure 1
		{Status: 200, UpstreamCluster: "gpu", Domain: "ai", Breakers: on("gpt-4o")},                                       // success
		{Status: 500, UpstreamCluster: "gpu", Domain: "ai"},                                                               // no breaker
		{Status: 500, UpstreamCluster: "gpu", Domain: "other", Breakers: on("gpt-4o")},                                    // another domain's
		{Status: 500, UpstreamCluster: "gpu", Domain: "ai", Breakers: []outcome.Breaker{{Key: "tenant", Name: "gpt-4o"}}}, // another key's
		{Status: 502, UpstreamCluster: "gpu", Domain: "ai", Breakers: on("gpt-4o")},                                       // failure 2
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
	obs.Observe(ctx, &Outcome{Status: 500, UpstreamCluster: "gpu", Domain: "ai", Breakers: on("")})
	clock.Advance(time.Second)
	v, err := br.Allow(ctx, clock.Now(), "m")
	if err != nil || !v.Probe {
		t.Fatalf("Allow after open_for = %+v, %v; want a probe", v, err)
	}
	obs.Observe(ctx, &Outcome{Status: 200, UpstreamCluster: "gpu", Domain: "ai", Breakers: on("")})
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.HalfOpen {
		t.Fatalf("a success without the probe ID moved the breaker to %v", st.State)
	}
	obs.Observe(ctx, &Outcome{Status: 200, UpstreamCluster: "gpu", Domain: "ai", Breakers: on(v.ProbeID)})
	if st, _ := br.State(ctx, clock.Now(), "m"); st.State != breaker.Closed {
		t.Fatalf("the probe's success left the breaker %v, want closed", st.State)
	}
}
