package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

func (s *Server) adminHandler() (h http.Handler, err error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{
		ErrorLog: zap.NewStdLog(s.log.Named("metrics")),
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		var detail string
		if s.cfg.ReadyDetail != nil {
			if d := strings.TrimRight(s.cfg.ReadyDetail(), "\n"); d != "" {
				detail = "\n" + d
			}
		}
		if err := s.ready(r.Context()); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+oneLine(err.Error())+detail)
			return
		}
		writeText(w, http.StatusOK, "ok"+detail)
	})
	mux.HandleFunc("GET /debug/config", func(w http.ResponseWriter, _ *http.Request) {
		if s.cfg.DebugConfig == nil {
			http.NotFound(w, nil)
			return
		}
		b, err := json.MarshalIndent(s.cfg.DebugConfig(), "", "  ")
		if err != nil {
			s.log.Error("render /debug/config", zap.Error(err))
			writeText(w, http.StatusInternalServerError, "cannot render the config")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	})
	if s.cfg.Pprof {
		// The handlers net/http/pprof's init puts on http.DefaultServeMux,
		// which nothing here serves; Index serves the named profiles
		// (heap, goroutine, allocs, block, mutex, threadcreate).
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", s.cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	// ServeMux panics on a clashing or malformed pattern.
	defer func() {
		if r := recover(); r != nil {
			h, err = nil, fmt.Errorf("server: admin route: %v", r)
		}
	}()
	for _, pattern := range slices.Sorted(maps.Keys(s.cfg.Admin)) {
		mux.Handle(pattern, s.cfg.Admin[pattern])
	}
	if s.cfg.DebugToken == "" {
		return mux, nil
	}
	return debugAuth(s.cfg.DebugToken, mux), nil
}

// cmdline serves Config.Cmdline as net/http/pprof's cmdline does:
// NUL-separated arguments.
func (s *Server) cmdline(w http.ResponseWriter, _ *http.Request) {
	args := s.cfg.Cmdline
	if args == nil {
		args = os.Args[:1]
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(strings.Join(args, "\x00"))) //nolint:gosec // G705: text/plain with nosniff, never rendered as HTML
}

// debugAuth has every path under /debug/ need "Authorization: Bearer
// token"; the rest of next (/metrics, the probes, routes with tokens of
// their own) stays open. The path is cleaned first, so that no spelling
// of a /debug/ path slips past and reaches the mux, which cleans it too.
func debugAuth(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := path.Clean("/" + r.URL.Path); p == "/debug" || strings.HasPrefix(p, "/debug/") {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			// Digests of equal length, so the compare takes the same time
			// whatever the length of what was sent.
			sum := sha256.Sum256([]byte(got))
			if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate-debug"`)
				writeText(w, http.StatusUnauthorized, "a bearer token is required")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg + "\n"))
}

// oneLine keeps a reason on one line, as probes and humans read the first.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
