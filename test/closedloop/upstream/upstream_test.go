package upstream

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestQueue runs requests that all arrive at once, in order, through a
// small upstream, and checks each one's answer and when it came: a slot,
// a FIFO wait, 503 at once when the queue is full, 504 at QueueTimeout.
func TestQueue(t *testing.T) {
	t.Parallel()
	type want struct {
		status int
		at     time.Duration
		id     int // the response id's number: ids go by slot grant order
	}
	tests := []struct {
		name      string
		edit      func(*Config)
		give      int // requests, arriving at 0 in this order
		want      []want
		wantTotal Counts
		wantMax   int // the most in flight seen
	}{
		{
			name: "a full queue answers 503 at once",
			edit: func(c *Config) { fixed(100 * time.Millisecond)(c); c.Slots, c.Queue = 1, 2 },
			give: 4,
			want: []want{
				{200, 100 * time.Millisecond, 1}, {200, 200 * time.Millisecond, 2},
				{200, 300 * time.Millisecond, 3}, {503, 0, 0},
			},
			wantTotal: Counts{Received: 4, Served: 3, QueueFull: 1},
			wantMax:   3,
		},
		{
			name: "a wait of QueueTimeout answers 504",
			edit: func(c *Config) { fixed(300 * time.Millisecond)(c); c.Slots, c.Queue = 1, 10 },
			give: 4,
			want: []want{
				{200, 300 * time.Millisecond, 1}, {200, 600 * time.Millisecond, 2},
				{504, 500 * time.Millisecond, 0}, {504, 500 * time.Millisecond, 0},
			},
			wantTotal: Counts{Received: 4, Served: 2, QueueTimeout: 2},
			wantMax:   4,
		},
		{
			name: "slots are granted first in first out",
			edit: func(c *Config) { fixed(100 * time.Millisecond)(c); c.Slots, c.Queue = 2, 10 },
			give: 7,
			want: []want{
				{200, 100 * time.Millisecond, 1}, {200, 100 * time.Millisecond, 2},
				{200, 200 * time.Millisecond, 3}, {200, 200 * time.Millisecond, 4},
				{200, 300 * time.Millisecond, 5}, {200, 300 * time.Millisecond, 6},
				{200, 400 * time.Millisecond, 7},
			},
			wantTotal: Counts{Received: 7, Served: 7},
			wantMax:   7,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, tt.edit)
				start := time.Now()
				recs := make([]*recorder, tt.give)
				var wg sync.WaitGroup
				for i := range tt.give {
					wg.Go(func() { recs[i] = send(t.Context(), u, ChatBody("m", 8, 4, false), "") })
					synctest.Wait() // it is queued, or served, before the next arrives
				}
				wg.Wait()
				for i, w := range tt.want {
					r := recs[i]
					if r.status != w.status || r.done.Sub(start) != w.at {
						t.Errorf("request %d: got %d at %v, want %d at %v", i, r.status, r.done.Sub(start), w.status, w.at)
					}
					if w.status == http.StatusOK {
						if got := decodeJSON(t, r.body()).ID; got != fmt.Sprintf("chatcmpl-sim-%d", w.id) {
							t.Errorf("request %d: id %s, want chatcmpl-sim-%d", i, got, w.id)
						}
						continue
					}
					wantCode := map[int]string{503: "queue_full", 504: "queue_timeout"}[w.status]
					if got := errorCode(t, r.body()); got != wantCode {
						t.Errorf("request %d: code %q, want %q", i, got, wantCode)
					}
				}
				st := u.Stats()
				if st.Totals != tt.wantTotal || st.ByMode["normal"] != tt.wantTotal {
					t.Errorf("totals %+v, by mode %+v, want %+v", st.Totals, st.ByMode["normal"], tt.wantTotal)
				}
				if st.Busy != 0 || st.Queued != 0 || st.InFlight != 0 {
					t.Errorf("after the run: busy %d, queued %d, in flight %d, want 0", st.Busy, st.Queued, st.InFlight)
				}
				if got := st.Seconds[0].MaxInFlight; got != tt.wantMax {
					t.Errorf("max in flight %d, want %d", got, tt.wantMax)
				}
			})
		})
	}
}

// TestServiceTime checks a request's service time: prefill, per output
// token, times the batch factor of the slots taken when it got its own.
func TestServiceTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give int // requests at once; the last one is timed
	}{
		{name: "alone", give: 1},
		{name: "third of a batch", give: 3},
		{name: "full batch", give: 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, nil)
				start := time.Now()
				recs := make([]*recorder, tt.give)
				var wg sync.WaitGroup
				for i := range tt.give {
					wg.Go(func() { recs[i] = send(t.Context(), u, ChatBody("m", MixPromptChars, MixMaxTokens, false), "") })
					synctest.Wait()
				}
				wg.Wait()
				r := recs[tt.give-1]
				resp := decodeJSON(t, r.body())
				if resp.Usage == nil || resp.Usage.PromptTokens != 100 {
					t.Fatalf("usage %+v, want 100 prompt tokens", resp.Usage)
				}
				batch := 1 + 0.5*float64(tt.give)/32
				want := batch * (40e-3 + 100*0.2e-3 + float64(resp.Usage.CompletionTokens)*3.05e-3)
				if got := r.done.Sub(start).Seconds(); math.Abs(got-want) > 1e-6 {
					t.Errorf("service %.6fs for %d tokens, want %.6fs", got, resp.Usage.CompletionTokens, want)
				}
			})
		})
	}
}

// TestCapacity measures, on the bubble's clock, what DefaultConfig serves
// of the default mix at saturation: 72 clients, each sending its next
// request as its last ends, keep every slot busy and about 40 waiting,
// under the queue's bound and its timeout.
func TestCapacity(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		u := newUpstream(t, nil)
		const clients, warm, measure = 72, 5, 20 // seconds
		start := time.Now()
		end := start.Add((warm + measure) * time.Second)
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for time.Now().Before(end) {
					if r := send(t.Context(), u, ChatBody("m", MixPromptChars, MixMaxTokens, false), ""); r.status != http.StatusOK {
						t.Errorf("status %d at %v: %s", r.status, time.Since(start), r.body())
						return
					}
				}
			})
		}
		wg.Wait()
		st := u.Stats()
		served := int64(0)
		for _, s := range st.Seconds {
			if s.Unix >= start.Unix()+warm && s.Unix < start.Unix()+warm+measure {
				served += s.Served
			}
		}
		got := float64(served) / measure
		want := u.Config().Capacity(100, MixMaxTokens)
		t.Logf("served %.2f/s at saturation; Capacity says %.2f/s", got, want)
		if math.Abs(want-134.07) > 0.01 {
			t.Errorf("Capacity %.3f/s, want 134.07/s", want)
		}
		if math.Abs(got-want)/want > 0.03 {
			t.Errorf("served %.2f/s, want %.2f/s within 3%%", got, want)
		}
	})
}

// TestStream checks an SSE response: the first chunk at the time to
// first token with the role, then a chunk each ChunkTokens tokens, the
// finish_reason, the usage chunk when include_usage asks for it, and
// data: [DONE].
func TestStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      string
		wantUsage bool
	}{
		{
			name:      "include_usage",
			give:      `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`,
			wantUsage: true,
		},
		{
			name: "no usage asked",
			give: `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":40,"stream":true}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, func(c *Config) {
					c.TTFT, c.PerPromptToken, c.PerToken, c.BatchK, c.ChunkTokens = 40*time.Millisecond, 0, 10*time.Millisecond, 0, 8
				})
				start := time.Now()
				r := send(t.Context(), u, []byte(tt.give), "t1")
				if r.status != http.StatusOK || r.header.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("status %d, content type %q", r.status, r.header.Get("Content-Type"))
				}
				evs := events(t, r.body())
				if !evs[len(evs)-1].done {
					t.Fatalf("last event %q, want [DONE]", evs[len(evs)-1].raw)
				}
				var content strings.Builder
				var finish string
				var got *usage
				for i, e := range evs[:len(evs)-1] {
					if e.resp.Object != "chat.completion.chunk" || e.resp.Model != "m" {
						t.Errorf("event %d: object %q model %q", i, e.resp.Object, e.resp.Model)
					}
					if strings.Contains(e.raw, `"usage":{`) {
						got = e.resp.Usage
						if len(e.resp.Choices) != 0 || i != len(evs)-2 {
							t.Errorf("usage in event %d of %d, with %d choices: want it last, with none", i, len(evs), len(e.resp.Choices))
						}
						continue
					}
					if hasNull := strings.Contains(e.raw, `"usage":null`); hasNull != tt.wantUsage {
						t.Errorf("event %d: usage null %v, want %v", i, hasNull, tt.wantUsage)
					}
					d := e.resp.Choices[0]
					if (i == 0) != (d.Delta.Role == "assistant") {
						t.Errorf("event %d: role %q", i, d.Delta.Role)
					}
					content.WriteString(d.Delta.Content)
					if d.FinishReason != nil {
						finish = *d.FinishReason
					}
				}
				if (got != nil) != tt.wantUsage {
					t.Fatalf("usage %+v, want one: %v", got, tt.wantUsage)
				}
				tokens := strings.Count(content.String(), tokenText)
				if content.String() != strings.Repeat(tokenText, tokens) || tokens < 1 || tokens > 40 {
					t.Fatalf("content %q", content.String())
				}
				if got != nil && *got != (usage{2, tokens, 2 + tokens}) {
					t.Errorf("usage %+v, want 2 prompt and %d completion tokens", *got, tokens)
				}
				if want := map[bool]string{true: "length", false: "stop"}[tokens == 40]; finish != want {
					t.Errorf("finish_reason %q, want %q", finish, want)
				}
				// One write, and one flush, per chunk: at token 1, then
				// every 8 tokens, and at the last.
				var wantAt []time.Duration
				for next := 1; ; next = min(next+8, tokens) {
					wantAt = append(wantAt, 40*time.Millisecond+time.Duration(next)*10*time.Millisecond)
					if next == tokens {
						break
					}
				}
				var gotAt []time.Duration
				for _, w := range r.writes {
					gotAt = append(gotAt, w.at.Sub(start))
				}
				if diff := cmp.Diff(wantAt, gotAt); diff != "" || r.flushes != len(wantAt) {
					t.Errorf("writes at (-want +got):\n%s flushes %d", diff, r.flushes)
				}
				if us := u.Stats().Tenants["t1"]; us != (Usage{Served: 1, PromptTokens: 2, CompletionTokens: int64(tokens)}) {
					t.Errorf("tenant usage %+v", us)
				}
			})
		})
	}
}

// TestCancel checks that a client that goes away frees its slot, or its
// place in the queue, at once, and is counted cancelled.
func TestCancel(t *testing.T) {
	t.Parallel()
	type client struct {
		arrive   time.Duration
		stream   bool
		cancelAt time.Duration // 0: never
		failAt   int           // 0: never; else the write that fails
	}
	type want struct {
		status int
		at     time.Duration
	}
	slow := func(c *Config) { fixed(time.Second)(c); c.Slots, c.Queue = 1, 1 }
	streaming := func(c *Config) {
		c.TTFT, c.PerPromptToken, c.PerToken, c.BatchK, c.Slots, c.Queue = 40*time.Millisecond, 0, 10*time.Millisecond, 0, 1, 1
		c.MinCompletion = 1
	}
	tests := []struct {
		name       string
		edit       func(*Config)
		give       []client
		want       []want
		wantTotal  Counts
		wantTenant Usage // of tenant "c0", the first client
	}{
		{
			name:       "in service: the next gets the slot at once",
			edit:       slow,
			give:       []client{{cancelAt: 100 * time.Millisecond}, {}},
			want:       []want{{0, 100 * time.Millisecond}, {200, 1100 * time.Millisecond}},
			wantTotal:  Counts{Received: 2, Served: 1, Cancelled: 1},
			wantTenant: Usage{Cancelled: 1, CancelledPromptTokens: 2},
		},
		{
			name: "in the queue: its place is free",
			edit: func(c *Config) { slow(c); c.QueueTimeout = 2 * time.Second },
			give: []client{{}, {cancelAt: 100 * time.Millisecond}, {arrive: 200 * time.Millisecond}},
			want: []want{{200, time.Second}, {0, 100 * time.Millisecond}, {200, 2 * time.Second}},
			// The third is queued, not refused: the queue of one is empty
			// again.
			wantTotal:  Counts{Received: 3, Served: 2, Cancelled: 1},
			wantTenant: Usage{Served: 1, PromptTokens: 2, CompletionTokens: 1},
		},
		{
			// The stream has 64 tokens: its first chunk at 50 ms, its
			// second at 130 ms.
			name:       "a stream: the tokens sent count",
			edit:       streaming,
			give:       []client{{stream: true, cancelAt: 60 * time.Millisecond}, {}},
			want:       []want{{200, 60 * time.Millisecond}, {200, 60*time.Millisecond + 50*time.Millisecond}},
			wantTotal:  Counts{Received: 2, Served: 1, Cancelled: 1},
			wantTenant: Usage{Cancelled: 1, CancelledPromptTokens: 2, CancelledCompletionTokens: 1},
		},
		{
			name:       "a stream whose write fails",
			edit:       streaming,
			give:       []client{{stream: true, failAt: 2}, {}},
			want:       []want{{200, 130 * time.Millisecond}, {200, 130*time.Millisecond + 50*time.Millisecond}},
			wantTotal:  Counts{Received: 2, Served: 1, Cancelled: 1},
			wantTenant: Usage{Cancelled: 1, CancelledPromptTokens: 2, CancelledCompletionTokens: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, tt.edit)
				start := time.Now()
				recs := make([]*recorder, len(tt.give))
				var wg sync.WaitGroup
				for i, c := range tt.give {
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					body := ChatBody("m", 8, 1, false)
					if c.stream {
						body = ChatBody("m", 8, 64, true)
					}
					wg.Go(func() {
						time.Sleep(c.arrive) // the bubble's clock
						recs[i] = sendTo(ctx, u, &recorder{failAfter: c.failAt - 1}, body, fmt.Sprintf("c%d", i))
					})
					if c.cancelAt > 0 {
						wg.Go(func() {
							time.Sleep(c.cancelAt)
							cancel()
						})
					}
					synctest.Wait()
				}
				wg.Wait()
				for i, w := range tt.want {
					if got := recs[i]; got.status != w.status || got.done.Sub(start) != w.at {
						t.Errorf("client %d: status %d at %v, want %d at %v", i, got.status, got.done.Sub(start), w.status, w.at)
					}
				}
				st := u.Stats()
				if st.Totals != tt.wantTotal || st.Busy != 0 || st.Queued != 0 {
					t.Errorf("totals %+v busy %d queued %d, want %+v and none in flight", st.Totals, st.Busy, st.Queued, tt.wantTotal)
				}
				if got := st.Tenants["c0"]; got != tt.wantTenant {
					t.Errorf("tenant c0 %+v, want %+v", got, tt.wantTenant)
				}
			})
		})
	}
}

// TestOpenLoad sends Poisson arrivals of the default mix at issue 13's
// rates, on the bubble's clock: the steady 94/s (70% of capacity) is
// served without an overload answer; a spike of free x10 (436/s) keeps
// every slot busy, so the upstream still serves its capacity, and turns
// the rest away with 503 and 504.
func TestOpenLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		rate          float64 // arrivals a second
		wantOverloads bool
	}{
		{name: "steady 94/s", rate: 94},
		{name: "spike 436/s", rate: 28 + 28 + 380, wantOverloads: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, nil)
				const warm, measure = 5, 30 // seconds
				start := time.Now()
				end := start.Add((warm + measure) * time.Second)
				rng := rand.New(rand.NewPCG(1, 2))
				body := ChatBody("m", MixPromptChars, MixMaxTokens, false)
				var wg sync.WaitGroup
				for time.Now().Before(end) {
					wg.Go(func() { send(t.Context(), u, body, "") })
					time.Sleep(time.Duration(rng.ExpFloat64() / tt.rate * float64(time.Second)))
				}
				wg.Wait()
				var c Counts
				inFlight, maxInFlight := 0, 0
				for _, s := range u.Stats().Seconds {
					if s.Unix >= start.Unix()+warm && s.Unix < start.Unix()+warm+measure {
						c.Received += s.Received
						c.Served += s.Served
						c.QueueFull += s.QueueFull
						c.QueueTimeout += s.QueueTimeout
						inFlight += s.InFlight
						maxInFlight = max(maxInFlight, s.MaxInFlight)
					}
				}
				served := float64(c.Served) / measure
				t.Logf("offered %.1f/s, served %.1f/s, 503 %d, 504 %d, in flight %.1f on average at the seconds' ends, %d at most",
					float64(c.Received)/measure, served, c.QueueFull, c.QueueTimeout, float64(inFlight)/measure, maxInFlight)
				if got := c.Overloads() > 0; got != tt.wantOverloads {
					t.Errorf("overload answers %d, want some: %v", c.Overloads(), tt.wantOverloads)
				}
				if want := min(tt.rate, u.Config().Capacity(100, MixMaxTokens)); math.Abs(served-want)/want > 0.05 {
					t.Errorf("served %.1f/s, want %.1f/s within 5%%", served, want)
				}
			})
		})
	}
}
