package pressure

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

const token = "s3cret-token-s3cret-token-s3cret" // MinTokenBytes

func newHandler(t *testing.T) (http.Handler, *Combiner, *memstore.Board, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := memstore.NewBoard()
	c := replica(t, b, storetest.NewFakeClock(t0), "r", CombineMax, fixed(0.1))
	h, err := NewHandler(HandlerConfig{Combiner: c, TokenFile: file, DefaultTTL: time.Minute, MaxTTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return h, c, b, file
}

func do(h http.Handler, method, auth, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "/v1/pressure", strings.NewReader(body))
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHandlerPut(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		auth string
		give string
		want int
	}{
		{name: "OK", auth: "Bearer " + token, give: `{"scope":"global","pressure":0.85,"ttl":"60s"}`, want: 204},
		{name: "DefaultTTL", auth: "Bearer " + token, give: `{"scope":"global","pressure":0}`, want: 204},
		{name: "NoToken", give: `{"scope":"global","pressure":0.85}`, want: 401},
		{name: "WrongToken", auth: "Bearer nope", give: `{"scope":"global","pressure":0.85}`, want: 401},
		{name: "NotBearer", auth: "Basic " + token, give: `{"scope":"global","pressure":0.85}`, want: 401},
		{name: "BadJSON", auth: "Bearer " + token, give: `{"scope":`, want: 400},
		{name: "Trailing", auth: "Bearer " + token, give: `{"scope":"global","pressure":0.5} {}`, want: 400},
		{name: "UnknownField", auth: "Bearer " + token, give: `{"scope":"global","pressure":0.5,"force":true}`, want: 400},
		{name: "Above1", auth: "Bearer " + token, give: `{"scope":"global","pressure":1.5}`, want: 400},
		{name: "Negative", auth: "Bearer " + token, give: `{"scope":"global","pressure":-0.1}`, want: 400},
		{name: "NoPressure", auth: "Bearer " + token, give: `{"scope":"global"}`, want: 400},
		{name: "NoScope", auth: "Bearer " + token, give: `{"pressure":0.5}`, want: 400},
		{name: "UnknownScope", auth: "Bearer " + token, give: `{"scope":"gpt-9","pressure":0.5}`, want: 400},
		{name: "BadTTL", auth: "Bearer " + token, give: `{"scope":"global","pressure":0.5,"ttl":"soon"}`, want: 400},
		{name: "TTLTooLong", auth: "Bearer " + token, give: `{"scope":"global","pressure":0.5,"ttl":"24h"}`, want: 400},
		{name: "TooLarge", auth: "Bearer " + token, give: `{"scope":"global","pressure":0.5,"ttl":"` + strings.Repeat("1", maxBody) + `s"}`, want: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, _, _, _ := newHandler(t)
			w := do(h, http.MethodPut, tt.auth, tt.give)
			if w.Code != tt.want {
				t.Errorf("PUT %s = %d %s, want %d", tt.give, w.Code, w.Body, tt.want)
			}
			if strings.Contains(w.Body.String(), token) {
				t.Errorf("response carries the token: %s", w.Body)
			}
		})
	}
}

func TestHandlerPushReachesEvaluator(t *testing.T) {
	t.Parallel()
	h, c, b, _ := newHandler(t)
	if w := do(h, http.MethodPut, "Bearer "+token, `{"scope":"global","pressure":0.95,"ttl":"60s"}`); w.Code != 204 {
		t.Fatalf("PUT = %d %s", w.Code, w.Body)
	}
	got, err := b.Scores(context.Background(), t0, "global")
	if err != nil || !got.HasPushed || got.Pushed != 0.95 {
		t.Fatalf("board after push: %+v, %v", got, err)
	}
	c.Tick(context.Background())
	w := do(h, http.MethodGet, "Bearer "+token, "")
	if w.Code != 200 {
		t.Fatalf("GET = %d %s", w.Code, w.Body)
	}
	var out struct {
		Scopes []struct {
			Scope     string             `json:"scope"`
			Combined  float64            `json:"combined"`
			Pushed    *float64           `json:"pushed"`
			Replicas  map[string]float64 `json:"replicas"`
			Level     int                `json:"level"`
			Shed      []string           `json:"shed"`
			AdmitOnly []string           `json:"admit_only"`
		} `json:"scopes"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Scopes) != 1 {
		t.Fatalf("GET scopes = %s", w.Body)
	}
	s := out.Scopes[0]
	if s.Scope != "global" || s.Combined != 0.95 || s.Pushed == nil || *s.Pushed != 0.95 || s.Replicas["r"] != 0.1 ||
		s.Level != 2 || strings.Join(s.Shed, ",") != "free" || strings.Join(s.AdmitOnly, ",") != "premium" {
		t.Errorf("GET = %s", w.Body)
	}
	if w := do(h, http.MethodGet, "", ""); w.Code != 401 {
		t.Errorf("GET without token = %d, want 401", w.Code)
	}
	if w := do(h, http.MethodDelete, "Bearer "+token, ""); w.Code != 405 || w.Header().Get("Allow") != "GET, PUT" {
		t.Errorf("DELETE = %d Allow %q, want 405", w.Code, w.Header().Get("Allow"))
	}
}

// TestHandlerTokenRotation: a new token in the file takes effect, the old
// one stops working, and a short or emptied file locks everyone out.
func TestHandlerTokenRotation(t *testing.T) {
	t.Parallel()
	h, _, _, file := newHandler(t)
	body := `{"scope":"global","pressure":0.5}`
	if w := do(h, http.MethodPut, "Bearer "+token, body); w.Code != 204 {
		t.Fatalf("before rotation: %d", w.Code)
	}
	if err := os.WriteFile(file, []byte("a-much-longer-new-token-of-32-bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	if w := do(h, http.MethodPut, "Bearer "+token, body); w.Code != 401 {
		t.Errorf("old token after rotation = %d, want 401", w.Code)
	}
	if w := do(h, http.MethodPut, "Bearer a-much-longer-new-token-of-32-bytes", body); w.Code != 204 {
		t.Errorf("new token = %d, want 204", w.Code)
	}
	if err := os.WriteFile(file, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if w := do(h, http.MethodPut, "Bearer x", body); w.Code != 401 {
		t.Errorf("a 1-byte token rotated in = %d, want 401", w.Code)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if w := do(h, http.MethodPut, "Bearer ", body); w.Code != 401 {
		t.Errorf("empty token file, empty bearer = %d, want 401", w.Code)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if w := do(h, http.MethodPut, "Bearer a-much-longer-new-token-of-32-bytes", body); w.Code != 401 {
		t.Errorf("missing token file = %d, want 401", w.Code)
	}
}

func TestNewHandlerErrors(t *testing.T) {
	t.Parallel()
	_, c, _, file := newHandler(t)
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte(token[:MinTokenBytes-1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		give HandlerConfig
	}{
		{name: "NoCombiner", give: HandlerConfig{TokenFile: file, DefaultTTL: time.Minute}},
		{name: "NoTTL", give: HandlerConfig{Combiner: c, TokenFile: file}},
		{name: "TTLAboveMax", give: HandlerConfig{Combiner: c, TokenFile: file, DefaultTTL: time.Hour, MaxTTL: time.Minute}},
		{name: "MissingFile", give: HandlerConfig{Combiner: c, TokenFile: file + ".none", DefaultTTL: time.Minute}},
		{name: "EmptyFile", give: HandlerConfig{Combiner: c, TokenFile: empty, DefaultTTL: time.Minute}},
		{name: "ShortToken", give: HandlerConfig{Combiner: c, TokenFile: short, DefaultTTL: time.Minute}},
	}
	for _, tt := range tests {
		if _, err := NewHandler(tt.give); err == nil {
			t.Errorf("%s: NewHandler = nil error", tt.name)
		}
	}
}
