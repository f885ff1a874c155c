package app

import (
	"errors"
	"flag"
	"fmt"

	"github.com/tollgate-dev/tollgate/pkg/rls"
)

// metricFlags bound what client input can add to /metrics. Every label
// but detailed_metric's descriptor comes from the rules; that one carries
// client values, so its series per rule are capped (issue 14). Unset, the
// flag stays zero and rls's default applies: it lives in one place.
type metricFlags struct {
	detailedSeries setInt
}

func (m *metricFlags) register(fs *flag.FlagSet) {
	fs.Var(&m.detailedSeries, "detailed-metric-series", fmt.Sprintf(
		`series of tollgate_rls_detailed_decisions_total each detailed_metric rule keeps (per domain and rule); decisions past it count under descriptor="overflow" and in tollgate_rls_detailed_overflow_total; 0 sends them all there (default %d)`,
		rls.DefaultDetailedSeriesCap))
}

func (m *metricFlags) check() error {
	if m.detailedSeries.n < 0 {
		return errors.New("--detailed-metric-series must be 0 or more")
	}
	return nil
}

// rlsOptions are the RLS service's options these flags set.
func (m *metricFlags) rlsOptions() []rls.Option {
	if !m.detailedSeries.set {
		return nil
	}
	return []rls.Option{rls.WithDetailedSeriesCap(m.detailedSeries.n)}
}
