package rls

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDetailedSeriesCap is how many series of
// tollgate_rls_detailed_decisions_total one rule keeps unless
// WithDetailedSeriesCap says otherwise.
const DefaultDetailedSeriesCap = 1000

// labelOverflow is the descriptor label of decisions past a rule's cap. A
// descriptor renders as "k=v,..." and a rule only matches one with an
// entry, so no client value renders to it.
const labelOverflow = "overflow"

// Option configures a Service.
type Option func(*options)

type options struct {
	detailedCap int
}

// WithDetailedSeriesCap caps the series tollgate_rls_detailed_decisions_total
// keeps per domain and rule at n (default DefaultDetailedSeriesCap). A
// decision that would start a series past it is counted under the
// descriptor label "overflow" and in tollgate_rls_detailed_overflow_total.
// 0 sends every decision to "overflow"; a negative n keeps the default.
func WithDetailedSeriesCap(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.detailedCap = n
		}
	}
}

// detailedSeries counts decisions of detailed_metric rules. Their
// descriptor label carries client values, and every distinct label set is
// a series the registry keeps forever: 20k values took a replica from 22
// to 180 MB RSS (issue 14). So each rule gets at most limit series, and
// what does not fit shares one overflow series per result.
type detailedSeries struct {
	vec      *prometheus.CounterVec // domain, rule, descriptor, result
	overflow *prometheus.CounterVec // domain, rule
	limit    int

	// mu guards rules. Once a series exists, counting it takes only the
	// read lock: a descriptor a rule has seen costs a map lookup, not the
	// CounterVec's label hashing.
	mu    sync.RWMutex
	rules map[ruleKey]*ruleSeries
}

type ruleKey struct{ domain, rule string }

type seriesKey struct{ descriptor, result string }

type ruleSeries struct {
	series   map[seriesKey]prometheus.Counter // at most limit entries
	spilled  map[string]prometheus.Counter    // overflow series by result
	overflow prometheus.Counter               // this rule's child of overflow
}

// inc counts one decision of rule in domain for descriptor with result.
func (d *detailedSeries) inc(domain, rule, descriptor, result string) {
	rk, sk := ruleKey{domain, rule}, seriesKey{descriptor, result}
	d.mu.RLock()
	rs := d.rules[rk]
	var c prometheus.Counter
	spilled := false
	if rs != nil {
		c = rs.series[sk]
		if c == nil && len(rs.series) >= d.limit {
			// A full rule under a flood of new values stays on the read
			// lock once its overflow series for this result exists.
			c = rs.spilled[sk.result]
			spilled = c != nil
		}
	}
	d.mu.RUnlock()
	switch {
	case c == nil:
		d.spill(rk, sk).Inc()
	case spilled:
		rs.overflow.Inc()
		c.Inc()
	default:
		c.Inc()
	}
}

// spill returns the counter for a series not yet in rules: a new series
// while the rule has room, else the rule's overflow series, whose use it
// counts.
func (d *detailedSeries) spill(rk ruleKey, sk seriesKey) prometheus.Counter {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs := d.rules[rk]
	if rs == nil {
		rs = &ruleSeries{
			series:   map[seriesKey]prometheus.Counter{},
			spilled:  map[string]prometheus.Counter{},
			overflow: d.overflow.WithLabelValues(rk.domain, rk.rule),
		}
		d.rules[rk] = rs
	}
	if c := rs.series[sk]; c != nil {
		return c // another call added it between the locks
	}
	if len(rs.series) < d.limit {
		c := d.vec.WithLabelValues(rk.domain, rk.rule, sk.descriptor, sk.result)
		rs.series[sk] = c
		return c
	}
	rs.overflow.Inc()
	c := rs.spilled[sk.result]
	if c == nil {
		c = d.vec.WithLabelValues(rk.domain, rk.rule, labelOverflow, sk.result)
		rs.spilled[sk.result] = c
	}
	return c
}
