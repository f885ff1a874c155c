package pressure

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of OutcomeConfig.
const (
	DefaultOutcomeInterval = 10 * time.Second
	DefaultMaxErrorRate    = 0.2
	DefaultMaxOverloadRate = 0.1
	DefaultMinSamples      = 20
	DefaultMaxModels       = 100
)

// Kind is what one finished request tells pressure: the access log's
// outcome classes (docs/outcome-classes.md) as the signals count them.
type Kind uint8

// The kinds.
const (
	// Served is any outcome that is neither Failed nor Overloaded: a
	// success, or one that says nothing of the upstream's health. It
	// counts toward the samples and the latency only.
	Served Kind = iota
	// Failed is the upstream failing (the breaker class failure): the
	// error signal counts it.
	Failed
	// Overloaded is the upstream, or Envoy in front of it, turning work
	// away for want of capacity (the class overload): the overload signal
	// counts it.
	Overloaded
)

// The sliding interval is a ring of outcomeSlots sub-intervals, each a
// histogram of latencyBuckets linear buckets of SLA/latencyPerSLA each
// over [0, 2 x SLA), plus one bucket for 2 x SLA and over. The buckets
// are relative to the SLA because the score only needs p95 between 1 and
// 2 x SLA: there it resolves 1/32 of the score in 65 counters, where
// log-linear buckets would need hundreds for the same precision.
const (
	outcomeSlots   = 10
	latencyPerSLA  = 32
	latencyBuckets = 2*latencyPerSLA + 1
)

// OutcomeConfig configures an Outcomes recorder.
type OutcomeConfig struct {
	// Interval is the sliding interval the signals read (Optional,
	// default 10s, at least 10ms). It moves in tenths: a reading covers
	// the current tenth, partly elapsed, and the nine before it. Short
	// enough that the score follows the upstream's recovery rather than
	// the age of the last errors.
	Interval time.Duration
	// SLA is the p95 upstream latency the service promises (Required, at
	// least 1ms). The latency signal scores 0 while the p95 is at or
	// under it, 1 from 2 x SLA on, and linearly between.
	SLA time.Duration
	// MaxErrorRate is the error rate that scores 1 (Optional, default
	// 0.2, in (0,1]); the error signal scores rate / MaxErrorRate.
	MaxErrorRate float64
	// MaxOverloadRate is the overload rate that scores 1 (Optional,
	// default 0.1, in (0,1]); the overload signal scores rate /
	// MaxOverloadRate.
	MaxOverloadRate float64
	// MinSamples damps the signals of a thin interval (Optional, default
	// 20; negative: 0): the error and overload rates are events /
	// max(samples, MinSamples), and the latency score is scaled by
	// min(1, samples / MinSamples). So a few slow or failed requests in
	// a quiet interval shed little, and, as shedding cuts the traffic a
	// scope sees, the score cannot rise for want of samples: it follows
	// the events, not their ratio to a handful of requests.
	MinSamples int
	// MaxModels caps the models Model registers (Optional, default 100).
	// Each costs about 5 KiB.
	MaxModels int
}

// Outcomes records the outcomes of finished requests (from the access
// log) over a sliding interval, and scores their latency, error rate and
// overload rate as Signals: one set for all requests, and one per
// registered model.
//
// Observe is O(1), allocates nothing and takes no lock except once per
// tenth of the interval per scope, to recycle a sub-interval; counters
// are atomic. A few outcomes racing that recycling may land in the next
// sub-interval: the readings are approximate at sub-interval edges.
type Outcomes struct {
	cfg    OutcomeConfig
	sub    int64 // sub-interval, in nanoseconds
	global *OutcomeWindow

	mu     sync.Mutex                                // serialises Model's registrations
	models atomic.Pointer[map[string]*OutcomeWindow] // copied on write: Observe reads without a lock
}

// NewOutcomes checks cfg and returns an empty recorder.
func NewOutcomes(cfg OutcomeConfig) (*Outcomes, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultOutcomeInterval
	}
	if cfg.MaxErrorRate == 0 {
		cfg.MaxErrorRate = DefaultMaxErrorRate
	}
	if cfg.MaxOverloadRate == 0 {
		cfg.MaxOverloadRate = DefaultMaxOverloadRate
	}
	if cfg.MinSamples == 0 {
		cfg.MinSamples = DefaultMinSamples
	}
	cfg.MinSamples = max(cfg.MinSamples, 0)
	if cfg.MaxModels == 0 {
		cfg.MaxModels = DefaultMaxModels
	}
	var errs []error
	if cfg.Interval < outcomeSlots*time.Millisecond {
		errs = append(errs, fmt.Errorf("outcomes: interval %v is under %v", cfg.Interval, outcomeSlots*time.Millisecond))
	}
	if cfg.SLA < time.Millisecond {
		errs = append(errs, fmt.Errorf("outcomes: sla %v is under 1ms", cfg.SLA))
	}
	if !(cfg.MaxErrorRate > 0 && cfg.MaxErrorRate <= 1) { // rejects NaN
		errs = append(errs, fmt.Errorf("outcomes: max error rate %v is not in (0,1]", cfg.MaxErrorRate))
	}
	if !(cfg.MaxOverloadRate > 0 && cfg.MaxOverloadRate <= 1) {
		errs = append(errs, fmt.Errorf("outcomes: max overload rate %v is not in (0,1]", cfg.MaxOverloadRate))
	}
	if cfg.MaxModels < 0 {
		errs = append(errs, fmt.Errorf("outcomes: max models %d is negative", cfg.MaxModels))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	o := &Outcomes{cfg: cfg, sub: int64(cfg.Interval / outcomeSlots)}
	o.global = o.newWindow("")
	o.models.Store(&map[string]*OutcomeWindow{})
	return o, nil
}

// Observe records one finished request at now: its kind (the caller
// classifies it: only the upstream's failures are Failed, and answers of
// a busy upstream are Overloaded, not Failed), its duration and its
// model ("" for none). The outcome counts toward the global scope, and
// toward its model's if Model registered it.
func (o *Outcomes) Observe(now time.Time, kind Kind, duration time.Duration, model string) {
	idx := now.UnixNano() / o.sub
	b := o.bucket(duration)
	o.global.add(idx, b, kind)
	if model == "" {
		return
	}
	if w := (*o.models.Load())[model]; w != nil {
		w.add(idx, b, kind)
	}
}

// bucket returns the histogram bucket of d.
func (o *Outcomes) bucket(d time.Duration) int {
	sla := int64(o.cfg.SLA)
	switch n := int64(d); {
	case n <= 0:
		return 0
	case n >= 2*sla:
		return latencyBuckets - 1
	default:
		return int(n * latencyPerSLA / sla) // n*32 < 64*sla: no overflow
	}
}

// Global returns the window of every outcome.
func (o *Outcomes) Global() *OutcomeWindow { return o.global }

// Model registers model, if it is not yet, and returns its window. The
// set of models is fixed by configuration rather than learnt from
// traffic, so that clients cannot fill it with made-up names; it fails
// past MaxModels.
func (o *Outcomes) Model(model string) (*OutcomeWindow, error) {
	if model == "" {
		return nil, errors.New("outcomes: empty model name")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	cur := *o.models.Load()
	if w := cur[model]; w != nil {
		return w, nil
	}
	if len(cur) >= o.cfg.MaxModels {
		return nil, fmt.Errorf("outcomes: model %q: already tracking max models %d", model, o.cfg.MaxModels)
	}
	next := maps.Clone(cur)
	w := o.newWindow(model)
	next[model] = w
	o.models.Store(&next)
	return w, nil
}

func (o *Outcomes) newWindow(model string) *OutcomeWindow {
	w := &OutcomeWindow{o: o, model: model}
	for i := range w.slots {
		w.slots[i].epoch.Store(noEpoch)
	}
	return w
}

// OutcomeWindow is one scope's sliding interval of outcomes.
type OutcomeWindow struct {
	o     *Outcomes
	model string
	mu    sync.Mutex // serialises the recycling of a slot
	slots [outcomeSlots]outcomeSlot
}

// noEpoch marks a slot that never held a sub-interval.
const noEpoch = math.MinInt64

// outcomeSlot is one sub-interval.
type outcomeSlot struct {
	epoch     atomic.Int64 // the sub-interval held (unix nanoseconds / sub), or noEpoch
	errors    atomic.Uint64
	overloads atomic.Uint64
	buckets   [latencyBuckets]atomic.Uint64
}

func (w *OutcomeWindow) add(idx int64, bucket int, kind Kind) {
	s := &w.slots[uint64(idx)%outcomeSlots] // uint64: before 1970 too
	if e := s.epoch.Load(); e != idx && !w.recycle(s, idx) {
		return
	}
	s.buckets[bucket].Add(1)
	switch kind {
	case Failed:
		s.errors.Add(1)
	case Overloaded:
		s.overloads.Add(1)
	}
}

// recycle makes s hold sub-interval idx, clearing an older one. It
// reports false when s already holds a later sub-interval: the outcome is
// older than the interval and is dropped.
func (w *OutcomeWindow) recycle(s *outcomeSlot, idx int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch e := s.epoch.Load(); {
	case e == idx:
		return true
	case e > idx:
		return false
	}
	s.errors.Store(0)
	s.overloads.Store(0)
	for i := range s.buckets {
		s.buckets[i].Store(0)
	}
	s.epoch.Store(idx)
	return true
}

// OutcomeStats is a window's reading.
type OutcomeStats struct {
	// Count is the outcomes in the interval; Errors are those that
	// failed, Overloads those turned away for want of capacity.
	Count, Errors, Overloads uint64
	// P95 is the 95th percentile duration, rounded down to a 32nd of
	// the SLA; 2 x SLA stands for anything from there on.
	P95 time.Duration
}

// Stats reads the interval ending at now.
func (w *OutcomeWindow) Stats(now time.Time) OutcomeStats {
	r := w.read(now)
	return OutcomeStats{
		Count:     r.count,
		Errors:    r.errors,
		Overloads: r.overloads,
		P95:       time.Duration(int64(r.p95) * int64(w.o.cfg.SLA) / latencyPerSLA),
	}
}

// outcomeReading is a window's interval, with its p95 as a bucket.
type outcomeReading struct {
	count, errors, overloads uint64
	p95                      int
}

func (w *OutcomeWindow) read(now time.Time) outcomeReading {
	var hist [latencyBuckets]uint64
	var r outcomeReading
	idx := now.UnixNano() / w.o.sub
	for i := range w.slots {
		s := &w.slots[i]
		if e := s.epoch.Load(); e <= idx-outcomeSlots || e > idx {
			continue
		}
		r.errors += s.errors.Load()
		r.overloads += s.overloads.Load()
		for b := range s.buckets {
			n := s.buckets[b].Load()
			hist[b] += n
			r.count += n
		}
	}
	// A reading racing a recycle may see an event without its bucket.
	r.errors = min(r.errors, r.count)
	r.overloads = min(r.overloads, r.count)
	r.p95 = p95Bucket(&hist, r.count)
	return r
}

// rate is n events of r as a damped rate: n / max(samples, MinSamples),
// so that fewer samples never make the same events weigh more than
// MinSamples samples would.
func (w *OutcomeWindow) rate(r outcomeReading, n uint64) float64 {
	d := max(r.count, uint64(w.o.cfg.MinSamples))
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

// p95Bucket returns the bucket of the nearest-rank 95th percentile.
func p95Bucket(hist *[latencyBuckets]uint64, count uint64) int {
	rank := (95*count + 99) / 100
	var seen uint64
	for b, n := range hist {
		if seen += n; seen >= rank && seen > 0 {
			return b
		}
	}
	return 0
}

// Model returns the window's model, "" for the global one.
func (w *OutcomeWindow) Model() string { return w.model }

// Latency returns the signal of the p95 duration against the SLA:
// clamp(p95/SLA - 1, 0, 1), in steps of 1/32, times min(1, samples /
// MinSamples).
func (w *OutcomeWindow) Latency() Signal { return latencySignal{w} }

// ErrorRate returns the signal of the failure rate: clamp(errors /
// max(samples, MinSamples) / MaxErrorRate, 0, 1).
func (w *OutcomeWindow) ErrorRate() Signal { return errorSignal{w} }

// OverloadRate returns the signal of the overload rate: clamp(overloads
// / max(samples, MinSamples) / MaxOverloadRate, 0, 1).
func (w *OutcomeWindow) OverloadRate() Signal { return overloadSignal{w} }

// Signals returns the window's three signals.
func (w *OutcomeWindow) Signals() Signals {
	return Signals{w.Latency(), w.ErrorRate(), w.OverloadRate()}
}

type latencySignal struct{ w *OutcomeWindow }

var _ Signal = latencySignal{}

func (l latencySignal) Score(now time.Time) float64 {
	r := l.w.read(now)
	if r.count == 0 {
		return 0
	}
	s := min(max(float64(r.p95-latencyPerSLA)/latencyPerSLA, 0), 1)
	if m := uint64(l.w.o.cfg.MinSamples); r.count < m {
		s *= float64(r.count) / float64(m)
	}
	return s
}

type errorSignal struct{ w *OutcomeWindow }

var _ Signal = errorSignal{}

func (e errorSignal) Score(now time.Time) float64 {
	r := e.w.read(now)
	return min(e.w.rate(r, r.errors)/e.w.o.cfg.MaxErrorRate, 1)
}

type overloadSignal struct{ w *OutcomeWindow }

var _ Signal = overloadSignal{}

func (o overloadSignal) Score(now time.Time) float64 {
	r := o.w.read(now)
	return min(o.w.rate(r, r.overloads)/o.w.o.cfg.MaxOverloadRate, 1)
}
