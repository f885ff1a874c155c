// Package upstream is issue 13's model upstream: an HTTP server that
// behaves as a GPU-backed model server with real capacity, for the
// closed-loop bench to put behind the gateway.
//
// It serves OpenAI chat completions (JSON, and SSE with usage) from a
// fixed number of slots, each request for a time that grows with its
// tokens and with the batch it runs in, behind a bounded FIFO queue: 503
// when the queue is full, 504 after QueueTimeout of waiting. Modes switch
// at run time to fail a share of requests (a vendor outage) or to answer
// 429 over a rate (a vendor's limit). Stats and GET /stats report what it
// served, per second and per tenant (x-sim-tenant).
//
// It is cheap: it starts no goroutine of its own. A request waits on a
// timer in its own handler goroutine, which net/http already gives it, and
// every decision is made under one mutex in a few operations.
package upstream

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Paths the upstream serves.
const (
	ChatPath  = "/v1/chat/completions"
	StatsPath = "/stats"
	ModePath  = "/mode"
	// TenantHeader names the tenant whose usage a request counts to.
	TenantHeader = "x-sim-tenant"
)

// Upstream is the model server. It is an http.Handler; its methods are
// safe for concurrent use.
type Upstream struct {
	cfg Config

	mu      sync.Mutex
	rng     *rand.Rand
	seq     uint64    // the last response id
	busy    int       // slots taken
	queue   list.List // of *ticket, oldest first
	mode    modeState // the mode and its memory
	totals  Counts    // since New
	byMode  [numKinds]Counts
	tenants map[string]*Usage
	hist    history
}

// New returns an upstream of cfg.
func New(cfg Config) (*Upstream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	now := time.Now()
	return &Upstream{
		cfg:     cfg,
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		mode:    newModeState(Mode{}, now),
		tenants: make(map[string]*Usage),
		hist:    newHistory(cfg.History, now),
	}, nil
}

// Config is the configuration the upstream runs with.
func (u *Upstream) Config() Config { return u.cfg }

// SetMode switches the mode from the next request on. The requests
// already queued or in service are not touched.
func (u *Upstream) SetMode(m Mode) error {
	if err := m.Validate(); err != nil {
		return err
	}
	u.mu.Lock()
	u.mode = newModeState(m, time.Now())
	u.mu.Unlock()
	return nil
}

// Mode is the current mode, its defaults filled in.
func (u *Upstream) Mode() Mode {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mode.Mode
}

// Stats is a snapshot of the upstream's gauges and counters.
func (u *Upstream) Stats() Stats {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	q := u.queue.Len()
	return Stats{
		Time:     now,
		Mode:     u.mode.Mode,
		Slots:    u.cfg.Slots,
		QueueCap: u.cfg.Queue,
		Busy:     u.busy,
		Queued:   q,
		InFlight: u.busy + q,
		Totals:   u.totals,
		ByMode:   cloneCounts(&u.byMode),
		Tenants:  cloneTenants(u.tenants),
		Seconds:  u.hist.snapshot(now),
	}
}

// ServeHTTP serves ChatPath, StatsPath and ModePath.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case ChatPath:
		u.chat(w, r)
	case StatsPath:
		u.serveStats(w, r)
	case ModePath:
		u.serveMode(w, r)
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "Unknown request URL.")
	}
}

// ticket is one chat request's passage through the upstream. While
// queued, elem is its place in the queue; the queue decides it (a slot,
// or a timeout) under the mutex and then closes ready.
type ticket struct {
	kind   Kind
	tenant string
	req    *chatRequest
	enq    time.Time
	elem   *list.Element
	ready  chan struct{}
	state  ticketState
	start  time.Time // when it got its slot
	batch  float64   // the batch factor of its service
	c      completion
}

type ticketState int

const (
	stateQueued ticketState = iota
	stateServing
	stateTimedOut
)

// verdict is what arrive decided.
type verdict int

// arrival is arrive's answer: the verdict, with the status of a Fail
// answer, or the rate and the wait of a 429.
type arrival struct {
	verdict verdict
	status  int
	rate    float64
	wait    time.Duration
}

const (
	vServe verdict = iota
	vQueued
	vQueueFull
	vFail
	v429
)

func (u *Upstream) chat(w http.ResponseWriter, r *http.Request) {
	tenant := tenantKey(r.Header.Get(TenantHeader))
	if r.Method != http.MethodPost {
		u.reject()
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "Use POST.")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, u.cfg.MaxBodyBytes))
	if err != nil {
		u.reject()
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", "The request body is too large.")
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_body", "The request body could not be read.")
		return
	}
	req, err := parseChat(body, &u.cfg)
	if err != nil {
		u.reject()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", err.Error())
		return
	}
	t := &ticket{tenant: tenant, req: &req}
	a := u.arrive(t)
	switch a.verdict {
	case vQueueFull:
		writeError(w, http.StatusServiceUnavailable, "server_error", "queue_full", "The upstream's queue is full.")
		return
	case vFail:
		writeError(w, a.status, "server_error", "", "The upstream failed, on demand.")
		return
	case v429:
		write429(w, a.rate, a.wait)
		return
	case vQueued:
		if !u.await(r.Context(), t) {
			return // cancelled: nobody to answer
		}
		if t.state == stateTimedOut {
			writeError(w, http.StatusGatewayTimeout, "server_error", "queue_timeout", "The request waited too long for a slot.")
			return
		}
	}
	u.serve(r.Context(), w, t)
}

// reject counts a malformed request; it counts to no tenant's usage.
func (u *Upstream) reject() {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.count(now, u.mode.Kind, true, outBadRequest)
}

// count adds one request's outcome to the totals, its mode's and its
// second's counts; arrived says it also arrived now.
func (u *Upstream) count(now time.Time, k Kind, arrived bool, o outcome) {
	if arrived {
		u.received(now, k)
	}
	u.totals.add(o)
	u.byMode[k].add(o)
	u.hist.at(now).add(o)
}

// received counts an arrival.
func (u *Upstream) received(now time.Time, k Kind) {
	u.totals.Received++
	u.byMode[k].Received++
	u.hist.at(now).Received++
}

// arrive decides, as t arrives, whether the mode answers it at once,
// whether it is served now, queued, or refused for a full queue.
func (u *Upstream) arrive(t *ticket) arrival {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	t.kind = u.mode.Kind
	if u.mode.fail() {
		u.count(now, t.kind, true, outFailed)
		return arrival{verdict: vFail, status: u.mode.FailStatus}
	}
	if limited, wait := u.mode.limited(now); limited {
		u.count(now, t.kind, true, outVendor429)
		return arrival{verdict: v429, rate: u.mode.Rate, wait: wait}
	}
	switch {
	case u.busy < u.cfg.Slots && u.queue.Len() == 0:
		u.received(now, t.kind)
		u.startLocked(now, t)
		u.observe(now)
		return arrival{verdict: vServe}
	case u.queue.Len() >= u.cfg.Queue:
		u.count(now, t.kind, true, outQueueFull)
		return arrival{verdict: vQueueFull}
	}
	u.received(now, t.kind)
	t.enq = now
	t.ready = make(chan struct{})
	t.elem = u.queue.PushBack(t)
	u.observe(now)
	return arrival{verdict: vQueued}
}

// startLocked gives t a slot: its batch factor, counting itself, and its
// completion's length.
func (u *Upstream) startLocked(now time.Time, t *ticket) {
	u.busy++
	u.seq++
	t.state = stateServing
	t.start = now
	t.batch = u.cfg.batch(u.busy)
	lo := u.cfg.minCompletion(t.req.maxTokens)
	t.c = completion{id: u.seq, created: now.Unix(), req: t.req, tokens: lo + u.rng.IntN(t.req.maxTokens-lo+1)}
}

// grantLocked hands free slots to the queue's oldest tickets; one that
// has waited past QueueTimeout gets its 504 instead.
func (u *Upstream) grantLocked(now time.Time) {
	for u.busy < u.cfg.Slots && u.queue.Len() > 0 {
		t := u.queue.Remove(u.queue.Front()).(*ticket)
		t.elem = nil
		if now.Sub(t.enq) > u.cfg.QueueTimeout {
			t.state = stateTimedOut
			u.count(now, t.kind, false, outQueueTimeout)
		} else {
			u.startLocked(now, t)
		}
		close(t.ready)
	}
}

// await waits for the queue to decide t. It returns false when the client
// went away first (t is then accounted and out of the queue).
func (u *Upstream) await(ctx context.Context, t *ticket) bool {
	timer := time.NewTimer(u.cfg.QueueTimeout)
	defer timer.Stop()
	select {
	case <-t.ready:
		return true
	case <-timer.C:
		now := time.Now()
		u.mu.Lock()
		if t.elem != nil {
			u.queue.Remove(t.elem)
			t.elem = nil
			t.state = stateTimedOut
			u.count(now, t.kind, false, outQueueTimeout)
			u.observe(now)
		}
		// Out of the queue either way: by itself now, or by grantLocked,
		// which decided it (a slot or a timeout) under the same lock.
		u.mu.Unlock()
		return true
	case <-ctx.Done():
		now := time.Now()
		u.mu.Lock()
		if t.elem != nil {
			u.queue.Remove(t.elem)
			t.elem = nil
			u.cancelLocked(now, t)
			u.observe(now)
			u.mu.Unlock()
			return false
		}
		u.mu.Unlock()
		if t.state == stateServing {
			u.finish(t, outCancelled, 0)
		}
		return false
	}
}

// serve runs t's service in its slot and writes the response, then frees
// the slot.
func (u *Upstream) serve(ctx context.Context, w http.ResponseWriter, t *ticket) {
	prefill := time.Duration(float64(u.cfg.TTFT+time.Duration(t.req.promptTokens)*u.cfg.PerPromptToken) * t.batch)
	perToken := time.Duration(float64(u.cfg.PerToken) * t.batch)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// until waits until offset after the start of service; false when the
	// client went away first.
	until := func(offset time.Duration) bool {
		d := time.Until(t.start.Add(offset))
		if d <= 0 {
			return ctx.Err() == nil
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	c := &t.c
	if !t.req.stream {
		if !until(prefill + time.Duration(c.tokens)*perToken) {
			u.finish(t, outCancelled, 0)
			return
		}
		b := appendJSON(make([]byte, 0, 320+len(tokenText)*c.tokens), c)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(b)))
		if _, err := w.Write(b); err != nil {
			u.finish(t, outCancelled, 0)
			return
		}
		u.finish(t, outServed, c.tokens)
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 512+len(tokenText)*u.cfg.ChunkTokens)
	sent := 0
	for next := 1; ; next = min(next+u.cfg.ChunkTokens, c.tokens) {
		if !until(prefill + time.Duration(next)*perToken) {
			u.finish(t, outCancelled, sent)
			return
		}
		if sent == 0 {
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
		}
		buf = appendChunk(buf[:0], c, sent, next)
		if _, err := w.Write(buf); err != nil {
			u.finish(t, outCancelled, sent)
			return
		}
		if err := rc.Flush(); err != nil {
			u.finish(t, outCancelled, sent)
			return
		}
		sent = next
		if sent == c.tokens {
			u.finish(t, outServed, sent)
			return
		}
	}
}

// finish frees t's slot, hands it to the queue, and accounts how t ended
// with the completion tokens the client got.
func (u *Upstream) finish(t *ticket, o outcome, tokens int) {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.busy--
	if o == outServed {
		u.count(now, t.kind, false, outServed)
		us := u.tenant(t.tenant)
		us.Served++
		us.PromptTokens += int64(t.req.promptTokens)
		us.CompletionTokens += int64(tokens)
	} else {
		u.cancelLocked(now, t)
		us := u.tenant(t.tenant)
		us.CancelledPromptTokens += int64(t.req.promptTokens)
		us.CancelledCompletionTokens += int64(tokens)
	}
	u.grantLocked(now)
	u.observe(now)
}

// cancelLocked counts t as cancelled.
func (u *Upstream) cancelLocked(now time.Time, t *ticket) {
	u.count(now, t.kind, false, outCancelled)
	u.tenant(t.tenant).Cancelled++
}

// tenant is the usage record of key, OtherTenant's past MaxTenants.
func (u *Upstream) tenant(key string) *Usage {
	if us, ok := u.tenants[key]; ok {
		return us
	}
	if len(u.tenants) >= u.cfg.MaxTenants {
		key = OtherTenant
		if us, ok := u.tenants[key]; ok {
			return us
		}
	}
	us := &Usage{}
	u.tenants[key] = us
	return us
}

// observe records the load gauges in now's second.
func (u *Upstream) observe(now time.Time) {
	q := u.queue.Len()
	u.hist.observe(now, u.busy+q, q)
}

func (u *Upstream) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "Use GET.")
		return
	}
	st := u.Stats()
	if v := r.URL.Query().Get("seconds"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_seconds", "seconds must be a non-negative integer.")
			return
		}
		st.Seconds = st.Seconds[max(len(st.Seconds)-n, 0):]
	}
	writeJSON(w, http.StatusOK, st)
}

// maxModeBody bounds a PUT /mode body.
const maxModeBody = 4 << 10

func (u *Upstream) serveMode(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut, http.MethodPost:
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxModeBody))
		dec.DisallowUnknownFields()
		var m Mode
		if err := dec.Decode(&m); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_mode", "The body is not a mode: "+truncate(err.Error(), 200))
			return
		}
		if err := u.SetMode(m); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_mode", "Invalid mode: "+err.Error())
			return
		}
	default:
		w.Header().Set("Allow", "GET, PUT, POST")
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "Use GET, PUT or POST.")
		return
	}
	writeJSON(w, http.StatusOK, u.Mode())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "", "The answer could not be encoded.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// truncate bounds s to n bytes, for error text that may echo input.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
