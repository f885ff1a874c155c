package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// serve starts u on a loopback port for the test, with a client whose
// idle connections are closed at the end.
func serve(t testing.TB, u *Upstream) (string, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(u)
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		c.CloseIdleConnections()
		srv.Close()
	})
	return srv.URL, c
}

func post(t testing.TB, ctx context.Context, c *http.Client, url string, body []byte, tenant string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+ChatPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(TenantHeader, tenant)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return resp
}

// TestHTTP serves JSON and SSE over a real loopback connection to a real
// client, and reads GET /stats.
func TestHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stream bool
	}{
		{name: "json"},
		{name: "sse", stream: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t, func(c *Config) {
				c.TTFT, c.PerPromptToken, c.PerToken = time.Millisecond, 0, 100*time.Microsecond
			})
			url, c := serve(t, u)
			resp := post(t, t.Context(), c, url, ChatBody("gpt-sim", MixPromptChars, MixMaxTokens, tt.stream), "acme")
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, read %v: %s", resp.StatusCode, err, b)
			}
			var got *usage
			if tt.stream {
				evs := events(t, string(b))
				got = evs[len(evs)-2].resp.Usage
			} else {
				got = decodeJSON(t, string(b)).Usage
			}
			if got == nil || got.PromptTokens != 100 || got.CompletionTokens < 1 || got.CompletionTokens > MixMaxTokens {
				t.Fatalf("usage %+v", got)
			}
			sr, err := c.Get(url + StatsPath)
			if err != nil {
				t.Fatal(err)
			}
			defer sr.Body.Close()
			var st Stats
			if err := json.NewDecoder(sr.Body).Decode(&st); err != nil {
				t.Fatalf("decode /stats: %v", err)
			}
			want := Usage{Served: 1, PromptTokens: 100, CompletionTokens: int64(got.CompletionTokens)}
			if st.Tenants["acme"] != want || st.Totals != (Counts{Received: 1, Served: 1}) {
				t.Errorf("stats: tenant %+v totals %+v, want %+v", st.Tenants["acme"], st.Totals, want)
			}
		})
	}
}

// TestHTTPCancel checks that a client that drops its connection, queued
// or mid-stream, frees its place at once: net/http cancels the handler's
// context, which the upstream waits on.
func TestHTTPCancel(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, func(c *Config) {
		// A stream of 16384 tokens whose first chunk comes after 20 ms and
		// its second after five minutes.
		c.TTFT, c.PerPromptToken, c.PerToken, c.BatchK, c.MinCompletion = 0, 0, 20*time.Millisecond, 0, 1
		c.ChunkTokens = c.MaxTokensLimit
		c.Slots, c.Queue, c.QueueTimeout = 1, 1, time.Minute
	})
	url, c := serve(t, u)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := post(t, ctx, c, url, ChatBody("m", 8, 16384, true), "s")
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	queued := make(chan *http.Response, 1)
	qctx, qcancel := context.WithCancel(t.Context())
	defer qcancel()
	go func() {
		req, _ := http.NewRequestWithContext(qctx, http.MethodPost, url+ChatPath, bytes.NewReader(ChatBody("m", 8, 1, false)))
		r, err := c.Do(req)
		if err == nil {
			_ = r.Body.Close()
		}
		queued <- r
	}()
	waitFor(t, u, func(st Stats) bool { return st.Busy == 1 && st.Queued == 1 })
	qcancel()
	if r := <-queued; r != nil {
		t.Errorf("the cancelled request got %d", r.StatusCode)
	}
	waitFor(t, u, func(st Stats) bool { return st.Queued == 0 && st.Totals.Cancelled == 1 })
	cancel()
	waitFor(t, u, func(st Stats) bool { return st.Busy == 0 && st.Totals.Cancelled == 2 })
	if got := u.Stats().Tenants["s"]; got != (Usage{Cancelled: 1, CancelledPromptTokens: 2, CancelledCompletionTokens: 1}) {
		t.Errorf("tenant %+v", got)
	}
}

// waitFor polls Stats until ok, for at most 10 s: generous for a busy
// machine, where a cancel reaches the handler in milliseconds.
func waitFor(t testing.TB, u *Upstream, ok func(Stats) bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !ok(u.Stats()) {
		select {
		case <-tick.C:
		case <-deadline:
			st := u.Stats()
			t.Fatalf("not reached in 10s: busy %d queued %d totals %+v", st.Busy, st.Queued, st.Totals)
		}
	}
}
