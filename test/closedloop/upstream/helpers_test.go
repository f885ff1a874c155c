package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newUpstream is an upstream of DefaultConfig changed by edit.
func newUpstream(t testing.TB, edit func(*Config)) *Upstream {
	t.Helper()
	c := DefaultConfig()
	if edit != nil {
		edit(&c)
	}
	u, err := New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return u
}

// fixed makes every request's service take d: no per-token time, no
// batch factor.
func fixed(d time.Duration) func(*Config) {
	return func(c *Config) {
		c.TTFT, c.PerPromptToken, c.PerToken, c.BatchK = d, 0, 0, 0
	}
}

// write is one Write to a recorder, with the time it happened at (the
// bubble's, under synctest).
type write struct {
	at time.Time
	b  string
}

// recorder is an http.ResponseWriter and http.Flusher that keeps each
// write and its time, so a test sees when each SSE chunk left. Write fails
// once failAfter writes are done (when failAfter > 0), as a write to a
// client that went away does.
type recorder struct {
	header    http.Header
	status    int
	writes    []write
	flushes   int
	failAfter int
	done      time.Time // when the handler returned
}

func (r *recorder) Header() http.Header {
	if r.header == nil {
		r.header = http.Header{}
	}
	return r.header
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.failAfter > 0 && len(r.writes) >= r.failAfter {
		return 0, errors.New("write: client gone")
	}
	r.WriteHeader(http.StatusOK)
	r.writes = append(r.writes, write{at: time.Now(), b: string(b)})
	return len(b), nil
}

func (r *recorder) Flush() { r.flushes++ }

func (r *recorder) body() string {
	var s strings.Builder
	for _, w := range r.writes {
		s.WriteString(w.b)
	}
	return s.String()
}

// send serves one chat request of body for tenant (none when empty) on u,
// in this goroutine, and returns what the client got.
func send(ctx context.Context, u *Upstream, body []byte, tenant string) *recorder {
	return sendTo(ctx, u, &recorder{}, body, tenant)
}

func sendTo(ctx context.Context, u *Upstream, rec *recorder, body []byte, tenant string) *recorder {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, ChatPath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set(TenantHeader, tenant)
	}
	u.ServeHTTP(rec, req)
	rec.done = time.Now()
	return rec
}

// chatResponse is the part of a chat completion (JSON, or one SSE chunk)
// the tests read.
type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func decodeJSON(t testing.TB, s string) chatResponse {
	t.Helper()
	var r chatResponse
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		t.Fatalf("decode response %q: %v", s, err)
	}
	return r
}

// event is one SSE event: its data, decoded unless it is [DONE].
type event struct {
	raw  string
	done bool
	resp chatResponse
}

// events splits an SSE body into its events; each must be one data line.
func events(t testing.TB, body string) []event {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("SSE body does not end with a blank line: %q", body)
	}
	var out []event
	for _, e := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(e, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("SSE event %q is not one data line", e)
		}
		ev := event{raw: data, done: data == "[DONE]"}
		if !ev.done {
			ev.resp = decodeJSON(t, data)
		}
		out = append(out, ev)
	}
	return out
}

// errorCode is the error.code of an OpenAI-style error body.
func errorCode(t testing.TB, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body (%v): %q", err, body)
	}
	if e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}
