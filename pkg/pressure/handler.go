package pressure

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// HandlerConfig configures the pressure admin endpoint.
type HandlerConfig struct {
	// Combiner gives the board, the clock, the known scopes and the state
	// GET reports (Required).
	Combiner *Combiner
	// TokenFile holds the bearer token (Required). It is read again when
	// its size or modification time changes, so a rotated secret takes
	// effect without a restart; surrounding whitespace is ignored.
	TokenFile string
	// DefaultTTL is a push's life when the body names none (Required).
	DefaultTTL time.Duration
	// MaxTTL caps a push's ttl (Optional, default 1h), so a forgotten
	// push cannot shed for days.
	MaxTTL time.Duration
}

// maxBody bounds a PUT body.
const maxBody = 4 << 10

// NewHandler returns the handler of /v1/pressure:
//
//	PUT /v1/pressure  {"scope":"global","pressure":0.85,"ttl":"60s"}
//	                  pushes a score (ttl optional) -> 204
//	GET /v1/pressure  every scope's last reading and active step -> 200
//
// Both need "Authorization: Bearer <token>" (401 otherwise). A PUT with
// bad JSON, an unknown field, a pressure outside [0,1], an unknown scope
// or a ttl outside (0, MaxTTL] gets 400. The token is compared in
// constant time and is never logged or echoed. It fails when the token
// file cannot be read or holds under MinTokenBytes.
func NewHandler(cfg HandlerConfig) (http.Handler, error) {
	if cfg.Combiner == nil {
		return nil, errors.New("pressure handler: no combiner")
	}
	if cfg.DefaultTTL <= 0 {
		return nil, fmt.Errorf("pressure handler: default ttl %v is not positive", cfg.DefaultTTL)
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.DefaultTTL > cfg.MaxTTL {
		return nil, fmt.Errorf("pressure handler: default ttl %v is above max ttl %v", cfg.DefaultTTL, cfg.MaxTTL)
	}
	h := &handler{cfg: cfg, token: tokenFile{path: cfg.TokenFile}}
	if _, err := h.token.digest(); err != nil {
		return nil, fmt.Errorf("pressure handler: %w", err)
	}
	return h, nil
}

type handler struct {
	cfg   HandlerConfig
	token tokenFile
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodPut {
		w.Header().Set("Allow", "GET, PUT")
		httpError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate"`)
		httpError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	if r.Method == http.MethodGet {
		h.get(w)
		return
	}
	h.put(w, r)
}

func (h *handler) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" {
		return false
	}
	want, err := h.token.digest()
	if err != nil {
		return false
	}
	d := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(d[:], want[:]) == 1
}

type pushBody struct {
	Scope    string   `json:"scope"`
	Pressure *float64 `json:"pressure"`
	TTL      string   `json:"ttl"`
}

func (h *handler) put(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		httpError(w, http.StatusBadRequest, "body too large or unreadable")
		return
	}
	var b pushBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		httpError(w, http.StatusBadRequest, "bad JSON: "+err.Error())
		return
	}
	if dec.More() {
		httpError(w, http.StatusBadRequest, "bad JSON: data after the object")
		return
	}
	c := h.cfg.Combiner
	ttl := h.cfg.DefaultTTL
	switch {
	case b.Scope == "":
		httpError(w, http.StatusBadRequest, "scope: required")
		return
	case c.Evaluator(b.Scope) == nil:
		httpError(w, http.StatusBadRequest, fmt.Sprintf("scope: %q is not a configured scope", b.Scope))
		return
	case b.Pressure == nil:
		httpError(w, http.StatusBadRequest, "pressure: required")
		return
	case math.IsNaN(*b.Pressure) || *b.Pressure < 0 || *b.Pressure > 1:
		httpError(w, http.StatusBadRequest, fmt.Sprintf("pressure: %v is not in [0,1]", *b.Pressure))
		return
	case b.TTL != "":
		d, err := time.ParseDuration(b.TTL)
		if err != nil || d < time.Millisecond || d > h.cfg.MaxTTL {
			httpError(w, http.StatusBadRequest, fmt.Sprintf("ttl: %q is not a duration in [1ms, %v]", b.TTL, h.cfg.MaxTTL))
			return
		}
		ttl = d
	}
	if err := c.cfg.Board.Push(r.Context(), c.cfg.Clock.Now(), b.Scope, *b.Pressure, ttl); err != nil {
		// The store's error stays in OnError; the answer carries none.
		c.fail(b.Scope, err)
		httpError(w, http.StatusServiceUnavailable, "store unavailable")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ScopeView is a scope's live state as GET /v1/pressure and pkg/app's
// /debug/pressure show it.
type ScopeView struct {
	Scope     string             `json:"scope"`
	Combined  float64            `json:"combined"`
	Local     float64            `json:"local"`
	Replicas  map[string]float64 `json:"replicas"`
	Pushed    *float64           `json:"pushed,omitempty"`
	At        time.Time          `json:"at"`
	Stale     bool               `json:"stale"`
	Level     int                `json:"level"`
	Shadow    bool               `json:"shadow"`
	Factor    float64            `json:"factor"`
	NoBurst   bool               `json:"no_burst"`
	Shed      []string           `json:"shed"`
	AdmitOnly []string           `json:"admit_only,omitempty"`
	// Since is when the active step was entered or left (the hold runs
	// from it); StepBy the replica that computed the step when shared;
	// StepsLocal that this reading's step was evaluated alone.
	Since      time.Time `json:"since"`
	StepBy     string    `json:"step_by,omitempty"`
	StepsLocal bool      `json:"steps_local"`
}

// View renders s. Shed lists the tiers the active steps name in shed or,
// when tiers (a domain's plans) is given, each of those the outcome
// refuses, admit_only included.
func (s ScopeState) View(tiers []string) ScopeView {
	v := ScopeView{
		Scope: s.Scope, Combined: s.Combined, Local: s.Local, Replicas: map[string]float64{},
		At: s.At, Stale: s.Stale, Level: s.Outcome.Level, Shadow: s.Outcome.Shadow,
		Factor: s.Outcome.Factor, NoBurst: s.Outcome.NoBurst, Shed: []string{},
		Since: s.Step.Since, StepBy: s.Step.By, StepsLocal: s.StepsLocal,
	}
	if tiers == nil {
		v.Shed = append(v.Shed, s.Outcome.shed...)
	}
	for _, t := range tiers {
		if s.Outcome.Sheds(t) {
			v.Shed = append(v.Shed, t)
		}
	}
	if s.Outcome.restricted {
		v.AdmitOnly = append([]string{}, s.Outcome.admitOnly...)
	}
	for _, r := range s.Replicas {
		v.Replicas[r.Replica] = r.Score
	}
	if s.HasPushed {
		v.Pushed = &s.Pushed
	}
	return v
}

func (h *handler) get(w http.ResponseWriter) {
	var out struct {
		Scopes []ScopeView `json:"scopes"`
	}
	for _, s := range h.cfg.Combiner.Snapshot() {
		out.Scopes = append(out.Scopes, s.View(nil))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// MinTokenBytes is the shortest bearer token accepted: as many bytes as a
// random 256-bit key, so that guessing it over the network is hopeless.
const MinTokenBytes = 32

// tokenFile is the bearer token's file and the digest of its content,
// read again when the file's size or modification time changes.
type tokenFile struct {
	path string

	mu      sync.Mutex
	size    int64
	modTime time.Time
	sum     [sha256.Size]byte
	ok      bool
}

func (t *tokenFile) digest() ([sha256.Size]byte, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("token file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ok && fi.Size() == t.size && fi.ModTime().Equal(t.modTime) {
		return t.sum, nil
	}
	raw, err := os.ReadFile(t.path)
	if err != nil {
		t.ok = false
		return [sha256.Size]byte{}, fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		t.ok = false
		return [sha256.Size]byte{}, fmt.Errorf("token file %q is empty", t.path)
	}
	if n := len(tok); n < MinTokenBytes {
		// A short token rotated in locks everyone out rather than
		// letting a guessable one in.
		t.ok = false
		return [sha256.Size]byte{}, fmt.Errorf("token file %q: the token is %d bytes, want at least %d", t.path, n, MinTokenBytes)
	}
	t.sum, t.size, t.modTime, t.ok = sha256.Sum256([]byte(tok)), fi.Size(), fi.ModTime(), true
	return t.sum, nil
}
