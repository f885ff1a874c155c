package upstream

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// discard is a ResponseWriter that keeps nothing, so that the benchmark
// measures the upstream, not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) Flush()                      {}

// BenchmarkChat is the CPU one request of the default mix costs the
// upstream's handler (parse, schedule, account, encode), with no service
// time, so that no timer or sleep is measured.
func BenchmarkChat(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			u := newUpstream(b, fixed(0))
			body := ChatBody("m", MixPromptChars, MixMaxTokens, stream)
			rd := bytes.NewReader(body)
			req := httptest.NewRequest(http.MethodPost, ChatPath, io.NopCloser(rd))
			req.Header.Set(TenantHeader, "bench")
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(body)
				u.ServeHTTP(w, req)
			}
			if st := u.Stats(); st.Totals.Served != st.Totals.Received {
				b.Fatalf("not all served: %+v", st.Totals)
			}
		})
	}
}

// BenchmarkChatHTTP is one request over loopback HTTP/1.1, client and
// server both: what the bench pays per request on the machine's cores.
func BenchmarkChatHTTP(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			u := newUpstream(b, fixed(0))
			url, c := serve(b, u)
			body := ChatBody("m", MixPromptChars, MixMaxTokens, stream)
			b.ReportAllocs()
			for b.Loop() {
				resp := post(b, b.Context(), c, url, body, "bench")
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
