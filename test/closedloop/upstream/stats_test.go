package upstream

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestTenants checks each tenant's usage is the sum of the usage its
// responses reported, and that tenant names are bounded.
func TestTenants(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		u := newUpstream(t, func(c *Config) { c.MaxTenants = 3 })
		give := []struct {
			tenant string
			body   []byte
		}{
			{"a", ChatBody("m", 400, 64, false)},
			{"a", ChatBody("m", 41, 10, true)},
			{"b", ChatBody("m", 7, 300, false)},
			{"a", ChatBody("m", 1, 1, false)},
			{"", ChatBody("m", 12, 5, true)},
			{"c", ChatBody("m", 12, 5, false)},          // past MaxTenants
			{"bad tenant", ChatBody("m", 12, 5, false)}, // not printable ASCII without spaces
			{strings.Repeat("x", maxTenantLen+1), ChatBody("m", 12, 5, false)},
		}
		want := map[string]Usage{}
		for _, g := range give {
			// One after the other: the tenants a, b and - are accounted
			// first, and fill MaxTenants.
			r := send(t.Context(), u, g.body, g.tenant)
			var got *usage
			if strings.HasPrefix(r.body(), "data: ") {
				evs := events(t, r.body())
				got = evs[len(evs)-2].resp.Usage
			} else {
				got = decodeJSON(t, r.body()).Usage
			}
			if got == nil || got.TotalTokens != got.PromptTokens+got.CompletionTokens {
				t.Fatalf("usage %+v", got)
			}
			key := map[string]string{"": NoTenant, "a": "a", "b": "b"}[g.tenant]
			if key == "" {
				key = OtherTenant
			}
			w := want[key]
			w.Served++
			w.PromptTokens += int64(got.PromptTokens)
			w.CompletionTokens += int64(got.CompletionTokens)
			want[key] = w
		}
		if want["a"].PromptTokens != 100+11+1 {
			t.Errorf("tenant a prompt tokens %d, want 112", want["a"].PromptTokens)
		}
		if diff := cmp.Diff(want, u.Stats().Tenants); diff != "" {
			t.Errorf("tenants (-want +got):\n%s", diff)
		}
	})
}

// TestBadRequest checks that a malformed request gets a 4xx with an
// OpenAI error body, is counted, and takes no slot.
func TestBadRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		method     string
		path       string
		give       string
		wantStatus int
		wantCode   string
	}{
		{name: "get", method: "GET", path: ChatPath, wantStatus: 405, wantCode: "method_not_allowed"},
		{name: "not JSON", method: "POST", path: ChatPath, give: `{"model":`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "an array", method: "POST", path: ChatPath, give: `[]`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "no messages", method: "POST", path: ChatPath, give: `{"model":"m","messages":[]}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "content a number", method: "POST", path: ChatPath, give: `{"messages":[{"content":5}]}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "part text a number", method: "POST", path: ChatPath, give: `{"messages":[{"content":[{"text":5}]}]}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "max_tokens 0", method: "POST", path: ChatPath, give: `{"messages":[{"content":"x"}],"max_tokens":0}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "max_tokens negative with a good max_completion_tokens", method: "POST", path: ChatPath, give: `{"messages":[{"content":"x"}],"max_tokens":-1,"max_completion_tokens":5}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "max_tokens over the limit", method: "POST", path: ChatPath, give: `{"messages":[{"content":"x"}],"max_tokens":16385}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "max_tokens huge", method: "POST", path: ChatPath, give: `{"messages":[{"content":"x"}],"max_tokens":1e30}`, wantStatus: 400, wantCode: "invalid_body"},
		{name: "too large", method: "POST", path: ChatPath, give: `{"messages":[{"content":"` + strings.Repeat("x", 2000) + `"}]}`, wantStatus: 413, wantCode: "body_too_large"},
		{name: "unknown path", method: "POST", path: "/v1/embeddings", wantStatus: 404, wantCode: "unknown_url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t, func(c *Config) { c.MaxBodyBytes = 1000 })
			w := httptest.NewRecorder()
			u.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.give)))
			if w.Code != tt.wantStatus || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Header().Get("Content-Type"), tt.wantStatus)
			}
			if got := errorCode(t, w.Body.String()); got != tt.wantCode {
				t.Errorf("code %q, want %q", got, tt.wantCode)
			}
			want := Counts{Received: 1, BadRequest: 1}
			if tt.path != ChatPath {
				want = Counts{}
			}
			if st := u.Stats(); st.Totals != want || st.Busy != 0 || len(st.Tenants) != 0 {
				t.Errorf("totals %+v busy %d tenants %v, want %+v", st.Totals, st.Busy, st.Tenants, want)
			}
		})
	}
}

// TestSeconds checks the per-second counters and gauges, the ring's
// bound, and GET /stats.
func TestSeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		history int
		query   string
		want    []Second // from the run's first second
	}{
		{
			name:    "all kept",
			history: 10,
			want: []Second{
				{Counts: Counts{Received: 2, QueueFull: 1}, InFlight: 1, MaxInFlight: 1},
				{Counts: Counts{Served: 1}, MaxInFlight: 1},
				{},
			},
		},
		{
			name:    "a ring of two",
			history: 2,
			want:    []Second{1: {Counts: Counts{Served: 1}, MaxInFlight: 1}, 2: {}}[1:],
		},
		{
			name:    "the last one asked",
			history: 10,
			query:   "?seconds=1",
			want:    []Second{2: {}}[2:],
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, func(c *Config) {
					fixed(1500 * time.Millisecond)(c)
					c.Slots, c.Queue, c.History = 1, 0, tt.history
				})
				start := time.Now().Unix()
				var wg sync.WaitGroup
				for range 2 {
					wg.Go(func() { send(t.Context(), u, ChatBody("m", 8, 4, false), "") })
					synctest.Wait()
				}
				wg.Wait()
				time.Sleep(time.Second) // the bubble's clock: into a quiet third second
				w := httptest.NewRecorder()
				u.ServeHTTP(w, httptest.NewRequest(http.MethodGet, StatsPath+tt.query, nil))
				var st Stats
				if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusOK {
					t.Fatalf("GET /stats: %d %v: %s", w.Code, err, w.Body)
				}
				first := start + 3 - int64(len(tt.want))
				for i := range tt.want {
					tt.want[i].Unix = first + int64(i)
				}
				if diff := cmp.Diff(tt.want, st.Seconds); diff != "" {
					t.Errorf("seconds (-want +got):\n%s", diff)
				}
				if st.Totals != (Counts{Received: 2, Served: 1, QueueFull: 1}) || st.Slots != 1 || st.QueueCap != 0 {
					t.Errorf("stats %+v", st)
				}
			})
		})
	}
}
