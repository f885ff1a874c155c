package limit_test

import (
	"math"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func TestRetryBudgetRetries(t *testing.T) {
	t.Parallel()
	def := limit.DefaultRetryBudget()
	two := def
	two.Max = 2
	tests := []struct {
		name string
		b    limit.RetryBudget
		give limit.RetrySignals
		want int
	}{
		{name: "calm", b: def, give: limit.RetrySignals{}, want: 3},
		{name: "breaker open", b: def, give: limit.RetrySignals{BreakerOpen: true}, want: 0},
		{name: "pressure just under", b: def, give: limit.RetrySignals{Pressure: 0.899}, want: 3},
		{name: "pressure at bound", b: def, give: limit.RetrySignals{Pressure: 0.9}, want: 0},
		{name: "pressure NaN", b: def, give: limit.RetrySignals{Pressure: math.NaN()}, want: 0},
		{name: "queue wait at bound", b: def, give: limit.RetrySignals{QueueWait: 2 * time.Second}, want: 3},
		{name: "queue wait above", b: def, give: limit.RetrySignals{QueueWait: 2*time.Second + 1}, want: 0},
		{name: "errors at 0.2", b: def, give: limit.RetrySignals{ErrorRate: 0.2}, want: 3},
		{name: "errors above 0.2", b: def, give: limit.RetrySignals{ErrorRate: 0.21}, want: 2},
		{name: "errors at 0.5", b: def, give: limit.RetrySignals{ErrorRate: 0.5}, want: 2},
		{name: "errors above 0.5", b: def, give: limit.RetrySignals{ErrorRate: 0.51}, want: 1},
		{name: "errors NaN", b: def, give: limit.RetrySignals{ErrorRate: math.NaN()}, want: 0},
		{name: "max 2 calm", b: two, give: limit.RetrySignals{}, want: 2},
		{name: "max 2 errors above 0.5", b: two, give: limit.RetrySignals{ErrorRate: 0.9}, want: 1},
		{name: "max above the cap", b: limit.RetryBudget{Max: 9, MaxPressure: 1}, give: limit.RetrySignals{}, want: 3},
		{name: "negative max", b: limit.RetryBudget{Max: -1, MaxPressure: 1}, give: limit.RetrySignals{}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.b.Retries(tt.give); got != tt.want {
				t.Errorf("Retries(%+v) = %d, want %d", tt.give, got, tt.want)
			}
		})
	}
}

// TestRetryBudgetLaws sweeps a grid of every input, on both sides of
// every threshold, and checks the retry budget's laws: it is in
// [0, Max]; it is 0 whenever the breaker is open or half-open or the
// pressure is at or above 0.9; and it never rises when one input
// worsens, the others held.
func TestRetryBudgetLaws(t *testing.T) {
	t.Parallel()
	pressures := []float64{0, 0.1, 0.5, 0.89, 0.8999, 0.9, 0.9001, 0.95, 1}
	waits := []time.Duration{0, time.Millisecond, time.Second, 2*time.Second - 1, 2 * time.Second, 2*time.Second + 1, 5 * time.Second}
	rates := []float64{0, 0.1, 0.2, 0.2001, 0.3, 0.5, 0.5001, 0.7, 1}
	maxes := []int{0, 1, 2, 3}
	checked := 0
	for _, m := range maxes {
		b := limit.DefaultRetryBudget()
		b.Max = m
		for _, open := range []bool{false, true} {
			for pi, p := range pressures {
				for wi, w := range waits {
					for ri, r := range rates {
						s := limit.RetrySignals{BreakerOpen: open, Pressure: p, QueueWait: w, ErrorRate: r}
						got := b.Retries(s)
						checked++
						if got < 0 || got > m {
							t.Fatalf("Retries(%+v) with max %d = %d, outside [0,%d]", s, m, got, m)
						}
						if (open || p >= 0.9 || w > 2*time.Second) && got != 0 {
							t.Fatalf("Retries(%+v) = %d, want 0", s, got)
						}
						// Worsen each input by one step: the budget may
						// only fall.
						worse := []limit.RetrySignals{}
						if !open {
							ws := s
							ws.BreakerOpen = true
							worse = append(worse, ws)
						}
						if pi+1 < len(pressures) {
							ws := s
							ws.Pressure = pressures[pi+1]
							worse = append(worse, ws)
						}
						if wi+1 < len(waits) {
							ws := s
							ws.QueueWait = waits[wi+1]
							worse = append(worse, ws)
						}
						if ri+1 < len(rates) {
							ws := s
							ws.ErrorRate = rates[ri+1]
							worse = append(worse, ws)
						}
						for _, ws := range worse {
							if g := b.Retries(ws); g > got {
								t.Fatalf("Retries rose from %d at %+v to %d at worse %+v", got, s, g, ws)
							}
						}
						// A larger Max never lowers the budget.
						if m < limit.MaxRetries {
							bb := b
							bb.Max = m + 1
							if g := bb.Retries(s); g < got {
								t.Fatalf("Retries(%+v) fell from %d to %d as max rose to %d", s, got, g, m+1)
							}
						}
					}
				}
			}
		}
	}
	if want := len(maxes) * 2 * len(pressures) * len(waits) * len(rates); checked != want {
		t.Fatalf("checked %d points, want %d", checked, want)
	}
}
