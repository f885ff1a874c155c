package pressure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Defaults of PromConfig.
const (
	DefaultPromInterval = 15 * time.Second
	DefaultPromTimeout  = 5 * time.Second
)

// maxPromBody bounds the response read: a pressure query returns a few
// samples, and a runaway query must not fill the replica's memory.
const maxPromBody = 1 << 20

// HTTPDoer sends HTTP requests; *http.Client is one.
type HTTPDoer interface {
	Do(*http.Request) (*http.Response, error)
}

var _ HTTPDoer = (*http.Client)(nil)

// PromConfig configures a PromQuery.
type PromConfig struct {
	// URL is Prometheus' base URL, such as http://prometheus:9090
	// (Required); the query goes to {URL}/api/v1/query.
	URL string
	// Query is a PromQL instant query (Required). Its largest sample,
	// clamped to [0,1], is the score. A query that can return no sample
	// (a missing series) should say what that means, such as
	// `max(x) or vector(0)`: an empty result is an error.
	Query string
	// Interval is the polling interval (Optional, default 15s).
	Interval time.Duration
	// Timeout bounds one query (Optional, default 5s, at most Interval);
	// Prometheus is told it too.
	Timeout time.Duration
	// MaxAge is how long a result counts (Optional, default 3 x
	// Interval): past it the score is 0.
	MaxAge time.Duration
	// Scope is the scope the score is for, named in errors (Optional).
	Scope string
	// Client sends the queries (Optional, default a new http.Client).
	Client HTTPDoer
	// Clock (Optional, default limit.SystemClock).
	Clock limit.Clock
	// OnError is told of each failed query (Optional); the composition
	// root logs and counts them.
	OnError func(scope string, err error)
}

// PromQuery is a Signal polled from Prometheus: the score of its last
// good result while that is under MaxAge old, else 0.
//
// It fails open: when Prometheus is down, slow, or answers nothing
// usable, the score falls to 0 after MaxAge rather than holding the last
// one. Pressure only ever takes capacity away, so a monitoring outage
// holding a high score would shed paying traffic for as long as the
// outage lasts, for no reason the gateway can see; the local signals
// (in flight, latency, errors) still protect the replica meanwhile.
type PromQuery struct {
	cfg      PromConfig
	endpoint string

	mu    sync.Mutex // guards last
	last  PromState
	fails atomic.Uint64
}

var _ Signal = (*PromQuery)(nil)

// PromState is a PromQuery's last results.
type PromState struct {
	// Value is the last good result, At when it was taken (zero before
	// the first).
	Value float64
	At    time.Time
	// Err is the last query's error, nil if it succeeded; ErrAt is when
	// it failed.
	Err   error
	ErrAt time.Time
	// Failures counts the failed queries since NewPromQuery.
	Failures uint64
}

// NewPromQuery checks cfg and returns a PromQuery that has no result yet
// (it scores 0 until its first good query).
func NewPromQuery(cfg PromConfig) (*PromQuery, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultPromInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = min(DefaultPromTimeout, cfg.Interval)
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = 3 * cfg.Interval
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Clock == nil {
		cfg.Clock = limit.SystemClock{}
	}
	var errs []error
	u, err := url.Parse(cfg.URL)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("prometheus: url: %w", err))
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		errs = append(errs, fmt.Errorf("prometheus: url %q is not http(s)://host[:port][/path]", cfg.URL))
	}
	if cfg.Query == "" {
		errs = append(errs, errors.New("prometheus: no query"))
	}
	if cfg.Interval < time.Millisecond {
		errs = append(errs, fmt.Errorf("prometheus: interval %v is under 1ms", cfg.Interval))
	}
	if cfg.Timeout <= 0 || cfg.Timeout > cfg.Interval {
		errs = append(errs, fmt.Errorf("prometheus: timeout %v is not in (0, interval %v]", cfg.Timeout, cfg.Interval))
	}
	if cfg.MaxAge < cfg.Interval {
		errs = append(errs, fmt.Errorf("prometheus: max age %v is under interval %v", cfg.MaxAge, cfg.Interval))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	q := u.JoinPath("api", "v1", "query")
	q.RawQuery = url.Values{
		"query": {cfg.Query},
		// Seconds: Prometheus' durations ("200ms") take no fractions.
		"timeout": {strconv.FormatFloat(cfg.Timeout.Seconds(), 'f', -1, 64)},
	}.Encode()
	return &PromQuery{cfg: cfg, endpoint: q.String()}, nil
}

// Run polls at once and then every Interval until ctx ends.
func (p *PromQuery) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		_ = p.Poll(ctx) // recorded, and told to OnError
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll runs the query once and records its result or error, unless ctx
// ended.
func (p *PromQuery) Poll(ctx context.Context) error {
	v, err := p.query(ctx)
	if err != nil && ctx.Err() != nil {
		return err // shutting down: not Prometheus' failure
	}
	now := p.cfg.Clock.Now()
	p.mu.Lock()
	if err == nil {
		p.last.Value, p.last.At, p.last.Err = v, now, nil
	} else {
		err = fmt.Errorf("prometheus query for scope %q: %w", p.cfg.Scope, err)
		p.last.Err, p.last.ErrAt = err, now
		p.fails.Add(1)
	}
	p.mu.Unlock()
	if err != nil && p.cfg.OnError != nil {
		p.cfg.OnError(p.cfg.Scope, err)
	}
	return err
}

// Score implements Signal: the last good result while it is fresh.
func (p *PromQuery) Score(now time.Time) float64 {
	p.mu.Lock()
	v, at := p.last.Value, p.last.At
	p.mu.Unlock()
	if at.IsZero() || now.Sub(at) > p.cfg.MaxAge {
		return 0
	}
	return v
}

// State returns the last results.
func (p *PromQuery) State() PromState {
	p.mu.Lock()
	st := p.last
	p.mu.Unlock()
	st.Failures = p.fails.Load()
	return st
}

func (p *PromQuery) query(ctx context.Context) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.endpoint, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close() //nolint:errcheck // the body was read; a close error loses nothing
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPromBody+1))
	if err != nil {
		return 0, fmt.Errorf("read response: %w", err)
	}
	if len(body) > maxPromBody {
		return 0, fmt.Errorf("response is over %d bytes", maxPromBody)
	}
	return parsePromResponse(resp.StatusCode, body)
}

// promResponse is the envelope of Prometheus' HTTP API.
type promResponse struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	} `json:"data"`
}

// promSample is [unix seconds, "value"].
type promSample [2]any

// parsePromResponse reads an instant query's answer: the largest sample
// of a vector, or a scalar, clamped to [0,1]. An empty vector, a NaN or
// an infinite sample is an error.
func parsePromResponse(status int, body []byte) (float64, error) {
	var r promResponse
	jerr := json.Unmarshal(body, &r)
	switch {
	case status/100 != 2 && jerr == nil && r.Status == "error":
		return 0, fmt.Errorf("status %d: %s: %s", status, r.ErrorType, r.Error)
	case status/100 != 2:
		return 0, fmt.Errorf("status %d", status)
	case jerr != nil:
		return 0, fmt.Errorf("decode response: %w", jerr)
	case r.Status != "success":
		return 0, fmt.Errorf("status %q: %s: %s", r.Status, r.ErrorType, r.Error)
	}
	var samples []promSample
	switch r.Data.ResultType {
	case "vector":
		var vec []struct {
			Value promSample `json:"value"`
		}
		if err := json.Unmarshal(r.Data.Result, &vec); err != nil {
			return 0, fmt.Errorf("decode vector: %w", err)
		}
		for _, s := range vec {
			samples = append(samples, s.Value)
		}
	case "scalar":
		var s promSample
		if err := json.Unmarshal(r.Data.Result, &s); err != nil {
			return 0, fmt.Errorf("decode scalar: %w", err)
		}
		samples = append(samples, s)
	default:
		return 0, fmt.Errorf("result type %q is not vector or scalar", r.Data.ResultType)
	}
	if len(samples) == 0 {
		return 0, errors.New("empty result")
	}
	out := math.Inf(-1)
	for _, s := range samples {
		str, ok := s[1].(string)
		if !ok {
			return 0, fmt.Errorf("sample value %v is not a string", s[1])
		}
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return 0, fmt.Errorf("sample value: %w", err)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("sample value %s is not finite", str)
		}
		out = max(out, v)
	}
	return min(max(out, 0), 1), nil
}
