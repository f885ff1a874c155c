package pressure

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// promServer answers every request with status and body.
func promServer(t testing.TB, status int, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func promQuery(t testing.TB, cfg PromConfig) *PromQuery {
	t.Helper()
	if cfg.Query == "" {
		cfg.Query = "max(tollgate_test_pressure)"
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	p, err := NewPromQuery(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func promVector(values ...string) string {
	var parts []string
	for i, v := range values {
		parts = append(parts, `{"metric":{"pod":"p`+string(rune('0'+i))+`"},"value":[1700000000.123,"`+v+`"]}`)
	}
	return `{"status":"success","data":{"resultType":"vector","result":[` + strings.Join(parts, ",") + `]}}`
}

func TestPromPoll(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int
		body    string
		want    float64
		wantErr string // substring; "" for none
	}{
		{name: "Vector", status: 200, body: promVector("0.4", "0.7", "0.2"), want: 0.7},
		{name: "VectorOne", status: 200, body: promVector("0.8"), want: 0.8},
		{name: "VectorOverOne", status: 200, body: promVector("0.4", "3.5"), want: 1},
		{name: "VectorNegative", status: 200, body: promVector("-2"), want: 0},
		{name: "Scalar", status: 200, body: `{"status":"success","data":{"resultType":"scalar","result":[1700000000,"0.25"]}}`, want: 0.25},
		{name: "EmptyVector", status: 200, body: promVector(), wantErr: "empty result"},
		{name: "NaN", status: 200, body: promVector("0.5", "NaN"), wantErr: "NaN is not finite"},
		{name: "Inf", status: 200, body: promVector("+Inf"), wantErr: "+Inf is not finite"},
		{name: "NotANumber", status: 200, body: promVector("high"), wantErr: "sample value"},
		{name: "NumberNotString", status: 200, body: `{"status":"success","data":{"resultType":"scalar","result":[1700000000,0.5]}}`, wantErr: "is not a string"},
		{name: "Matrix", status: 200, body: `{"status":"success","data":{"resultType":"matrix","result":[]}}`, wantErr: `result type "matrix"`},
		{
			name: "BadQuery", status: 400,
			body:    `{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}`,
			wantErr: "status 400: bad_data: 1:5: parse error",
		},
		{name: "Unavailable", status: 503, body: "Service Unavailable", wantErr: "status 503"},
		{name: "ErrorWith200", status: 200, body: `{"status":"error","errorType":"execution","error":"boom"}`, wantErr: `status "error": execution: boom`},
		{name: "BadJSON", status: 200, body: `{"status":"success","data":`, wantErr: "decode response"},
		{name: "BadVector", status: 200, body: `{"status":"success","data":{"resultType":"vector","result":{}}}`, wantErr: "decode vector"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := promServer(t, tt.status, tt.body)
			clock := storetest.NewFakeClock(t0)
			var told atomic.Int32
			p := promQuery(t, PromConfig{
				URL: srv.URL, Client: srv.Client(), Clock: clock, Scope: "global",
				OnError: func(scope string, err error) {
					if scope != "global" {
						t.Errorf("OnError scope = %q", scope)
					}
					told.Add(1)
				},
			})
			err := p.Poll(context.Background())
			st := p.State()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Poll() = %v, want an error with %q", err, tt.wantErr)
				}
				if st.Failures != 1 || st.Err == nil || !st.At.IsZero() || told.Load() != 1 {
					t.Errorf("State = %+v, OnError told %d times; want one failure and no value", st, told.Load())
				}
				if got := p.Score(t0); got != 0 {
					t.Errorf("Score = %v, want 0", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Poll() = %v", err)
			}
			if got := p.Score(t0); got != tt.want {
				t.Errorf("Score = %v, want %v", got, tt.want)
			}
			if st.Failures != 0 || st.Err != nil || !st.At.Equal(t0) {
				t.Errorf("State = %+v", st)
			}
		})
	}
}

func TestPromRequest(t *testing.T) {
	t.Parallel()
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		_, _ = w.Write([]byte(promVector("0.5")))
	}))
	t.Cleanup(srv.Close)
	p := promQuery(t, PromConfig{URL: srv.URL + "/prom/", Query: `max(x{a="b c"}) or promVector(0)`, Timeout: 500 * time.Millisecond, Client: srv.Client()})
	if err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.Method != http.MethodGet || r.URL.Path != "/prom/api/v1/query" {
		t.Errorf("request = %s %s, want GET /prom/api/v1/query", r.Method, r.URL.Path)
	}
	if q, to := r.URL.Query().Get("query"), r.URL.Query().Get("timeout"); q != `max(x{a="b c"}) or promVector(0)` || to != "0.5" {
		t.Errorf("query = %q, timeout = %q", q, to)
	}
}

func TestPromTimeout(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the client gives up first
	}))
	t.Cleanup(srv.Close)
	p := promQuery(t, PromConfig{URL: srv.URL, Timeout: 20 * time.Millisecond, Client: srv.Client()})
	err := p.Poll(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Poll() = %v, want a deadline exceeded", err)
	}
	if st := p.State(); st.Failures != 1 {
		t.Errorf("Failures = %d, want 1", st.Failures)
	}
}

// TestPromStale checks that a result counts for MaxAge, through failed
// queries, and then scores 0 (failing open).
func TestPromStale(t *testing.T) {
	t.Parallel()
	var body atomic.Value
	body.Store(promVector("0.9"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	t.Cleanup(srv.Close)
	clock := storetest.NewFakeClock(t0)
	p := promQuery(t, PromConfig{URL: srv.URL, Interval: 10 * time.Second, Client: srv.Client(), Clock: clock})
	if got := p.Score(t0); got != 0 {
		t.Errorf("Score before any poll = %v, want 0", got)
	}
	if err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	body.Store("not json")
	for range 3 {
		clock.Advance(10 * time.Second)
		if err := p.Poll(context.Background()); err == nil {
			t.Fatal("Poll of bad JSON: no error")
		}
	}
	tests := []struct {
		name string
		give time.Duration
		want float64
	}{
		{name: "Fresh", give: 0, want: 0.9},
		{name: "AtMaxAge", give: 30 * time.Second, want: 0.9},
		{name: "Stale", give: 30*time.Second + time.Nanosecond, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Score(t0.Add(tt.give)); got != tt.want {
				t.Errorf("Score(t0+%v) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
	st := p.State()
	if st.Failures != 3 || st.Err == nil || !st.ErrAt.Equal(t0.Add(30*time.Second)) || st.Value != 0.9 || !st.At.Equal(t0) {
		t.Errorf("State = %+v", st)
	}
	// A good result resets the error.
	body.Store(promVector("0.1"))
	if err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, st := p.Score(clock.Now()), p.State(); got != 0.1 || st.Err != nil || st.Failures != 3 {
		t.Errorf("after recovery: Score = %v, State = %+v", got, st)
	}
}

// doerFunc is an in-memory HTTPDoer.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// TestPromRun checks that Run polls at once and on its interval, and
// returns (leaving no goroutine, per goleak) when ctx ends.
func TestPromRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var polls atomic.Int32
		client := doerFunc(func(r *http.Request) (*http.Response, error) {
			polls.Add(1)
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(promVector("0.6")))}, nil
		})
		p := promQuery(t, PromConfig{URL: "http://prometheus:9090", Interval: 10 * time.Second, Client: client})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.Run(ctx)
		}()
		time.Sleep(25 * time.Second) // the bubble's fake clock
		synctest.Wait()
		if got := polls.Load(); got != 3 {
			t.Errorf("%d polls in 25s of a 10s interval, want 3", got)
		}
		cancel()
		<-done
		if got := p.Score(time.Now()); got != 0.6 {
			t.Errorf("Score = %v, want 0.6", got)
		}
		if st := p.State(); st.Failures != 0 {
			t.Errorf("Failures = %d after a cancelled Run, want 0: %v", st.Failures, st.Err)
		}
	})
}

func TestNewPromQueryErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give PromConfig
		want string // substring of the error; "" for none
	}{
		{name: "Defaults", give: PromConfig{URL: "http://prometheus:9090", Query: "up"}},
		{name: "NoURL", give: PromConfig{Query: "up"}, want: `url "" is not http(s)`},
		{name: "NotHTTP", give: PromConfig{URL: "ftp://x", Query: "up"}, want: `url "ftp://x" is not http(s)`},
		{name: "BadURL", give: PromConfig{URL: "http://[::1", Query: "up"}, want: "prometheus: url:"},
		{name: "NoQuery", give: PromConfig{URL: "http://p"}, want: "no query"},
		{name: "TimeoutOverInterval", give: PromConfig{URL: "http://p", Query: "up", Interval: time.Second, Timeout: 2 * time.Second}, want: "timeout 2s is not in (0, interval 1s]"},
		{name: "MaxAgeUnderInterval", give: PromConfig{URL: "http://p", Query: "up", MaxAge: time.Second}, want: "max age 1s is under interval 15s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewPromQuery(tt.give)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("err = %v, want none", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// FuzzParsePromResponse checks that any answer parses to a score in
// [0,1] or an error, never a panic.
func FuzzParsePromResponse(f *testing.F) {
	for _, seed := range []string{
		promVector("0.4", "0.7"),
		promVector(),
		promVector("NaN"),
		`{"status":"success","data":{"resultType":"scalar","result":[1700000000,"0.25"]}}`,
		`{"status":"success","data":{"resultType":"scalar","result":[1700000000,0.25]}}`,
		`{"status":"success","data":{"resultType":"matrix","result":[]}}`,
		`{"status":"error","errorType":"bad_data","error":"parse error"}`,
		`{"status":"success","data":`,
		`null`,
	} {
		f.Add(200, []byte(seed))
	}
	f.Add(400, []byte(`{"status":"error","errorType":"bad_data","error":"x"}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		v, err := parsePromResponse(status, body)
		if err == nil && !(v >= 0 && v <= 1) {
			t.Errorf("parsePromResponse(%d, %q) = %v, not in [0,1]", status, body, v)
		}
	})
}
