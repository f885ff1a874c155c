package closedloop

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// denyReasons are the x-tollgate-reason values the CSV gives a column
// each; any other reason (or none) is counted in denied_other.
var denyReasons = []string{"limit", "shed", "breaker"}

// WriteCSV writes run's rows: one line a second, with per tier the
// requests sent, dropped by the driver, admitted, goodput, denied per
// reason, Envoy's own answers, upstream errors, client give-ups, retries
// and goodput latency percentiles in ms; the upstream's gauges and the
// second's answers by kind; and per replica (r0, r1, ...) every scraped
// series.
func WriteCSV(w io.Writer, run *Run) error {
	series := run.SeriesKeys()
	head := []string{"t", "phase"}
	for _, t := range run.Tiers {
		for _, c := range []string{"sent", "dropped", "admitted", "goodput"} {
			head = append(head, t+"_"+c)
		}
		for _, r := range denyReasons {
			head = append(head, t+"_denied_"+r)
		}
		for _, c := range []string{"denied_other", "envoy", "upstream_err", "client_timeout", "retries", "p50_ms", "p95_ms", "p99_ms"} {
			head = append(head, t+"_"+c)
		}
	}
	head = append(head, "up_inflight", "up_queued", "up_served", "up_queue_full", "up_queue_timeout", "up_vendor429", "up_failed", "up_cancelled", "up_overloads")
	for r, keys := range series {
		for _, k := range keys {
			head = append(head, fmt.Sprintf("r%d %s", r, k))
		}
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(head); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	line := make([]string, 0, len(head))
	for _, row := range run.Rows {
		line = append(line[:0], strconv.Itoa(row.T), row.Phase)
		for _, t := range run.Tiers {
			tr := row.Tier[t]
			other := 0
			for reason, n := range tr.Denied {
				if !slices.Contains(denyReasons, reason) {
					other += n
				}
			}
			line = append(line, itoa(tr.Sent), itoa(tr.Dropped), itoa(tr.Admitted), itoa(tr.Good))
			for _, r := range denyReasons {
				line = append(line, itoa(tr.Denied[r]))
			}
			line = append(line, itoa(other), itoa(tr.Envoy), itoa(tr.UpstreamErr), itoa(tr.ClientTimeout), itoa(tr.Retries),
				ms(tr.P50.Seconds()), ms(tr.P95.Seconds()), ms(tr.P99.Seconds()))
		}
		u := row.Up
		line = append(line, itoa(row.UpInFlight), itoa(row.UpQueued), utoa(u.Served), utoa(u.QueueFull), utoa(u.QueueTimeout),
			utoa(u.Vendor429), utoa(u.Failed), utoa(u.Cancelled), utoa(u.Overloads()))
		for r, keys := range series {
			for _, k := range keys {
				v, ok := row.Replica[r][k]
				if !ok {
					line = append(line, "")
					continue
				}
				line = append(line, strconv.FormatFloat(v, 'g', 6, 64))
			}
		}
		if err := cw.Write(line); err != nil {
			return fmt.Errorf("write csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}

func itoa(n int) string     { return strconv.Itoa(n) }
func utoa(n uint64) string  { return strconv.FormatUint(n, 10) }
func ms(sec float64) string { return strconv.FormatFloat(sec*1000, 'f', 1, 64) }

// SeriesKeys lists, per replica, every series any of its scrapes held,
// sorted.
func (run *Run) SeriesKeys() [][]string {
	out := make([][]string, len(run.Reps))
	for r, samples := range run.Reps {
		set := map[string]bool{}
		for _, s := range samples {
			for k := range s.Values {
				set[k] = true
			}
		}
		for k := range set {
			out[r] = append(out[r], k)
		}
		slices.Sort(out[r])
	}
	return out
}

// Plot names, each written as <prefix>-<name>.png by WritePlots.
const (
	PlotGoodput  = "goodput"
	PlotP99      = "p99"
	PlotUpstream = "upstream"
	PlotShed     = "shed"
	PlotBreaker  = "breaker"
)

// WritePlots draws run's figures into dir as <prefix>-<plot>.png:
// goodput per tier; goodput p99 per tier; the upstream's in-flight,
// queue and overload answers a second; per replica the shedding level,
// shed fractions and pressure; per replica the breaker state. It returns
// the files' paths.
func WritePlots(dir, prefix string, run *Run) ([]string, error) {
	figs := []struct {
		name, title, y string
		lines          func() []any
	}{
		{PlotGoodput, "Goodput (2xx a second) per tier", "requests/s", func() []any {
			return tierLines(run, func(tr *TierRow) float64 { return float64(tr.Good) })
		}},
		{PlotP99, "Goodput latency p99 per tier", "ms", func() []any {
			return tierLines(run, func(tr *TierRow) float64 { return tr.P99.Seconds() * 1000 })
		}},
		{PlotUpstream, "Upstream: in flight, queued, overload answers a second", "requests", func() []any {
			return []any{
				"in flight", rowLine(run, func(r *Row) float64 { return float64(r.UpInFlight) }),
				"queued", rowLine(run, func(r *Row) float64 { return float64(r.UpQueued) }),
				"overloads/s", rowLine(run, func(r *Row) float64 { return float64(r.Up.Overloads()) }),
				"failed/s", rowLine(run, func(r *Row) float64 { return float64(r.Up.Failed) }),
			}
		}},
		{PlotShed, "Shedding per replica: level, shed fraction, pressure", "value", func() []any {
			return replicaLines(run, func(k string) bool {
				return strings.HasPrefix(k, "tollgate_pressure_level") || strings.HasPrefix(k, "tollgate_control_shed_fraction") ||
					strings.HasPrefix(k, "tollgate_pressure_score")
			})
		}},
		{PlotBreaker, "Breaker state per replica (0 closed, 1 half-open, 2 open)", "state", func() []any {
			return replicaLines(run, func(k string) bool { return strings.HasPrefix(k, "tollgate_breaker_state") })
		}},
	}
	var paths []string
	for _, f := range figs {
		p := plot.New()
		p.Title.Text = prefix + ": " + f.title
		p.X.Label.Text = "s"
		p.Y.Label.Text = f.y
		p.Legend.Top = true
		if lines := f.lines(); len(lines) > 0 {
			if err := plotutil.AddLines(p, lines...); err != nil {
				return paths, fmt.Errorf("plot %s: %w", f.name, err)
			}
		}
		// Phase starts as dashed verticals over the data's range.
		lo, hi := p.Y.Min, p.Y.Max
		for _, m := range run.Phases {
			x := m.At.Sub(run.Start).Seconds()
			l, err := plotter.NewLine(plotter.XYs{{X: x, Y: lo}, {X: x, Y: hi}})
			if err != nil {
				continue
			}
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
			l.Color = color.Gray{Y: 160}
			p.Add(l)
		}
		path := filepath.Join(dir, prefix+"-"+f.name+".png")
		if err := p.Save(10*vg.Inch, 4*vg.Inch, path); err != nil {
			return paths, fmt.Errorf("save %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

func rowLine(run *Run, f func(*Row) float64) plotter.XYs {
	xy := make(plotter.XYs, len(run.Rows))
	for i := range run.Rows {
		xy[i] = plotter.XY{X: float64(run.Rows[i].T), Y: f(&run.Rows[i])}
	}
	return xy
}

func tierLines(run *Run, f func(*TierRow) float64) []any {
	var out []any
	for _, t := range run.Tiers {
		out = append(out, t, rowLine(run, func(r *Row) float64 { return f(r.Tier[t]) }))
	}
	return out
}

// replicaLines is one line per replica and matching series; a second
// without a value is left out, so a missing scrape does not look like a
// state.
func replicaLines(run *Run, match func(string) bool) []any {
	var out []any
	for r, keys := range run.SeriesKeys() {
		for _, k := range keys {
			if !match(k) {
				continue
			}
			var xy plotter.XYs
			for _, row := range run.Rows {
				if v, ok := row.Replica[r][k]; ok {
					xy = append(xy, plotter.XY{X: float64(row.T), Y: v})
				}
			}
			if len(xy) > 0 {
				out = append(out, fmt.Sprintf("r%d %s", r, shortSeries(k)), xy)
			}
		}
	}
	return out
}

// shortSeries drops the tollgate_ prefix and the domain label, which
// every series of one run shares, to keep legends readable.
func shortSeries(k string) string {
	k = strings.TrimPrefix(k, "tollgate_")
	for _, l := range []string{"domain=inference,", ",domain=inference", "domain=inference"} {
		k = strings.Replace(k, l, "", 1)
	}
	return strings.TrimSuffix(k, "{}")
}

// WriteFiles writes run's CSV and plots into dir as <name>.csv and
// <name>-<plot>.png, and returns the plots' paths.
func WriteFiles(dir, name string, run *Run) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, name+".csv")
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	if err := WriteCSV(f, run); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("close %s: %w", path, err)
	}
	if err := writeScrapes(filepath.Join(dir, name+"-scrapes.csv"), run); err != nil {
		return nil, err
	}
	return WritePlots(dir, name, run)
}

// writeScrapes writes every change of a scraped series, at the scrape's
// own time (ms since the run began), per replica: the per-second CSV
// keeps only each second's last scrape, which hides what the laws on
// breaker and shedding timing measure.
func writeScrapes(path string, run *Run) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
	}()
	w := csv.NewWriter(f)
	_ = w.Write([]string{"ms", "replica", "series", "value"})
	for _, m := range run.Phases {
		_ = w.Write([]string{strconv.FormatInt(m.At.Sub(run.Start).Milliseconds(), 10), "", "phase " + m.Name, ""})
	}
	for r, samples := range run.Reps {
		last := map[string]float64{}
		for _, s := range samples {
			if s.Err != nil {
				continue
			}
			keys := slices.Sorted(maps.Keys(s.Values))
			for _, k := range keys {
				if v, ok := last[k]; ok && v == s.Values[k] {
					continue
				}
				last[k] = s.Values[k]
				_ = w.Write([]string{strconv.FormatInt(s.At.Sub(run.Start).Milliseconds(), 10), strconv.Itoa(r), k, strconv.FormatFloat(s.Values[k], 'g', -1, 64)})
			}
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
