package closedloop

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// UpstreamStats is what the model upstream counts: cumulative answers by
// kind, the gauges at the moment of the call, and the real tokens it
// served per tenant (from the x-sim-tenant header).
type UpstreamStats struct {
	Served, QueueFull, QueueTimeout, Vendor429, Failed, Cancelled uint64
	InFlight, Queued                                              int
	Usage                                                         map[string]int64
}

// Overloads is how many overload answers (503 queue full, 504 queue
// timeout, the vendor's 429) the upstream gave.
func (s UpstreamStats) Overloads() uint64 { return s.QueueFull + s.QueueTimeout + s.Vendor429 }

// Arrivals is every request the upstream received and has answered or
// lost (served, refused, failed, cancelled).
func (s UpstreamStats) Arrivals() uint64 {
	return s.Served + s.QueueFull + s.QueueTimeout + s.Vendor429 + s.Failed + s.Cancelled
}

// ScrapedMetrics are the metric families read from each replica's admin
// /metrics: the pressure and breaker state the laws are about,
// and the controller's shed fractions and in-flight count (absent until
// the control loop exports them, which is fine).
var ScrapedMetrics = []string{
	"tollgate_pressure_score",
	"tollgate_pressure_level",
	"tollgate_breaker_state",
	"tollgate_breaker_transitions_total",
	"tollgate_control_shed_fraction",
	"tollgate_control_inflight",
	"tollgate_store_circuit_state",
	// The admission queue (issue 16): its length per tier and its waits
	// by tier and outcome (a histogram: its _count and _bucket series).
	"tollgate_queue_length",
	"tollgate_queue_wait_seconds",
}

// PhaseMark is when a scenario phase began.
type PhaseMark struct {
	Name string
	At   time.Time
}

// UpSample is one reading of the upstream's stats.
type UpSample struct {
	At time.Time
	UpstreamStats
}

// RepSample is one scrape of one replica: each series of ScrapedMetrics
// by its name and sorted labels (see SeriesKey). Err is set when the
// scrape failed; Values is nil then.
type RepSample struct {
	At     time.Time
	Values map[string]float64
	Err    error
}

// Recorder keeps every request's Record and samples the upstream and the
// replicas; Finish turns them into a Run of per-second rows.
type Recorder struct {
	start time.Time

	mu     sync.Mutex
	recs   []Record
	phases []PhaseMark
	up     []UpSample
	reps   [][]RepSample
}

var _ Sink = (*Recorder)(nil)

// NewRecorder starts a recording at now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Add keeps one request's record.
func (r *Recorder) Add(rec Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

// Mark notes that phase name begins now.
func (r *Recorder) Mark(name string) {
	r.mu.Lock()
	r.phases = append(r.phases, PhaseMark{Name: name, At: time.Now()})
	r.mu.Unlock()
}

// StatsFunc reads the upstream's cumulative stats.
type StatsFunc func() UpstreamStats

// Sample reads up and scrapes every admin address (host:port of each
// replica's admin HTTP) each interval until ctx ends. A failed scrape is
// kept as one (a replica down is part of the story), never fatal.
func (r *Recorder) Sample(ctx context.Context, every time.Duration, up StatsFunc, admins []string) {
	r.mu.Lock()
	r.reps = make([][]RepSample, len(admins))
	r.mu.Unlock()
	client := &http.Client{Timeout: max(every/2, 100*time.Millisecond)}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if up != nil {
			s := UpSample{At: time.Now(), UpstreamStats: up()}
			r.mu.Lock()
			r.up = append(r.up, s)
			r.mu.Unlock()
		}
		var wg sync.WaitGroup
		for i, a := range admins {
			wg.Go(func() {
				s := scrape(ctx, client, a)
				r.mu.Lock()
				r.reps[i] = append(r.reps[i], s)
				r.mu.Unlock()
			})
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// scrape reads ScrapedMetrics from one replica's /metrics.
func scrape(ctx context.Context, client *http.Client, admin string) RepSample {
	s := RepSample{At: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		s.Err = fmt.Errorf("scrape %s: %w", admin, err)
		return s
	}
	resp, err := client.Do(req)
	if err != nil {
		s.Err = fmt.Errorf("scrape %s: %w", admin, err)
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.Err = fmt.Errorf("scrape %s: %s", admin, resp.Status)
		return s
	}
	s.Values, s.Err = ParseMetrics(io.LimitReader(resp.Body, 8<<20), ScrapedMetrics)
	return s
}

// ParseMetrics reads the Prometheus text format and returns the gauges
// and counters of the named families, keyed by SeriesKey.
func ParseMetrics(in io.Reader, names []string) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(in)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := map[string]float64{}
	for _, name := range names {
		f, ok := fams[name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetUntyped() != nil:
				v = m.GetUntyped().GetValue()
			case m.GetHistogram() != nil:
				// A histogram as its _count and cumulative _bucket series
				// (le as Prometheus writes it: 0.05, +Inf).
				h := m.GetHistogram()
				out[SeriesKey(name+"_count", m.GetLabel())] = float64(h.GetSampleCount())
				for _, b := range h.GetBucket() {
					le, v := "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
					labels := append(slices.Clone(m.GetLabel()), &dto.LabelPair{Name: &le, Value: &v})
					out[SeriesKey(name+"_bucket", labels)] = float64(b.GetCumulativeCount())
				}
				continue
			default:
				continue
			}
			out[SeriesKey(name, m.GetLabel())] = v
		}
	}
	return out, nil
}

// SeriesKey names a series as name{k=v,...} with labels sorted by name.
func SeriesKey(name string, labels []*dto.LabelPair) string {
	if len(labels) == 0 {
		return name
	}
	ls := slices.Clone(labels)
	sort.Slice(ls, func(i, j int) bool { return ls[i].GetName() < ls[j].GetName() })
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, l := range ls {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.GetName())
		b.WriteByte('=')
		b.WriteString(l.GetValue())
	}
	b.WriteByte('}')
	return b.String()
}

// Run is one finished recording: the raw records and samples, and the
// per-second rows built from them.
type Run struct {
	Start   time.Time
	End     time.Time
	Phases  []PhaseMark
	Records []Record
	Up      []UpSample
	Reps    [][]RepSample
	Tiers   []string
	Rows    []Row
}

// TierRow is one tier's second. A request counts in the second it ended
// (sent + latency), a drop in the second it was due.
type TierRow struct {
	// Sent counts requests sent (drops excluded); Dropped counts drops.
	Sent, Dropped int
	// Admitted went upstream at least once (Tollgate and Envoy let it
	// through); Good got a 2xx from the upstream (goodput).
	Admitted, Good int
	// Denied counts Tollgate's refusals by x-tollgate-reason (limit,
	// shed, breaker; "" when the header was missing).
	Denied map[string]int
	// Envoy answered itself; UpstreamErr is a non-2xx upstream answer;
	// ClientTimeout gave up.
	Envoy, UpstreamErr, ClientTimeout int
	// P50, P95 and P99 are of the goodput's latencies (send to last
	// byte); 0 without goodput.
	P50, P95, P99 time.Duration
	// Retries is the sum of Attempts-1 over admitted requests.
	Retries int
}

// Row is one second of a run.
type Row struct {
	// T is the second since the recording began; Phase is the phase that
	// was active at its start.
	T     int
	Phase string
	Tier  map[string]*TierRow
	// UpInFlight and UpQueued are the upstream's gauges at the second's
	// last sample; Up is the change of its counters over the second.
	UpInFlight, UpQueued int
	Up                   UpstreamStats
	// Replica holds each replica's last scrape in the second (the one
	// before carried forward when the second has none; nil when none yet).
	Replica []map[string]float64
}

// Finish ends the recording now and builds its rows.
func (r *Recorder) Finish() *Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	run := &Run{Start: r.start, End: time.Now(), Phases: slices.Clone(r.phases),
		Records: slices.Clone(r.recs), Up: slices.Clone(r.up), Reps: make([][]RepSample, len(r.reps))}
	for i := range r.reps {
		run.Reps[i] = slices.Clone(r.reps[i])
	}
	run.build()
	return run
}

// Second is the index of the second of the run holding t.
func (run *Run) Second(t time.Time) int { return int(t.Sub(run.Start) / time.Second) }

// PhaseAt is the name of the phase active at t ("" before the first).
func (run *Run) PhaseAt(t time.Time) string {
	name := ""
	for _, p := range run.Phases {
		if !p.At.After(t) {
			name = p.Name
		}
	}
	return name
}

// PhaseWindow is when the named phase began and ended (the next phase's
// start, or the run's end); ok is false when it never ran.
func (run *Run) PhaseWindow(name string) (from, to time.Time, ok bool) {
	for i, p := range run.Phases {
		if p.Name != name {
			continue
		}
		to = run.End
		if i+1 < len(run.Phases) {
			to = run.Phases[i+1].At
		}
		return p.At, to, true
	}
	return time.Time{}, time.Time{}, false
}

func (run *Run) build() {
	n := run.Second(run.End) + 1
	run.Rows = make([]Row, n)
	seen := map[string]bool{}
	for _, rec := range run.Records {
		if !seen[rec.Tier] {
			seen[rec.Tier] = true
			run.Tiers = append(run.Tiers, rec.Tier)
		}
	}
	sort.Slice(run.Tiers, func(i, j int) bool { return tierRank(run.Tiers[i]) < tierRank(run.Tiers[j]) })
	lat := make([]map[string][]time.Duration, n)
	for i := range run.Rows {
		row := &run.Rows[i]
		row.T = i
		row.Phase = run.PhaseAt(run.Start.Add(time.Duration(i) * time.Second))
		row.Tier = map[string]*TierRow{}
		for _, t := range run.Tiers {
			row.Tier[t] = &TierRow{Denied: map[string]int{}}
		}
		lat[i] = map[string][]time.Duration{}
	}
	for _, rec := range run.Records {
		at := rec.Sent
		if !rec.Dropped {
			at = at.Add(rec.Latency)
		}
		i := min(max(run.Second(at), 0), n-1)
		tr := run.Rows[i].Tier[rec.Tier]
		switch {
		case rec.Dropped:
			tr.Dropped++
			continue
		case rec.Source == SourceTollgate:
			tr.Denied[rec.Reason]++
		case rec.Source == SourceEnvoy && rec.Attempts == 0:
			tr.Envoy++
		}
		tr.Sent++
		if rec.Attempts > 0 || rec.Source == SourceUpstream {
			tr.Admitted++
			tr.Retries += max(rec.Attempts-1, 0)
		}
		switch {
		case rec.Source == SourceUpstream && rec.Status/100 == 2:
			tr.Good++
			lat[i][rec.Tier] = append(lat[i][rec.Tier], rec.Latency)
		case rec.Source == SourceUpstream:
			tr.UpstreamErr++
		case rec.Source == SourceClient:
			tr.ClientTimeout++
		}
	}
	for i := range run.Rows {
		for t, ls := range lat[i] {
			tr := run.Rows[i].Tier[t]
			tr.P50, tr.P95, tr.P99 = Quantile(ls, 0.5), Quantile(ls, 0.95), Quantile(ls, 0.99)
		}
	}
	run.buildUp(n)
	run.buildReps(n)
}

// buildUp sets each row's upstream gauges (last sample in the second) and
// counter deltas (against the last sample of the seconds before).
func (run *Run) buildUp(n int) {
	var prev, last UpstreamStats
	j := 0
	for i := range n {
		end := run.Start.Add(time.Duration(i+1) * time.Second)
		for ; j < len(run.Up) && run.Up[j].At.Before(end); j++ {
			last = run.Up[j].UpstreamStats
		}
		row := &run.Rows[i]
		row.UpInFlight, row.UpQueued = last.InFlight, last.Queued
		row.Up = UpstreamStats{
			Served: last.Served - prev.Served, QueueFull: last.QueueFull - prev.QueueFull,
			QueueTimeout: last.QueueTimeout - prev.QueueTimeout, Vendor429: last.Vendor429 - prev.Vendor429,
			Failed: last.Failed - prev.Failed, Cancelled: last.Cancelled - prev.Cancelled,
		}
		prev = last
	}
}

func (run *Run) buildReps(n int) {
	for i := range run.Rows {
		run.Rows[i].Replica = make([]map[string]float64, len(run.Reps))
	}
	for r, samples := range run.Reps {
		var last map[string]float64
		j := 0
		for i := range n {
			end := run.Start.Add(time.Duration(i+1) * time.Second)
			for ; j < len(samples) && samples[j].At.Before(end); j++ {
				if samples[j].Err == nil {
					last = samples[j].Values
				}
			}
			run.Rows[i].Replica[r] = last
		}
	}
}

// Quantile is the q-quantile of ds by nearest rank (the smallest sample
// with at least q of them at or below it); 0 for none. It sorts ds.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	rank := int(math.Ceil(q * float64(len(ds))))
	return ds[min(max(rank, 1), len(ds))-1]
}

// tierRank orders the usual tiers best first, others after by name.
func tierRank(t string) string {
	switch t {
	case "premium":
		return "0"
	case "standard":
		return "1"
	case "free":
		return "2"
	}
	return "3" + t
}
