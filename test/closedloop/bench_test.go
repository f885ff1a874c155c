package closedloop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestParseUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		give   string
		stream bool
		want   [2]int64
	}{
		{"json", `{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30}}`, false, [2]int64{12, 30}},
		{"json without usage", `{"choices":[]}`, false, [2]int64{0, 0}},
		{"json null usage", `{"usage":null}`, false, [2]int64{0, 0}},
		{"not json", `<html>`, false, [2]int64{0, 0}},
		{"negative", `{"usage":{"prompt_tokens":-5,"completion_tokens":3}}`, false, [2]int64{0, 3}},
		{"sse, usage last", "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n", true, [2]int64{7, 9}},
		{"sse, null usage chunks", "data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n", true, [2]int64{1, 2}},
		{"sse without usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true, [2]int64{0, 0}},
		{"sse, broken chunk", "data: {\"usage\":{\"prompt_tokens\":\n\n", true, [2]int64{0, 0}},
		{"sse without space", "data:{\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":5}}\n", true, [2]int64{4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, c := ParseUsage([]byte(tt.give), tt.stream)
			if got := [2]int64{p, c}; got != tt.want {
				t.Errorf("ParseUsage = %v, want %v", got, tt.want)
			}
		})
	}
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":2}}`), false)
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n"), true)
	f.Fuzz(func(t *testing.T, body []byte, stream bool) {
		if p, c := ParseUsage(body, stream); p < 0 || c < 0 {
			t.Errorf("ParseUsage = %d, %d: negative", p, c)
		}
	})
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		give string
		want time.Duration
	}{{"3", 3 * time.Second}, {"", 0}, {"-1", 0}, {"Wed, 21 Oct 2015 07:28:00 GMT", 0}, {"999999", 0}}
	for _, tt := range tests {
		if got := RetryAfter(tt.give); got != tt.want {
			t.Errorf("RetryAfter(%q) = %v, want %v", tt.give, got, tt.want)
		}
	}
}

func TestRulesWithout(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(ShippedRules())
	if err != nil {
		t.Fatal(err)
	}
	got := RulesWithout(string(data), "shedding", "control")
	for _, gone := range []string{"\nshedding:", "admit_only:", "\n  hysteresis:"} {
		if strings.Contains(got, gone) {
			t.Errorf("rules without shedding still hold %q", gone)
		}
	}
	for _, kept := range []string{"\nbreakers:", "\ntiers:", "tenant_gpt4o_tokens", "\ndomain: inference"} {
		if !strings.Contains(got, kept) {
			t.Errorf("rules without shedding lost %q", kept)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	text := `# HELP tollgate_pressure_score x
# TYPE tollgate_pressure_score gauge
tollgate_pressure_score{scope="global",domain="inference"} 0.75
# TYPE tollgate_breaker_state gauge
tollgate_breaker_state{domain="inference",key="gpt-4o",breaker="model"} 2
# TYPE tollgate_other gauge
tollgate_other 1
# TYPE tollgate_queue_wait_seconds histogram
tollgate_queue_wait_seconds_bucket{domain="inference",tier="free",outcome="admitted",le="0.1"} 3
tollgate_queue_wait_seconds_bucket{domain="inference",tier="free",outcome="admitted",le="+Inf"} 4
tollgate_queue_wait_seconds_sum{domain="inference",tier="free",outcome="admitted"} 0.3
tollgate_queue_wait_seconds_count{domain="inference",tier="free",outcome="admitted"} 4
`
	got, err := ParseMetrics(strings.NewReader(text), ScrapedMetrics)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"tollgate_pressure_score{domain=inference,scope=global}":                                  0.75,
		"tollgate_breaker_state{breaker=model,domain=inference,key=gpt-4o}":                       2,
		"tollgate_queue_wait_seconds_count{domain=inference,outcome=admitted,tier=free}":          4,
		"tollgate_queue_wait_seconds_bucket{domain=inference,le=0.1,outcome=admitted,tier=free}":  3,
		"tollgate_queue_wait_seconds_bucket{domain=inference,le=+Inf,outcome=admitted,tier=free}": 4,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ParseMetrics = %v, want %v", got, want)
	}
	if _, err := ParseMetrics(strings.NewReader("tollgate_pressure_score{ 1\n"), ScrapedMetrics); err == nil {
		t.Error("ParseMetrics of a broken text: no error")
	}
}

// TestRows checks one run's seconds against hand-counted ones.
func TestRows(t *testing.T) {
	t.Parallel()
	b := newRun(3.5, PhaseSteady, 0.0, PhaseSpike, 2.0)
	ok := func(sent float64, lat time.Duration) Record {
		return Record{Sent: at(sent), Tier: "premium", Result: Result{Status: 200, Source: SourceUpstream, Latency: lat, Attempts: 1}}
	}
	for i := range 10 {
		b.rec(ok(0.1, time.Duration(i+1)*10*time.Millisecond)) // second 0: 10..100ms
	}
	b.rec(ok(0.9, 200*time.Millisecond))                                                                            // ends in second 1
	b.rec(Record{Sent: at(1.5), Tier: "free", Result: Result{Status: 503, Source: SourceTollgate, Reason: "shed"}}) // second 1
	b.rec(Record{Sent: at(1.6), Tier: "free", Dropped: true})
	b.rec(Record{Sent: at(2.1), Tier: "free", Result: Result{Status: 200, Source: SourceUpstream, Latency: time.Second, Attempts: 3}})
	b.up(0.5, 0).up(1.5, 4).up(2.5, 4)
	b.scrape(0, 0.5, map[string]float64{lvl: -1}).scrape(0, 2.5, map[string]float64{lvl: 0})
	run := b.run
	run.build()
	if len(run.Rows) != 4 || fmt.Sprint(run.Tiers) != "[premium free]" {
		t.Fatalf("%d rows, tiers %v; want 4 rows, [premium free]", len(run.Rows), run.Tiers)
	}
	p0 := run.Rows[0].Tier["premium"]
	if p0.Good != 10 || p0.P50 != 50*time.Millisecond || p0.P99 != 100*time.Millisecond {
		t.Errorf("second 0 premium: %+v", p0)
	}
	if g := run.Rows[1].Tier["premium"].Good; g != 1 {
		t.Errorf("second 1 premium good = %d, want 1", g)
	}
	f1 := run.Rows[1].Tier["free"]
	if f1.Denied["shed"] != 1 || f1.Dropped != 1 || f1.Sent != 1 || f1.Admitted != 0 {
		t.Errorf("second 1 free: %+v", f1)
	}
	if f3 := run.Rows[3].Tier["free"]; f3.Good != 1 || f3.Retries != 2 || f3.Admitted != 1 {
		t.Errorf("second 3 free: %+v", f3)
	}
	if run.Rows[1].Up.QueueFull != 4 || run.Rows[2].Up.QueueFull != 0 {
		t.Errorf("queue full deltas: %d, %d; want 4, 0", run.Rows[1].Up.QueueFull, run.Rows[2].Up.QueueFull)
	}
	if run.Rows[1].Phase != PhaseSteady || run.Rows[2].Phase != PhaseSpike {
		t.Errorf("phases %q %q", run.Rows[1].Phase, run.Rows[2].Phase)
	}
	if v := run.Rows[1].Replica[0][lvl]; v != -1 {
		t.Errorf("second 1 carries the level forward: %v, want -1", v)
	}
	if v := run.Rows[2].Replica[0][lvl]; v != 0 {
		t.Errorf("second 2 level %v, want 0", v)
	}
}

// countingGateway answers at once, or after hold (in the bubble's time).
type countingGateway struct {
	hold time.Duration
	n    atomic.Int64
}

func (g *countingGateway) Do(ctx context.Context, r *Request) Result {
	g.n.Add(1)
	if g.hold > 0 {
		time.Sleep(g.hold) // the synctest bubble's clock: no real wait
	}
	return Result{Status: 200, Source: SourceUpstream, Attempts: 1}
}

func (g *countingGateway) Close() error { return nil }

type memSink struct {
	mu   sync.Mutex
	recs []Record
}

func (s *memSink) Add(r Record) {
	s.mu.Lock()
	s.recs = append(s.recs, r)
	s.mu.Unlock()
}

func TestDriver(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		hold        time.Duration
		maxInFlight int
		scale       map[string]float64
		// wantA and wantB bound class a's and b's sent+dropped in 20s.
		wantA, wantB [2]int
		wantDrops    bool
	}{
		// 50/s and 10/s for 20s: 1000 and 200, within 5 sigma.
		{name: "rates", maxInFlight: 1000, wantA: [2]int{840, 1160}, wantB: [2]int{130, 270}},
		{name: "b x10", maxInFlight: 1000, scale: map[string]float64{"b": 10}, wantA: [2]int{840, 1160}, wantB: [2]int{1840, 2160}},
		{name: "a off", maxInFlight: 1000, scale: map[string]float64{"a": 0}, wantA: [2]int{0, 0}, wantB: [2]int{130, 270}},
		// 60/s arrivals, each held 1s, at most 10 outstanding: most drop.
		{name: "bounded", hold: time.Second, maxInFlight: 10, wantA: [2]int{840, 1160}, wantB: [2]int{130, 270}, wantDrops: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				gw := &countingGateway{hold: tt.hold}
				sink := &memSink{}
				ts := []Tenant{{Name: "x", Key: "k"}}
				classes := []Class{
					{Name: "a", Tier: "premium", Tenants: ts, Model: Model, Rate: 50, StreamFraction: 0.5, PromptTokens: Range{10, 20}, MaxTokens: Range{5, 5}, Timeout: 5 * time.Second},
					{Name: "b", Tier: "free", Tenants: ts, Model: Model, Rate: 10, Timeout: 5 * time.Second},
				}
				d := NewDriver(gw, sink, classes, 1, tt.maxInFlight)
				if tt.scale != nil {
					d.SetScale(tt.scale)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				d.Run(ctx)
				n := map[string]int{}
				drops, streams := 0, 0
				for _, r := range sink.recs {
					n[r.Class]++
					if r.Dropped {
						drops++
					}
					if r.Stream {
						streams++
					}
				}
				if n["a"] < tt.wantA[0] || n["a"] > tt.wantA[1] || n["b"] < tt.wantB[0] || n["b"] > tt.wantB[1] {
					t.Errorf("arrivals a %d, b %d; want a in %v, b in %v", n["a"], n["b"], tt.wantA, tt.wantB)
				}
				if got := int(gw.n.Load()); got+drops != len(sink.recs) {
					t.Errorf("gateway saw %d, drops %d, records %d", got, drops, len(sink.recs))
				}
				if (drops > 0) != tt.wantDrops {
					t.Errorf("%d drops, want drops: %v", drops, tt.wantDrops)
				}
				if tt.wantDrops && int(gw.n.Load()) > 10*21 {
					t.Errorf("gateway saw %d requests: more than 10 at a time for 1s each over 20s", gw.n.Load())
				}
				if tt.name == "rates" && (streams < n["a"]/3 || streams > n["a"]*2/3) {
					t.Errorf("%d streams of %d in class a, want about half", streams, n["a"])
				}
			})
		})
	}
}

func TestBuildRequest(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sink := &memSink{}
		var got *Request
		var mu sync.Mutex
		gw := gatewayFunc(func(_ context.Context, r *Request) Result {
			mu.Lock()
			got = r
			mu.Unlock()
			return Result{}
		})
		c := Class{Name: "a", Tier: "standard", Tenants: []Tenant{{Name: "acme", Key: "sim-key"}}, Model: Model, Rate: 100,
			StreamFraction: 1, PromptTokens: Range{100, 100}, MaxTokens: Range{64, 64}, Timeout: time.Second}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		NewDriver(gw, sink, []Class{c}, 1, 10).Run(ctx)
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			t.Fatal("no request sent")
		}
		var body struct {
			Model         string `json:"model"`
			MaxTokens     int    `json:"max_tokens"`
			Stream        bool   `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
			Messages []chatMessage `json:"messages"`
		}
		if err := json.Unmarshal(got.Body, &body); err != nil {
			t.Fatal(err)
		}
		if body.Model != Model || body.MaxTokens != 64 || !body.Stream || !body.StreamOptions.IncludeUsage || len(body.Messages[0].Content) != 400 {
			t.Errorf("body %s", got.Body)
		}
		if got.Header.Get("Authorization") != "Bearer sim-key" || got.Header.Get("X-Sim-Tenant") != "acme" || got.Tier != "standard" || !got.Stream {
			t.Errorf("request %+v", got)
		}
		if r := sink.recs[0]; r.Estimate != 164 || r.Tenant != "acme" {
			t.Errorf("record %+v, want estimate 164", r)
		}
	})
}

type gatewayFunc func(context.Context, *Request) Result

func (f gatewayFunc) Do(ctx context.Context, r *Request) Result { return f(ctx, r) }
func (f gatewayFunc) Close() error                              { return nil }

// TestDirect checks what Direct reports for each kind of answer, against
// a loopback server.
func TestDirect(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Case") {
		case "json":
			fmt.Fprint(w, `{"usage":{"prompt_tokens":3,"completion_tokens":4}}`)
		case "sse":
			fmt.Fprint(w, "data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\ndata: [DONE]\n\n")
		case "busy":
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
		case "slow":
			// Longer than the client waits; bounded, so Close does not
			// hang on a connection whose cancel the server missed.
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Second):
			}
		}
	}))
	t.Cleanup(srv.Close)
	d := NewDirect(srv.URL, 4)
	t.Cleanup(func() { _ = d.Close() })
	tests := []struct {
		name   string
		stream bool
		want   Result
	}{
		{"json", false, Result{Status: 200, Source: SourceUpstream, Attempts: 1, PromptTokens: 3, CompletionTokens: 4}},
		{"sse", true, Result{Status: 200, Source: SourceUpstream, Attempts: 1, PromptTokens: 5, CompletionTokens: 6}},
		{"busy", false, Result{Status: 503, Source: SourceUpstream, Attempts: 1, RetryAfter: 2 * time.Second}},
		{"slow", false, Result{Source: SourceClient, Attempts: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			h.Set("X-Case", tt.name)
			got := d.Do(t.Context(), &Request{Method: http.MethodPost, Path: "/v1/chat/completions", Header: h, Body: []byte("{}"),
				Stream: tt.stream, Timeout: 200 * time.Millisecond})
			got.Latency = 0
			if got != tt.want {
				t.Errorf("Do = %+v, want %+v", got, tt.want)
			}
		})
	}
}
