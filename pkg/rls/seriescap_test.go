package rls

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// detailedRules has two detailed_metric rules that match any value: "user"
// allows one call per hour per value (so a value's second call is
// over_limit), "team" is unlimited (no store state per value).
func detailedRules(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "ai", Descriptors: []*limit.Rule{
		{Key: "user", RateLimit: &limit.Limit{Amount: 1, Unit: limit.Hour}, DetailedMetric: true},
		{Key: "team", Unlimited: true, DetailedMetric: true},
	}})
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return rs
}

func newDetailedService(t testing.TB, store limit.Store, opts ...Option) (*Service, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc, err := New(admission.NewLimiter(store, fixedClock{now}, detailedRules(t)), zap.NewNop(), reg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return svc, reg
}

// detailedCounts sums tollgate_rls_detailed_decisions_total by rule and
// result, and counts its series by rule and the overflow series apart.
type detailedCounts struct {
	series   map[string]int     // rule -> series with a client descriptor
	spilled  map[string]float64 // rule/result -> decisions under "overflow"
	total    map[string]float64 // rule/result -> decisions in every series
	overflow map[string]float64 // rule -> tollgate_rls_detailed_overflow_total
}

func gatherDetailed(t testing.TB, reg prometheus.Gatherer) detailedCounts {
	t.Helper()
	got := detailedCounts{series: map[string]int{}, spilled: map[string]float64{}, total: map[string]float64{}, overflow: map[string]float64{}}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			v := m.GetCounter().GetValue()
			switch mf.GetName() {
			case "tollgate_rls_detailed_decisions_total":
				k := ls["rule"] + "/" + ls["result"]
				got.total[k] += v
				if ls["descriptor"] == labelOverflow {
					got.spilled[k] += v
				} else {
					got.series[ls["rule"]]++
				}
			case "tollgate_rls_detailed_overflow_total":
				got.overflow[ls["rule"]] = v
			}
		}
	}
	return got
}

func TestDetailedSeriesCap(t *testing.T) {
	t.Parallel()
	// Each call carries one user value and one team value. Users u0..u<n>
	// call twice (ok, then over_limit: two series each); teams once.
	tests := []struct {
		name  string
		give  int // the cap; -1: the default
		users int
		teams int
		want  detailedCounts
	}{
		{
			name: "under the cap every value keeps its series", give: 10, users: 3, teams: 6,
			want: detailedCounts{
				series:   map[string]int{"user": 6, "team": 6},
				spilled:  map[string]float64{},
				total:    map[string]float64{"user/ok": 3, "user/over_limit": 3, "team/ok": 6},
				overflow: map[string]float64{"user": 0, "team": 0},
			},
		},
		{
			// Users: the first pass fills 4 series (u0..u3 ok); every
			// later decision spills, u0..u3's over_limit included.
			name: "past the cap values share one series per result, each rule its own cap", give: 4, users: 10, teams: 3,
			want: detailedCounts{
				series:   map[string]int{"user": 4, "team": 3},
				spilled:  map[string]float64{"user/ok": 6, "user/over_limit": 10},
				total:    map[string]float64{"user/ok": 10, "user/over_limit": 10, "team/ok": 3},
				overflow: map[string]float64{"user": 16, "team": 0},
			},
		},
		{
			name: "a cap of 0 sends every decision to overflow", give: 0, users: 2, teams: 2,
			want: detailedCounts{
				series:   map[string]int{},
				spilled:  map[string]float64{"user/ok": 2, "user/over_limit": 2, "team/ok": 2},
				total:    map[string]float64{"user/ok": 2, "user/over_limit": 2, "team/ok": 2},
				overflow: map[string]float64{"user": 4, "team": 2},
			},
		},
		{
			name: "the default is 1000", give: -1, users: 600, teams: 1001,
			want: detailedCounts{
				series:   map[string]int{"user": 1000, "team": 1000},
				spilled:  map[string]float64{"user/over_limit": 200, "team/ok": 1},
				total:    map[string]float64{"user/ok": 600, "user/over_limit": 600, "team/ok": 1001},
				overflow: map[string]float64{"user": 200, "team": 1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc, reg := newDetailedService(t, newCountStore(), WithDetailedSeriesCap(tt.give))
			ctx := context.Background()
			for pass := range 2 {
				for i := range max(tt.users, tt.teams) {
					var ds []string
					if i < tt.users {
						ds = append(ds, "user", fmt.Sprintf("u%d", i))
					}
					if i < tt.teams && pass == 0 {
						ds = append(ds, "team", fmt.Sprintf("t%d", i))
					}
					req := &rlsv3.RateLimitRequest{Domain: "ai"}
					for j := 0; j < len(ds); j += 2 {
						req.Descriptors = append(req.Descriptors, desc(ds[j], ds[j+1]))
					}
					if len(req.Descriptors) == 0 {
						continue
					}
					if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
						t.Fatalf("ShouldRateLimit: %v", err)
					}
				}
			}
			if diff := cmp.Diff(tt.want, gatherDetailed(t, reg), cmp.AllowUnexported(detailedCounts{})); diff != "" {
				t.Errorf("detailed metrics (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDetailedSeriesCapUnforgeable: no descriptor a client sends renders
// as the overflow label, so a client cannot write into the overflow series
// while the rule has room, nor make its own value look like overflow.
func TestDetailedSeriesCapUnforgeable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string // the team value
	}{
		{name: "the overflow word", give: labelOverflow},
		{name: "empty", give: ""},
		{name: "invalid UTF-8", give: "\xff" + labelOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc, reg := newDetailedService(t, newCountStore(), WithDetailedSeriesCap(1))
			if _, err := svc.ShouldRateLimit(context.Background(), request("ai", 0, desc("team", tt.give))); err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			got := gatherDetailed(t, reg)
			if got.series["team"] != 1 || len(got.spilled) != 0 || got.overflow["team"] != 0 {
				t.Errorf("team=%q: series %v, spilled %v, overflow %v; want its own series and no overflow", tt.give, got.series, got.spilled, got.overflow)
			}
		})
	}
}

// TestDetailedSeriesCapConcurrent: callers racing to add values never take
// a rule past its cap and lose no decision.
func TestDetailedSeriesCapConcurrent(t *testing.T) {
	t.Parallel()
	const workers, each, seriesCap = 8, 300, 100
	svc, reg := newDetailedService(t, newCountStore(), WithDetailedSeriesCap(seriesCap))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if _, err := svc.ShouldRateLimit(context.Background(), request("ai", 0, desc("team", fmt.Sprintf("w%d-%d", w, i)))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	got := gatherDetailed(t, reg)
	want := detailedCounts{
		series:   map[string]int{"team": seriesCap},
		spilled:  map[string]float64{"team/ok": workers*each - seriesCap},
		total:    map[string]float64{"team/ok": workers * each},
		overflow: map[string]float64{"team": workers*each - seriesCap},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(detailedCounts{})); diff != "" {
		t.Errorf("detailed metrics (-want +got):\n%s", diff)
	}
}

// TestDetailedSeriesMemory is issue 14's finding: distinct descriptor
// values on a detailed_metric rule. Capped, 100k values keep the series
// count at the cap and the heap flat; without a cap (the old behaviour)
// both grow with the values, shown on 20k values, the figure, to
// keep the test short under -race. Not parallel: the heap is measured, so
// no other test may allocate meanwhile (parallel tests wait until the
// serial ones end).
func TestDetailedSeriesMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("120k decisions")
	}
	const warm = 2 * DefaultDetailedSeriesCap
	// Measured on a 2-core box, with and without -race: capped 0.0 MiB
	// over 98k values, uncapped about 860 bytes a value (80 MiB over 98k).
	// The bounds leave room for a busy GC.
	tests := []struct {
		name       string
		give       int // the cap
		values     int
		wantSeries int
		wantMax    int64 // heap growth past warm, bytes
		wantMin    int64 // may be negative: the heap can shrink
	}{
		// A capped run may end a few hundred bytes below where it began
		// (CI saw -144: the GC freed a buffer the warm-up left), so only
		// the growth is bounded.
		{name: "capped", give: DefaultDetailedSeriesCap, values: 100_000, wantSeries: DefaultDetailedSeriesCap, wantMin: math.MinInt64, wantMax: 2 << 20},
		{name: "uncapped", give: math.MaxInt, values: 20_000, wantSeries: 20_000, wantMin: 5 << 20, wantMax: math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// "team" is unlimited, so the store keeps nothing per value and
			// what grows is the metrics alone.
			svc, reg := newDetailedService(t, newCountStore(), WithDetailedSeriesCap(tt.give))
			ctx := context.Background()
			call := func(i int) {
				if _, err := svc.ShouldRateLimit(ctx, request("ai", 0, desc("team", fmt.Sprintf("%s-%08d", strings.Repeat("x", 24), i)))); err != nil {
					t.Fatalf("ShouldRateLimit: %v", err)
				}
			}
			// The baseline is taken once the cap is full: what a capped
			// rule holds is then in place, and the remaining values must
			// add nothing.
			for i := range warm {
				call(i)
			}
			before := heapInUse()
			for i := warm; i < tt.values; i++ {
				call(i)
			}
			grew := heapInUse() - before
			runtime.KeepAlive(svc)
			t.Logf("values %d..%d, cap %d: heap grew %.1f MiB", warm, tt.values, tt.give, float64(grew)/(1<<20))
			if grew > tt.wantMax || grew < tt.wantMin {
				t.Errorf("heap grew %d bytes over values %d..%d, want %d..%d", grew, warm, tt.values, tt.wantMin, tt.wantMax)
			}

			got := gatherDetailed(t, reg)
			if got.series["team"] != tt.wantSeries {
				t.Errorf("series = %d, want %d", got.series["team"], tt.wantSeries)
			}
			if got.total["team/ok"] != float64(tt.values) {
				t.Errorf("decisions counted = %v, want %d", got.total["team/ok"], tt.values)
			}
		})
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkDetailedSeries is the cost of counting one detailed decision:
// a value the rule has a series for, the same through the CounterVec
// alone (the cost before the cap), and new values once the rule is full
// (a flood of distinct values).
func BenchmarkDetailedSeries(b *testing.B) {
	m, err := newMetrics(prometheus.NewRegistry(), options{detailedCap: DefaultDetailedSeriesCap})
	if err != nil {
		b.Fatal(err)
	}
	for i := range DefaultDetailedSeriesCap {
		m.detailed.inc("ai", "team", fmt.Sprintf("team=t%d", i), resultOK)
	}
	fresh := make([]string, 4096)
	for i := range fresh {
		fresh[i] = fmt.Sprintf("team=new%d", i)
	}
	b.Run("seen", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.detailed.inc("ai", "team", "team=t7", resultOK)
		}
	})
	// What counting cost before the cap: the CounterVec's own lookup.
	b.Run("vec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.detailed.vec.WithLabelValues("ai", "team", "team=t7", resultOK).Inc()
		}
	})
	b.Run("overflow", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			m.detailed.inc("ai", "team", fresh[i%len(fresh)], resultOK)
			i++
		}
	})
}
