package outage

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	// httpTimeout bounds one /readyz or /metrics request.
	httpTimeout = time.Second
	// readyPoll is how often /readyz is asked during a run.
	readyPoll = 50 * time.Millisecond
)

// readyz asks /readyz once and returns its status code.
func readyz(ctx context.Context, adminAddr string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, httpTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/readyz", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// metric reads one sample from /metrics: the first series of name whose
// labels include every one of labels (`key="value"`). ok is false when
// there is none.
func metric(t *testing.T, adminAddr, name string, labels ...string) (v float64, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), httpTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("scrape /metrics: %v", err)
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, found := strings.CutPrefix(line, name)
		if !found || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		series, value, found := strings.Cut(rest, " ")
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			series, value = rest[:end+1], strings.TrimSpace(rest[end+1:])
		} else if !found {
			continue
		}
		if !all(labels, func(l string) bool { return strings.Contains(series, l) }) {
			continue
		}
		if f, err := strconv.ParseFloat(strings.Fields(value)[0], 64); err == nil {
			return f, true
		}
	}
	return 0, false
}

func all[T any](s []T, f func(T) bool) bool {
	return !slices.ContainsFunc(s, func(x T) bool { return !f(x) })
}

// answer is one ShouldRateLimit call as the client saw it.
type answer struct {
	tenant     string
	send, recv time.Duration // since the run began
	code       rlsv3.RateLimitResponse_Code
	degraded   bool // x-tollgate-degraded: store
	err        error
}

func (a answer) latency() time.Duration { return a.recv - a.send }

// driver sends ShouldRateLimit from workers goroutines, each at most once
// every pace, for one tenant at a time, and records every answer.
type driver struct {
	start  time.Time
	client rlsv3.RateLimitServiceClient
	tenant atomic.Pointer[string]
	stop   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	answers []answer
	// stalls are how late the jitter goroutine woke from each sleep of
	// jitterSleep, by when it woke: how long this process waited for a
	// CPU, a measure of how busy the machine was at that time.
	stalls []stall
	// watchFrom, when watching, is the send time from which the first
	// answer that is not degraded is sent to healthy.
	watching  bool
	watchFrom time.Duration
	healthy   chan answer
}

// startDriver starts the workers on tenant; they stop at Stop or when the
// test ends.
func startDriver(t *testing.T, grpcAddr, tenant string, workers int, pace time.Duration) *driver {
	t.Helper()
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", grpcAddr, err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	d := &driver{
		start:   time.Now(),
		client:  rlsv3.NewRateLimitServiceClient(cc),
		stop:    make(chan struct{}),
		answers: make([]answer, 0, 16<<10),
		healthy: make(chan answer, 1),
	}
	d.tenant.Store(&tenant)
	ctx := t.Context()
	for range workers {
		d.wg.Go(func() {
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for {
				d.call(ctx)
				select {
				case <-d.stop:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	d.wg.Go(func() {
		for {
			start := time.Now()
			select {
			case <-d.stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(jitterSleep):
			}
			late := time.Since(start) - jitterSleep
			d.mu.Lock()
			d.stalls = append(d.stalls, stall{at: d.now(), late: late})
			d.mu.Unlock()
		}
	})
	t.Cleanup(d.Stop)
	return d
}

// jitterSleep is how long the jitter goroutine sleeps between readings.
const jitterSleep = 5 * time.Millisecond

type stall struct {
	at, late time.Duration
}

// calm returns the answers to calls during which this process never woke
// more than stallLimit late: calls the machine did not visibly starve. A
// wake-up late by l at time a means the process got no CPU for at least
// l, some time in [a-l-jitterSleep, a].
func (d *driver) calm(as []answer, stallLimit time.Duration) []answer {
	d.mu.Lock()
	var stalls [][2]time.Duration
	for _, s := range d.stalls {
		if s.late > stallLimit {
			stalls = append(stalls, [2]time.Duration{s.at - s.late - jitterSleep, s.at})
		}
	}
	d.mu.Unlock()
	var out []answer
	for _, a := range as {
		if !slices.ContainsFunc(stalls, func(s [2]time.Duration) bool { return s[0] < a.recv && a.send < s[1] }) {
			out = append(out, a)
		}
	}
	return out
}

// starved is how long this process was visibly starved during a's call:
// the sum of how late the jitter goroutine woke, over the wake-ups late by
// more than stallLimit whose sleep overlapped the call. Two processes on
// the same two cores mostly starve together, so this is what the machine,
// not tollgate, added to the call's latency. Smaller delays are not
// counted: a long call overlaps many wake-ups, each a little late.
func (d *driver) starved(a answer, stallLimit time.Duration) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum time.Duration
	for _, s := range d.stalls {
		if s.late > stallLimit && s.at-s.late-jitterSleep < a.recv && a.send < s.at {
			sum += s.late
		}
	}
	return sum
}

// now is the time since the run began, on the answers' clock.
func (d *driver) now() time.Duration { return time.Since(d.start) }

// setTenant makes the next calls use tenant, whose counters are fresh.
func (d *driver) setTenant(tenant string) { d.tenant.Store(&tenant) }

func (d *driver) call(ctx context.Context) {
	tenant := *d.tenant.Load()
	req := &rlsv3.RateLimitRequest{
		Domain: domain,
		Descriptors: []*rlpb.RateLimitDescriptor{{
			Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}},
		}},
	}
	a := answer{tenant: tenant, send: d.now()}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	resp, err := d.client.ShouldRateLimit(cctx, req)
	cancel()
	a.recv = d.now()
	if ctx.Err() != nil {
		return // the test is over; not an answer
	}
	a.err = err
	a.code = resp.GetOverallCode()
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == degradedHeader && h.GetValue() == degradedValue {
			a.degraded = true
		}
	}
	d.mu.Lock()
	d.answers = append(d.answers, a)
	if d.watching && err == nil && !a.degraded && a.send >= d.watchFrom {
		d.watching = false
		d.healthy <- a
	}
	d.mu.Unlock()
}

// waitHealthy waits, at most bound, for the first answer sent at or after
// from that is not degraded.
func (d *driver) waitHealthy(from, bound time.Duration) (answer, bool) {
	d.mu.Lock()
	d.watching, d.watchFrom = true, from
	d.mu.Unlock()
	select {
	case a := <-d.healthy:
		return a, true
	case <-time.After(bound):
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.watching = false
	select {
	case a := <-d.healthy: // came in just now
		return a, true
	default:
		return answer{}, false
	}
}

// Stop stops the workers and waits for their last calls.
func (d *driver) Stop() {
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	d.wg.Wait()
}

// between returns the answers to calls sent in [from, to).
func (d *driver) between(from, to time.Duration) []answer {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []answer
	for _, a := range d.answers {
		if a.send >= from && a.send < to {
			out = append(out, a)
		}
	}
	return out
}

// readiness polls /readyz every readyPoll and records what it answered.
type readiness struct {
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu    sync.Mutex
	polls []poll
}

type poll struct {
	at   time.Duration // when the answer came, on the driver's clock
	code int           // 0 when the request failed
}

func pollReadiness(t *testing.T, adminAddr string, start time.Time) *readiness {
	r := &readiness{start: start, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(readyPoll)
		defer tick.Stop()
		for {
			code, _ := readyz(t.Context(), adminAddr)
			r.mu.Lock()
			r.polls = append(r.polls, poll{at: time.Since(r.start), code: code})
			r.mu.Unlock()
			select {
			case <-r.stop:
				return
			case <-t.Context().Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(r.Stop)
	return r
}

func (r *readiness) Stop() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// between counts the polls in [from, to): all of them, those /readyz
// answered (in httpTimeout), and those it answered 200.
func (r *readiness) between(from, to time.Duration) (polls, answered, ready int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.polls {
		if p.at < from || p.at >= to {
			continue
		}
		polls++
		if p.code != 0 {
			answered++
		}
		if p.code == http.StatusOK {
			ready++
		}
	}
	return polls, answered, ready
}

// latencies are the p50, p99 and max of the answers' latencies.
type latencies struct {
	n             int
	p50, p99, max time.Duration
}

func latenciesOf(as []answer) latencies {
	ds := make([]time.Duration, len(as))
	for i, a := range as {
		ds[i] = a.latency()
	}
	slices.Sort(ds)
	l := latencies{n: len(ds)}
	if len(ds) == 0 {
		return l
	}
	at := func(q float64) time.Duration { return ds[max(0, int(math.Ceil(q*float64(len(ds))))-1)] }
	l.p50, l.p99, l.max = at(0.50), at(0.99), ds[len(ds)-1]
	return l
}

func (l latencies) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("%d calls, p50 %v, p99 %v, max %v", l.n, r(l.p50), r(l.p99), r(l.max))
}
