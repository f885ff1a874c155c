package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/logpace"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
)

const (
	// logEvery paces each kind of store failure log line: the first event
	// after a quiet spell is logged at once, the ones after it together,
	// with their count, at most once per logEvery.
	logEvery = 10 * time.Second
	// beatEvery is how often a replica says it is alive, and reads how
	// many are: a replica that just started is counted by the others
	// within about this long. beatTTL is how long a beat counts: a
	// replica gone is still counted for up to that long, which only makes
	// the others' shares smaller. beatTimeout bounds one beat.
	beatEvery   = 200 * time.Millisecond
	beatTTL     = 5 * time.Second
	beatTimeout = time.Second
	// beatSettle is how long a new replica waits, after its first beat,
	// before it is ready: two beats of every other replica, one of which
	// read it.
	beatSettle = 2 * beatEvery
)

// peerBeater is where replicas count each other (redisstore.Replicas).
type peerBeater interface {
	Beat(ctx context.Context, now time.Time, replica string, ttl time.Duration) (int, error)
}

// storeHealth is what an operator sees of the store's failures: log lines
// (rate-limited: an outage must not write one per decision), /readyz
// detail, and the count of replicas the automatic local share divides a
// limit by. Nothing in it holds a secret: store errors never quote the
// Redis URL's password (redisstore).
type storeHealth struct {
	log      *zap.Logger
	clock    limit.Clock
	policy   limit.StoreFailure
	fraction float64 // --store-failure-local-fraction; 0: automatic
	peers    peerBeater
	name     string // this process on the heartbeat hash
	replicas replicaCount

	mu       sync.Mutex
	state    storeguard.State
	since    time.Time // when the circuit entered state
	cause    string    // the error that last opened it
	opened   logpace.Pace
	closed   logpace.Pace
	degraded logpace.Pace
	byPolicy [4]uint64 // degraded decisions not yet logged, by policy
	recent   recentCounts
	beats    logpace.Pace // failed heartbeats
}

// newStoreHealth returns a storeHealth for a replica named replica (its
// --replica-id or host name); peers is nil for the in-memory store.
func newStoreHealth(log *zap.Logger, f failureFlags, peers peerBeater, replica string) *storeHealth {
	// Two processes on one host share a host name; a beat must count each
	// process once, and a restarted one as new (the old beat then counts
	// until it expires: more replicas, smaller shares, the safe side).
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails
	h := &storeHealth{
		log: log, clock: limit.SystemClock{}, policy: f.parsed, fraction: f.fraction, peers: peers,
		name: replica + "/" + hex.EncodeToString(b),
	}
	for _, p := range []*logpace.Pace{&h.opened, &h.closed, &h.degraded, &h.beats} {
		p.Every = logEvery
	}
	h.since = h.clock.Now()
	h.replicas.n.Store(1)
	return h
}

// circuitChanged is the store circuit's storeguard OnChange.
func (h *storeHealth) circuitChanged(from, to storeguard.State, err error) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	wasOpen := h.state != storeguard.Closed
	openFor := now.Sub(h.since)
	if to == storeguard.Closed || from == storeguard.Closed {
		h.since = now // half-open and open again are one outage
	}
	h.state = to
	switch {
	case to == storeguard.Open && err != nil:
		h.cause = err.Error()
		if from == storeguard.Closed {
			if n, ok := h.opened.Event(now); ok {
				h.log.Warn("store circuit opened: decisions are answered by store_failure until the store answers again",
					zap.Uint64("times", n), zap.String("error", h.cause), zap.Stringer("default_policy", h.policy))
			}
		}
	case to == storeguard.Closed && wasOpen:
		if n, ok := h.closed.Event(now); ok {
			h.log.Info("store circuit closed: decisions come from the store again",
				zap.Uint64("times", n), zap.Duration("open_for", openFor))
		}
	}
}

// degradedDecision notes a decision answered by policy p.
func (h *storeHealth) degradedDecision(p limit.StoreFailure) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recent.add(now, p)
	h.byPolicy[p]++
	if n, ok := h.degraded.Event(now); ok {
		h.logDegraded(n)
	}
}

// logDegraded logs n degraded decisions, by policy. Callers hold mu.
func (h *storeHealth) logDegraded(n uint64) {
	h.log.Warn("degraded decisions: the store could not answer, store_failure did",
		zap.Uint64("decisions", n), zap.Uint64("local", h.byPolicy[limit.FailureLocal]),
		zap.Uint64("deny", h.byPolicy[limit.FailureDeny]), zap.Uint64("allow", h.byPolicy[limit.FailureAllow]))
	h.byPolicy = [4]uint64{}
}

// flush logs the events counted since their kind's last line, once that
// line is logEvery old.
func (h *storeHealth) flush() {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if n, ok := h.opened.Due(now); ok {
		h.log.Warn("store circuit opened again", zap.Uint64("times", n), zap.String("error", h.cause))
	}
	if n, ok := h.closed.Due(now); ok {
		h.log.Info("store circuit closed again", zap.Uint64("times", n))
	}
	if n, ok := h.degraded.Due(now); ok {
		h.logDegraded(n)
	}
	if n, ok := h.beats.Due(now); ok {
		h.log.Warn("heartbeats to the store failed; the replica count stays as last read", zap.Uint64("times", n))
	}
}

// beat says this replica is alive and reads how many are.
func (h *storeHealth) beat(ctx context.Context) error {
	if h.peers == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, beatTimeout)
	defer cancel()
	now := h.clock.Now()
	n, err := h.peers.Beat(ctx, now, h.name, beatTTL)
	if err != nil {
		return err
	}
	h.replicas.observe(n, now)
	return nil
}

// start beats every beatEvery and flushes the log every logEvery until
// ctx ends or stop is called; stop waits for the goroutine.
func (h *storeHealth) start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var beats <-chan time.Time // none without peers to count
		if h.peers != nil {
			t := time.NewTicker(beatEvery)
			defer t.Stop()
			beats = t.C
		}
		flushes := time.NewTicker(logEvery)
		defer flushes.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-beats:
				if err := h.beat(ctx); err != nil && ctx.Err() == nil {
					h.mu.Lock()
					if n, ok := h.beats.Event(h.clock.Now()); ok {
						h.log.Warn("heartbeat to the store failed; the replica count stays as last read",
							zap.Uint64("times", n), zap.Error(err), zap.Int("replicas", h.replicas.get()))
					}
					h.mu.Unlock()
				}
			case <-flushes.C:
				h.flush()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// detail is /readyz's account of the store: the circuit, the degraded
// decisions of the last minute, and what answers when the store cannot.
func (h *storeHealth) detail() string {
	if h.peers == nil {
		return "" // the in-memory store never fails
	}
	now := h.clock.Now()
	h.mu.Lock()
	state, since, cause := h.state, h.since, h.cause
	total, by := h.recent.sum(now)
	h.mu.Unlock()
	var b strings.Builder
	switch state {
	case storeguard.Closed:
		b.WriteString("store circuit: closed")
	default:
		fmt.Fprintf(&b, "store circuit: %s since %s (%v), after: %s", state, since.UTC().Format(time.RFC3339),
			now.Sub(since).Round(time.Millisecond), cause)
	}
	fmt.Fprintf(&b, "\ndegraded decisions in the last minute: %d (local %d, deny %d, allow %d)",
		total, by[limit.FailureLocal], by[limit.FailureDeny], by[limit.FailureAllow])
	fmt.Fprintf(&b, "\nstore_failure default: %s", h.policy)
	n := h.replicas.get()
	switch {
	case h.fraction > 0:
		fmt.Fprintf(&b, "; local rules keep %g of each limit on this replica; %d replicas share the store", h.fraction, n)
	default:
		fmt.Fprintf(&b, "; %d replicas share the store: local rules keep %g/%d of each window limit and 1/%d of each concurrency cap on this replica",
			n, admission.DefaultOvershoot, n, n)
	}
	return b.String()
}

// replicaCount is how many replicas share the store: the most any
// heartbeat read counted within beatTTL, so one that read fewer (a beat
// that raced a new replica's first) does not grow the shares.
type replicaCount struct {
	n      atomic.Int64
	mu     sync.Mutex
	peak   int
	peakAt time.Time
}

func (r *replicaCount) observe(n int, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n >= r.peak || now.Sub(r.peakAt) >= beatTTL {
		r.peak, r.peakAt = n, now
	}
	r.n.Store(int64(max(1, r.peak)))
}

// get is the count in force, at least 1.
func (r *replicaCount) get() int { return int(r.n.Load()) }

// recentCounts counts events by policy in one-second buckets over the
// last minute.
type recentCounts struct {
	sec [60]int64 // the Unix second each bucket counts
	n   [60][4]uint64
}

func (r *recentCounts) add(now time.Time, p limit.StoreFailure) {
	s := now.Unix()
	i := s % 60
	if r.sec[i] != s {
		r.sec[i], r.n[i] = s, [4]uint64{}
	}
	r.n[i][p]++
}

// sum is the events of the 60 seconds up to now.
func (r *recentCounts) sum(now time.Time) (total uint64, by [4]uint64) {
	s := now.Unix()
	for i := range r.sec {
		if s-r.sec[i] < 60 && r.sec[i] <= s {
			for p, c := range r.n[i] {
				by[p] += c
				total += c
			}
		}
	}
	return total, by
}
