package runtime

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/pressure"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// TestRetrySignals: the runtime gives the retry budget this replica's
// in-flight pressure, the queue's wait, and the failure rate of the
// request's model, or of all models for one without its own window,
// and never registers a model a request names.
func TestRetrySignals(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name  string
		setup func(rt *Runtime)
		give  string // the model
		want  limit.RetrySignals
	}{
		{name: "quiet", setup: func(*Runtime) {}, give: "m", want: limit.RetrySignals{}},
		{
			name: "9 of 10 in flight",
			setup: func(rt *Runtime) {
				for range 9 {
					rt.InFlight().Inc()
				}
			},
			give: "m", want: limit.RetrySignals{Pressure: 0.9},
		},
		{
			name: "a model's own failures",
			setup: func(rt *Runtime) {
				if _, err := rt.Outcomes().Model("m"); err != nil {
					t.Fatal(err)
				}
				observe(rt, at, "m", 30, pressure.Served)
				observe(rt, at, "m", 10, pressure.Failed)
				observe(rt, at, "other", 60, pressure.Served)
			},
			give: "m", want: limit.RetrySignals{ErrorRate: 0.25},
		},
		{
			name: "an unregistered model reads every model's, overloads counted",
			setup: func(rt *Runtime) {
				observe(rt, at, "", 30, pressure.Served)
				observe(rt, at, "", 5, pressure.Failed)
				observe(rt, at, "", 5, pressure.Overloaded)
			},
			give: "unknown", want: limit.RetrySignals{ErrorRate: 0.25},
		},
		{
			name:  "few samples are damped by MinSamples",
			setup: func(rt *Runtime) { observe(rt, at, "", 5, pressure.Failed) },
			give:  "", want: limit.RetrySignals{ErrorRate: 0.25},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt, err := New(context.Background(), Config{
				Replica: "r1", Interval: time.Hour, TTL: time.Hour, Combine: pressure.CombineMax, Capacity: 10, Errors: true, Window: time.Minute,
			}, Shared{
				Board: memstore.NewBoard(), Cells: memstore.NewCells(), Breakers: memstore.NewBreakers(),
				Flights: memstore.NewFlights(), Meters: memstore.NewMeters(),
			}, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.Stop)
			rt.clock = storetest.NewFakeClock(at)
			tt.setup(rt)
			if got := rt.RetrySignals("d", tt.give); got != tt.want {
				t.Errorf("RetrySignals(d, %q) = %+v, want %+v", tt.give, got, tt.want)
			}
			if tt.give != "" && tt.give != "m" && rt.Outcomes().Known(tt.give) != nil {
				t.Errorf("reading the signals registered model %q", tt.give)
			}
		})
	}
}

func observe(rt *Runtime, at time.Time, model string, n int, kind pressure.Kind) {
	for range n {
		rt.Outcomes().Observe(at, kind, 10*time.Millisecond, model)
	}
}

// BenchmarkRetrySignals is the cost the retry budget adds to a decision
// of a domain with one, on a replica with every signal on.
func BenchmarkRetrySignals(b *testing.B) {
	rt, err := New(context.Background(), Config{
		Replica: "r1", Interval: time.Hour, TTL: time.Hour, Combine: pressure.CombineMax, Capacity: 10, Errors: true, Window: time.Minute,
	}, Shared{
		Board: memstore.NewBoard(), Cells: memstore.NewCells(), Breakers: memstore.NewBreakers(),
		Flights: memstore.NewFlights(), Meters: memstore.NewMeters(),
	}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rt.Stop)
	if _, err := rt.Outcomes().Model("m"); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := range 1000 {
		rt.Outcomes().Observe(now.Add(-time.Duration(i)*50*time.Millisecond), pressure.Served, time.Duration(i)*time.Millisecond, "m")
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = rt.RetrySignals("d", "m")
	}
}
