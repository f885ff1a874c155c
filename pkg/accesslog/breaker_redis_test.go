package accesslog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// TestBreakerAcrossReplicas: failures reported through replica A's
// access log (its own Redis client) open the breaker, and replica B's
// Limiter (another client) refuses its next decision for that model with
// ReasonBreaker, charging nothing; another model is unaffected.
func TestBreakerAcrossReplicas(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := storetest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
	cfg := limit.BreakerConfig{Key: "model", FailureThreshold: 3, Window: time.Minute, OpenFor: 30 * time.Second}
	rs, err := limit.NewRuleSet(&limit.Domain{
		Name:        "d",
		Breakers:    []limit.BreakerConfig{cfg},
		Descriptors: []*limit.Rule{{Key: "model", RateLimit: &limit.Limit{Amount: 100, Unit: limit.Minute}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	replica := func() (*breaker.Breaker, *admission.Limiter) {
		c, err := redisstore.NewClient(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		store := redisstore.New(c)
		br, err := breaker.New(cfg, store.Breakers())
		if err != nil {
			t.Fatal(err)
		}
		set := breaker.NewSet()
		set.Replace(breaker.SetEntry{Domain: "d", Breaker: br})
		return br, admission.NewLimiter(store, clock, rs, admission.WithBreakers(set))
	}
	brA, _ := replica()
	_, limB := replica()
	ctx := context.Background()
	req := func(model string) *limit.Request {
		return &limit.Request{Domain: "d", Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "model", Value: model}}}}}
	}

	if dec, err := limB.Decide(ctx, req("gpt-4o")); err != nil || dec.Code != limit.CodeOK {
		t.Fatalf("before failures: %+v, %v", dec, err)
	}
	obsA := NewBreakerObserver(clock, nil, 0, breaker.SetEntry{Domain: "d", Breaker: brA})
	on := func(probe string) []outcome.Breaker {
		return []outcome.Breaker{{Key: "model", Name: "gpt-4o", ProbeID: probe}}
	}
	for i := range 3 {
		obsA.Observe(ctx, &Outcome{Facts: upstream(503), Domain: "d", Breakers: on(""), ID: fmt.Sprint("t", i)})
	}
	clock.Advance(time.Second)
	dec, err := limB.Decide(ctx, req("gpt-4o"))
	if err != nil {
		t.Fatal(err)
	}
	if dec.Code != limit.CodeOverLimit || dec.Reason != admission.ReasonBreaker || dec.RetryAfter != 29*time.Second {
		t.Fatalf("replica B after A's failures: code %v reason %v retry %v; want over_limit breaker 29s", dec.Code, dec.Reason, dec.RetryAfter)
	}
	if dec.Statuses[0].Limit != nil {
		t.Errorf("the refusal reports a limit: %+v", dec.Statuses[0])
	}
	if dec, err := limB.Decide(ctx, req("llama")); err != nil || dec.Code != limit.CodeOK {
		t.Errorf("another model: %+v, %v", dec, err)
	}

	// Half-open: B's decision is a probe; its success, reported through
	// A with the probe ID, closes the breaker for B.
	clock.Advance(30 * time.Second)
	dec, err = limB.Decide(ctx, req("gpt-4o"))
	if err != nil || dec.Code != limit.CodeOK || len(dec.Probes) != 1 {
		t.Fatalf("half-open: %+v, %v; want a probe", dec, err)
	}
	obsA.Observe(ctx, &Outcome{Facts: upstream(200), Domain: "d", Breakers: on(dec.Probes[0].ID), ID: "probe"})
	if st, err := brA.State(ctx, clock.Now(), "gpt-4o"); err != nil || st.State != breaker.Closed {
		t.Errorf("after the probe's success: %+v, %v; want closed", st, err)
	}
}
