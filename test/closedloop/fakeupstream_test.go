package closedloop

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// fakeUpstream is the bench's own minimal model server, for its tests
// until test/closedloop/upstream is merged: slots and a bounded queue,
// 503 when the queue is full, 504 after QueueTimeout in it, a fixed
// service time, OpenAI JSON or SSE with usage, and the Fail mode. It is
// not the upstream (no batching, no token-dependent time).
type fakeUpstream struct {
	cfg     UpstreamConfig
	service time.Duration
	srv     *httptest.Server
	slots   chan struct{}

	mode                                                          atomic.Pointer[UpstreamMode]
	waiting, inFlight                                             atomic.Int64
	served, queueFull, queueTimeout, vendor429, failed, cancelled atomic.Uint64

	mu    sync.Mutex
	usage map[string]int64
	rng   *rand.Rand
}

var _ Upstream = (*fakeUpstream)(nil)

func newFakeUpstream(cfg UpstreamConfig, service time.Duration) *fakeUpstream {
	u := &fakeUpstream{cfg: cfg, service: service, slots: make(chan struct{}, max(cfg.Slots, 1)),
		usage: map[string]int64{}, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 1))}
	u.mode.Store(&UpstreamMode{})
	return u
}

func (u *fakeUpstream) Start() (string, error) {
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	return u.srv.URL, nil
}

func (u *fakeUpstream) Close() {
	if u.srv != nil {
		u.srv.Close()
	}
}

func (u *fakeUpstream) SetMode(m UpstreamMode) { u.mode.Store(&m) }

func (u *fakeUpstream) Stats() UpstreamStats {
	u.mu.Lock()
	usage := make(map[string]int64, len(u.usage))
	for k, v := range u.usage {
		usage[k] = v
	}
	u.mu.Unlock()
	return UpstreamStats{Served: u.served.Load(), QueueFull: u.queueFull.Load(), QueueTimeout: u.queueTimeout.Load(),
		Vendor429: u.vendor429.Load(), Failed: u.failed.Load(), Cancelled: u.cancelled.Load(),
		InFlight: int(u.inFlight.Load()), Queued: int(u.waiting.Load()), Usage: usage}
}

func (u *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	var body chatBody
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(data, &body) != nil || len(body.Messages) == 0 {
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		return
	}
	if m := u.mode.Load(); m.Kind == UpstreamFail {
		u.mu.Lock()
		fail := u.rng.Float64() < m.FailFraction
		u.mu.Unlock()
		if fail {
			u.failed.Add(1)
			http.Error(w, `{"error":"internal"}`, m.FailStatus)
			return
		}
	}
	if u.waiting.Add(1) > int64(u.cfg.Queue) {
		u.waiting.Add(-1)
		u.queueFull.Add(1)
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
		return
	}
	timer := time.NewTimer(u.cfg.QueueTimeout)
	defer timer.Stop()
	select {
	case u.slots <- struct{}{}:
		u.waiting.Add(-1)
	case <-timer.C:
		u.waiting.Add(-1)
		u.queueTimeout.Add(1)
		http.Error(w, `{"error":"timeout"}`, http.StatusGatewayTimeout)
		return
	case <-r.Context().Done():
		u.waiting.Add(-1)
		u.cancelled.Add(1)
		return
	}
	u.inFlight.Add(1)
	defer func() { u.inFlight.Add(-1); <-u.slots }()
	work := time.NewTimer(u.service)
	defer work.Stop()
	select {
	case <-work.C:
	case <-r.Context().Done():
		u.cancelled.Add(1)
		return
	}
	prompt := int64(len(body.Messages[0].Content)/4) + 1
	completion := int64(body.MaxTokens / 2)
	u.mu.Lock()
	u.usage[r.Header.Get("X-Sim-Tenant")] += prompt + completion
	u.mu.Unlock()
	u.served.Add(1)
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
	if body.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":%s}`, usage)
}
