package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// numCodes covers the gRPC codes 0..16; anything above counts as Unknown.
const numCodes = 17

// Result is what a run measured. Only calls started after the warmup are
// in it. Latency holds the calls that got an answer (OK, OVER_LIMIT or
// UNKNOWN); failed calls are counted in Errors only, so a fast failure
// cannot flatter the percentiles.
type Result struct {
	Addr    string
	Workers int
	Conns   int
	// Elapsed runs from the end of the warmup to the last call's answer.
	Elapsed   time.Duration
	Requests  int64
	OK        int64
	OverLimit int64
	// Unknown counts answers with overall_code UNKNOWN.
	Unknown int64
	// Errors counts failed calls by gRPC code name.
	Errors  map[string]int64
	Latency *Histogram
	// Redis is what -redis-info measured; nil without it.
	Redis *RedisMemory
	// AllCalls counts every call made, warmup included: the Redis
	// command counts span the warmup too.
	AllCalls int64
	// CPU is the CPU time of the measured run per decision: Redis's with
	// -redis-info, the server's with -server-pid, the load tool's always
	// (nil when Run was not given a meter).
	CPU *CPUUse
}

// ErrorCount is the number of failed calls.
func (r *Result) ErrorCount() int64 {
	var n int64
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// RPS is measured calls per second.
func (r *Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// worker owns everything it writes during the run, so recording takes no
// lock; the runner merges workers after they stop.
type worker struct {
	client rlsv3.RateLimitServiceClient
	req    *rlsv3.RateLimitRequest
	// auth and check are used instead with -api check.
	auth  authv3.AuthorizationClient
	check *authv3.CheckRequest
	// base is used instead with -api redis-baseline.
	base   *baseline
	spread []*rlpb.RateLimitDescriptor_Entry
	rng    *rand.Rand

	hist     Histogram
	ok, over int64
	unknown  int64
	errs     [numCodes]int64
}

type runner struct {
	cfg          Config
	base         context.Context
	measureStart time.Time
	stop         atomic.Bool
	// next is the start time (Unix ns) of the next call when cfg.Rate caps
	// the calls; every phase starts it afresh.
	next atomic.Int64
	// tickets is the number of measured calls left when cfg.Requests > 0.
	tickets atomic.Int64
	// turn is the next round-robin tenant, shared so that the workers
	// together visit each tenant once per cfg.Tenants calls, however
	// their speeds differ.
	turn atomic.Int64
	// all counts every call, warmup included.
	all atomic.Int64
}

// Run drives the load described by cfg until cfg.Duration has passed
// after the warmup, cfg.Requests measured calls have been made, or ctx is
// done, whichever comes first. Calls in flight then finish (each within
// cfg.Timeout) and are counted. The warmup's calls all end before the
// first measured one starts.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	return run(ctx, cfg, nil)
}

// run is Run; atMeasure, when not nil, is called once between the warm-up
// (when there is one), whose calls have all ended by then, and the first
// measured call.
func run(ctx context.Context, cfg Config, atMeasure func()) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Several addresses (replicas) each get cfg.Conns connections; worker
	// i uses connection i mod the total, so the workers spread evenly.
	// The baseline dials Redis instead.
	addrs := cfg.Addrs()
	nconns := cfg.Conns * len(addrs)
	var rdb *redis.Client
	if cfg.API == APIRedisBaseline {
		var err error
		if rdb, err = newBaselineClient(&cfg); err != nil {
			return nil, err
		}
		defer func() { _ = rdb.Close() }()
		nconns = 0
	}
	conns := make([]*grpc.ClientConn, nconns)
	defer func() {
		for _, cc := range conns {
			if cc != nil {
				_ = cc.Close()
			}
		}
	}()
	for i := range conns {
		addr := addrs[i%len(addrs)]
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		cc.Connect()
		conns[i] = cc
	}

	seed := uint64(time.Now().UnixNano())
	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		w := &worker{rng: rand.New(rand.NewPCG(seed, uint64(i)))}
		if len(conns) > 0 {
			w.client = rlsv3.NewRateLimitServiceClient(conns[i%len(conns)])
			w.auth = authv3.NewAuthorizationClient(conns[i%len(conns)])
		}
		w.req, w.spread = buildRequest(&cfg)
		switch cfg.API {
		case APICheck:
			w.check = buildCheck(&cfg, i)
		case APIRedisBaseline:
			w.base = newBaseline(rdb, &cfg)
		}
		workers[i] = w
	}

	r := &runner{cfg: cfg, base: context.WithoutCancel(ctx)}
	r.tickets.Store(cfg.Requests)
	defer context.AfterFunc(ctx, func() { r.stop.Store(true) })()
	phase := func(d time.Duration) {
		if d > 0 {
			t := time.AfterFunc(d, func() { r.stop.Store(true) })
			defer t.Stop()
		}
		r.next.Store(time.Now().UnixNano())
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() { w.run(r) })
		}
		wg.Wait()
	}
	// The warm-up is a phase of its own, whose calls all end before the
	// measured run starts: atMeasure then reads counters that no call is
	// moving, so a figure per decision holds the measured calls' work
	// only.
	if cfg.Warmup > 0 {
		r.measureStart = time.Now().Add(100 * 365 * 24 * time.Hour)
		phase(cfg.Warmup)
		r.stop.Store(ctx.Err() != nil)
	}
	if atMeasure != nil {
		atMeasure()
	}
	r.measureStart = time.Now()
	if !r.stop.Load() {
		phase(cfg.Duration)
	}

	target := cfg.Addr
	if cfg.API == APIRedisBaseline {
		target = cfg.RedisURL
	}
	res := &Result{
		Addr:    target,
		Workers: cfg.Concurrency,
		Conns:   cfg.Conns,
		Elapsed: max(time.Since(r.measureStart), 0),
		Errors:  map[string]int64{},
		Latency: new(Histogram),
	}
	for _, w := range workers {
		res.Latency.Merge(&w.hist)
		res.OK += w.ok
		res.OverLimit += w.over
		res.Unknown += w.unknown
		for c, n := range w.errs {
			if n > 0 {
				res.Errors[codes.Code(c).String()] += n
			}
		}
	}
	res.Requests = res.OK + res.OverLimit + res.Unknown + res.ErrorCount()
	res.AllCalls = r.all.Load()
	return res, nil
}

func (w *worker) run(r *runner) {
	limited := r.cfg.Requests > 0
	for !r.stop.Load() {
		if r.cfg.Rate > 0 && !r.pace() {
			return
		}
		t0 := time.Now()
		measured := !t0.Before(r.measureStart)
		if measured && limited && r.tickets.Add(-1) < 0 {
			r.stop.Store(true)
			return
		}
		w.pickTenant(r)
		ctx, cancel := context.WithTimeout(r.base, r.cfg.Timeout)
		var code rlsv3.RateLimitResponse_Code
		var err error
		switch {
		case w.base != nil:
			err = w.base.call(ctx, w.req)
			code = rlsv3.RateLimitResponse_OK
		case w.check != nil:
			var resp *authv3.CheckResponse
			resp, err = w.auth.Check(ctx, w.check)
			switch {
			case resp.GetOkResponse() != nil:
				code = rlsv3.RateLimitResponse_OK
			case resp.GetDeniedResponse() != nil:
				code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		default:
			var resp *rlsv3.RateLimitResponse
			resp, err = w.client.ShouldRateLimit(ctx, w.req)
			code = resp.GetOverallCode()
		}
		cancel()
		r.all.Add(1)
		lat := time.Since(t0)
		if measured {
			w.record(code, err, lat)
		}
	}
}

// maxLag is how far behind its schedule a rate-capped run may fall before
// the schedule moves up to now: a stall then costs the calls it missed
// rather than a burst to catch up.
const maxLag = 10 * time.Millisecond

// pace waits for the next call's start time under cfg.Rate; false when
// the run stopped meanwhile.
func (r *runner) pace() bool {
	iv := int64(float64(time.Second) / r.cfg.Rate)
	at := r.next.Add(iv) - iv
	now := time.Now().UnixNano()
	if lag := now - at; lag > int64(maxLag) {
		// Behind: start now, and the schedule from here.
		r.next.CompareAndSwap(at+iv, now+iv)
		return !r.stop.Load()
	}
	for wait := time.Duration(at - now); wait > 0; wait = time.Duration(at - time.Now().UnixNano()) {
		if r.stop.Load() {
			return false
		}
		time.Sleep(min(wait, 50*time.Millisecond))
	}
	return !r.stop.Load()
}

func (w *worker) pickTenant(r *runner) {
	cfg := &r.cfg
	if cfg.Tenants == 0 {
		return
	}
	var t int
	if cfg.Spread == SpreadRoundRobin {
		t = int((r.turn.Add(1) - 1) % int64(cfg.Tenants))
	} else {
		t = w.rng.IntN(cfg.Tenants)
	}
	v := "tenant-" + strconv.Itoa(t)
	for _, e := range w.spread {
		e.Value = v
	}
}

func (w *worker) record(code rlsv3.RateLimitResponse_Code, err error, lat time.Duration) {
	if err != nil {
		c := status.Code(err)
		if errors.Is(err, context.DeadlineExceeded) {
			c = codes.DeadlineExceeded
		}
		if int(c) >= numCodes {
			c = codes.Unknown
		}
		w.errs[c]++
		return
	}
	w.hist.Record(lat)
	switch code {
	case rlsv3.RateLimitResponse_OK:
		w.ok++
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		w.over++
	default:
		w.unknown++
	}
}

// buildCheck returns the Check request of worker i: a POST of a chat
// completion of about cfg.BodyBytes bytes, with cfg.APIKey as a bearer
// token and a request ID of its own per worker (the reservation is keyed
// by it; Envoy sends a new one per request, and the server does not need
// them unique to decide).
func buildCheck(cfg *Config, i int) *authv3.CheckRequest {
	const frame = `{"model":"","messages":[{"role":"user","content":""}],"max_tokens":256}`
	prompt := make([]byte, max(0, cfg.BodyBytes-len(frame)-len(cfg.Model)))
	for j := range prompt {
		prompt[j] = 'a' + byte(j%26)
	}
	body := `{"model":"` + cfg.Model + `","messages":[{"role":"user","content":"` + string(prompt) + `"}],"max_tokens":256}`
	headers := map[string]string{"content-type": "application/json", "x-request-id": "load-" + strconv.Itoa(i)}
	if cfg.APIKey != "" {
		headers["authorization"] = "Bearer " + cfg.APIKey
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "load-" + strconv.Itoa(i), Method: "POST", Path: "/v1/chat/completions", Host: "api.example",
			Protocol: "HTTP/1.1", Headers: headers, Body: body, Size: int64(len(body)),
		}},
	}}
}

// buildRequest returns a request for cfg and the entries whose values
// the tenant spread replaces. Each worker owns one and reuses it: the
// call has marshalled it by the time it returns.
func buildRequest(cfg *Config) (*rlsv3.RateLimitRequest, []*rlpb.RateLimitDescriptor_Entry) {
	req := &rlsv3.RateLimitRequest{Domain: cfg.Domain, HitsAddend: cfg.Hits}
	var spread []*rlpb.RateLimitDescriptor_Entry
	for _, d := range cfg.Descriptors {
		pd := &rlpb.RateLimitDescriptor{}
		for _, e := range d {
			pe := &rlpb.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
			if cfg.Tenants > 0 && cfg.isSpreadKey(e.Key) {
				spread = append(spread, pe)
			}
			pd.Entries = append(pd.Entries, pe)
		}
		req.Descriptors = append(req.Descriptors, pd)
	}
	return req, spread
}
