package extauthz

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/test/testutil"
)

// TestMetricsCheckCache: the cached children count what WithLabelValues
// would, under concurrent first uses of each label set.
func TestMetricsCheckCache(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	results := []string{resultOK, resultOverLimit, resultBadRequest}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				m.check("ai", fmt.Sprint("tier", (g+i)%2), results[i%len(results)]).Inc()
			}
		})
	}
	wg.Wait()
	got := testutil.Gather(t, reg)
	for _, tier := range []string{"tier0", "tier1"} {
		for _, r := range results {
			name := fmt.Sprintf(`tollgate_authz_checks_total{domain="ai",result=%q,tier=%q}`, r, tier)
			if got[name] != 200 {
				t.Errorf("%s = %v, want 200", name, got[name])
			}
		}
	}
	if m.check("ai", "tier0", resultOK) != m.check("ai", "tier0", resultOK) {
		t.Error("check returned two counters for one label set")
	}
}
