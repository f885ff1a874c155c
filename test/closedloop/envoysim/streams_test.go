package envoysim

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/test/closedloop"
)

// TestBatchByInterval: entries wait for the flush timer and go in one
// message; the identifier is on the stream's first message only.
func TestBatchByInterval(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(usageJSON)) })
	tick := make(manualTick)
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{f.addr}, Upstream: up.URL, Instances: 1, tick: tick.tick, unbufferedLog: true})
	for range 3 {
		g.Do(context.Background(), chatRequest(`{}`))
	}
	tick <- time.Now()
	f.waitFor(t, "a batch", func(f *fakeTollgate) bool { return f.entries() == 3 })
	g.Do(context.Background(), chatRequest(`{}`))
	tick <- time.Now()
	f.waitFor(t, "a second batch", func(f *fakeTollgate) bool { return f.entries() == 4 })

	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.alsLogs) != 1 || len(f.alsLogs[0]) != 2 {
		t.Fatalf("streams %d, messages %v: want one stream with two messages", len(f.alsLogs), len(f.alsLogs))
	}
	msgs := f.alsLogs[0]
	if n := len(msgs[0].GetHttpLogs().GetLogEntry()); n != 3 {
		t.Errorf("first message holds %d entries, want 3", n)
	}
	if id := msgs[0].GetIdentifier(); id.GetLogName() != "tollgate" || id.GetNode().GetId() != "envoysim-0" {
		t.Errorf("first identifier = %v", id)
	}
	if msgs[1].GetIdentifier() != nil {
		t.Errorf("second message has an identifier: %v", msgs[1].GetIdentifier())
	}
	if s := g.Stats(); s.AccessLogMessages != 2 || s.AccessLogEntries != 4 || s.AccessLogStreams != 1 {
		t.Errorf("stats = %+v", s)
	}
}

// TestBatchBySize: a batch goes as soon as it reaches buffer_size_bytes,
// without waiting for the timer (which never fires here).
func TestBatchBySize(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(usageJSON)) })
	// Entries here are a few hundred bytes: 700 makes two per batch.
	boot := variant(t, authzBootstrap, "buffer_size_bytes: 65536", "buffer_size_bytes: 700")
	tick := make(manualTick)
	g := newGateway(t, Config{Bootstrap: boot, Replicas: []string{f.addr}, Upstream: up.URL, Instances: 1, tick: tick.tick, unbufferedLog: true})
	var sizes []int
	for range 4 {
		g.Do(context.Background(), chatRequest(`{}`))
	}
	f.waitFor(t, "two batches", func(f *fakeTollgate) bool { return f.entries() == 4 })
	f.mu.Lock()
	for _, m := range f.alsLogs[0] {
		sizes = append(sizes, len(m.GetHttpLogs().GetLogEntry()))
		for _, e := range m.GetHttpLogs().GetLogEntry() {
			if s := entrySize(e); s < 350 || s >= 700 {
				t.Errorf("entry of %d bytes: the test assumes 350-699", s)
			}
		}
	}
	f.mu.Unlock()
	if d := cmp.Diff([]int{2, 2}, sizes); d != "" {
		t.Errorf("entries per message (-want +got):\n%s", d)
	}
}

// TestStreamPerInstance: each instance keeps one access log stream, to
// replica (instance mod replicas), and sends its Checks round robin.
func TestStreamPerInstance(t *testing.T) {
	t.Parallel()
	fs := []*fakeTollgate{startFake(t), startFake(t)}
	up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(usageJSON)) })
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{fs[0].addr, fs[1].addr}, Upstream: up.URL, Instances: 3})
	for range 12 {
		g.Do(context.Background(), chatRequest(`{}`))
	}
	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got := map[string][]string{}
	for i, f := range fs {
		f.waitFor(t, "entries", func(f *fakeTollgate) bool { return f.entries() == []int{8, 4}[i] })
		f.mu.Lock()
		for _, s := range f.alsLogs {
			got[f.addr] = append(got[f.addr], s[0].GetIdentifier().GetNode().GetId())
		}
		if len(f.checks) != 6 {
			t.Errorf("replica %d got %d checks, want 6", i, len(f.checks))
		}
		f.mu.Unlock()
	}
	want := map[string][]string{fs[0].addr: {"envoysim-0", "envoysim-2"}, fs[1].addr: {"envoysim-1"}}
	if d := cmp.Diff(want, got, cmpSorted()); d != "" {
		t.Errorf("streams by replica (-want +got):\n%s", d)
	}
}

// TestMaxRetries: x-envoy-max-retries set by Check is honoured when a
// retry condition is in force, within the cluster's retry breaker: the
// shipped retry_budget, or a max_retries threshold in its place.
func TestMaxRetries(t *testing.T) {
	t.Parallel()
	const shippedBudget = "retry_budget:\n          budget_percent: { value: 20.0 }\n          min_retry_concurrency: 3"
	tests := []struct {
		name         string
		giveBoot     []string // replacements in envoy-ext-authz.yaml
		giveHeaders  map[string]string
		wantAttempts int
		wantFlags    *datav3.ResponseFlags
	}{
		{
			name:         "no retry condition for a 503",
			giveBoot:     []string{shippedBudget, "max_retries: 3"},
			giveHeaders:  map[string]string{"x-envoy-max-retries": "2"},
			wantAttempts: 1,
		},
		{
			name:         "two retries",
			giveBoot:     []string{shippedBudget, "max_retries: 3"},
			giveHeaders:  map[string]string{"x-envoy-retry-on": "5xx", "x-envoy-max-retries": "2"},
			wantAttempts: 3,
			wantFlags:    &datav3.ResponseFlags{UpstreamRetryLimitExceeded: true},
		},
		{
			name:         "zero retries",
			giveBoot:     []string{shippedBudget, "max_retries: 3"},
			giveHeaders:  map[string]string{"x-envoy-retry-on": "5xx", "x-envoy-max-retries": "0"},
			wantAttempts: 1,
			wantFlags:    &datav3.ResponseFlags{UpstreamRetryLimitExceeded: true},
		},
		{
			name:         "a max_retries breaker of 0 allows none",
			giveBoot:     []string{shippedBudget, "max_retries: 0"},
			giveHeaders:  map[string]string{"x-envoy-retry-on": "5xx", "x-envoy-max-retries": "2"},
			wantAttempts: 1,
			wantFlags:    &datav3.ResponseFlags{UpstreamOverflow: true},
		},
		{
			// One request in flight: 20% of it is under the budget's
			// minimum of 3 retries in flight, so both retries run.
			name:         "the shipped budget allows a lone request its retries",
			giveHeaders:  map[string]string{"x-envoy-retry-on": "5xx", "x-envoy-max-retries": "2"},
			wantAttempts: 3,
			wantFlags:    &datav3.ResponseFlags{UpstreamRetryLimitExceeded: true},
		},
		{
			name:         "a budget with no minimum allows a lone request none",
			giveBoot:     []string{"min_retry_concurrency: 3", "min_retry_concurrency: 0"},
			giveHeaders:  map[string]string{"x-envoy-retry-on": "5xx", "x-envoy-max-retries": "2"},
			wantAttempts: 1,
			wantFlags:    &datav3.ResponseFlags{UpstreamOverflow: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := startFake(t)
			f.check = func(*authv3.CheckRequest) (*authv3.CheckResponse, error) { return okResponse(tt.giveHeaders, nil), nil }
			up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
			boot := authzBootstrap
			if tt.giveBoot != nil {
				boot = variant(t, authzBootstrap, tt.giveBoot...)
			}
			g := newGateway(t, Config{Bootstrap: boot, Replicas: []string{f.addr}, Upstream: up.URL, Instances: 1})
			res := g.Do(context.Background(), chatRequest(`{}`))
			if res.Status != 503 || res.Source != 0 || res.Attempts != tt.wantAttempts {
				t.Errorf("result = %+v, want the upstream's 503 after %d attempts", res, tt.wantAttempts)
			}
			// The header Check set is what the result records, and the
			// one replica answered the Check.
			if want, _ := strconv.Atoi(tt.giveHeaders["x-envoy-max-retries"]); res.MaxRetries != want || res.Replica != 0 || res.Check <= 0 {
				t.Errorf("result = %+v, want MaxRetries %d, Replica 0 and a Check time", res, want)
			}
			e := lastEntry(t, f, g, 1)
			if d := cmp.Diff(tt.wantFlags, e.GetCommonProperties().GetResponseFlags(), protocmp.Transform()); d != "" {
				t.Errorf("flags (-want +got):\n%s", d)
			}
			if n := e.GetCommonProperties().GetUpstreamRequestAttemptCount(); int(n) != tt.wantAttempts {
				t.Errorf("attempt count = %d, want %d", n, tt.wantAttempts)
			}
			if s := g.Stats(); s.Attempts != int64(tt.wantAttempts) || s.Retries != int64(tt.wantAttempts-1) {
				t.Errorf("stats = %+v", s)
			}
		})
	}
}

// TestRateLimitMode follows envoy/envoy.yaml: the request-phase
// descriptors from headers, OVER_LIMIT as a 429 local reply, and the
// stream-done cost report with the usage header as hits_addend.
func TestRateLimitMode(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	f.limit = func(r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		if r.GetDescriptors()[0].GetHitsAddend() != nil {
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
		}
		tenant := r.GetDescriptors()[0].GetEntries()[0].GetValue()
		if tenant == "over" {
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: []byte("slow down")}
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	}
	up := upstreamFunc(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Usage-Total-Tokens", "42")
		_, _ = w.Write([]byte(usageJSON))
	})
	g := newGateway(t, Config{Bootstrap: rlsBootstrap, Replicas: []string{f.addr}, Upstream: up.URL, Instances: 1})
	req := func(tenant string) *closedloop.Request {
		r := chatRequest(`{}`)
		r.Header.Set("X-Tenant-Id", tenant)
		r.Header.Set("X-Model", "gpt-4o")
		return r
	}
	if res := g.Do(context.Background(), req("acme")); res.Status != 200 || res.Attempts != 1 {
		t.Errorf("admitted result = %+v", res)
	}
	// A limit's 429 carries no x-tollgate-reason; the result names it.
	if res := g.Do(context.Background(), req("over")); res.Status != 429 || res.Source != closedloop.SourceTollgate || res.Attempts != 0 || res.Reason != "limit" {
		t.Errorf("limited result = %+v", res)
	}
	noTenant := chatRequest(`{}`)
	if res := g.Do(context.Background(), noTenant); res.Status != 400 || res.Source != closedloop.SourceEnvoy {
		t.Errorf("no-tenant result = %+v, want the missing_tenant route's 400", res)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	f.mu.Lock()
	calls := clone(f.rlsCalls)
	f.mu.Unlock()
	// The report is fire-and-forget, so it may land before or after the
	// next request's call.
	var phase, reports []*rlsv3.RateLimitRequest
	for _, c := range calls {
		if c.GetDescriptors()[0].GetHitsAddend() != nil {
			reports = append(reports, c)
		} else {
			phase = append(phase, c)
		}
	}
	wantPhase := []*rlsv3.RateLimitRequest{
		{Domain: "inference", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("tenant", "acme"), desc("tenant", "acme", "model", "gpt-4o"), desc("model", "gpt-4o"),
		}},
		{Domain: "inference", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("tenant", "over"), desc("tenant", "over", "model", "gpt-4o"), desc("model", "gpt-4o"),
		}},
	}
	if d := cmp.Diff(wantPhase, phase, protocmp.Transform()); d != "" {
		t.Errorf("request-phase calls (-want +got):\n%s", d)
	}
	report := desc("tenant", "acme", "model", "gpt-4o")
	report.HitsAddend = wrapperspb.UInt64(42)
	wantReports := []*rlsv3.RateLimitRequest{{Domain: "inference", Descriptors: []*ratelimitv3.RateLimitDescriptor{report}}}
	if d := cmp.Diff(wantReports, reports, protocmp.Transform()); d != "" {
		t.Errorf("stream-done reports (-want +got):\n%s", d)
	}
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func entrySize(e *datav3.HTTPAccessLogEntry) int { return proto.Size(e) }

func cmpSorted() cmp.Option {
	return cmpopts.SortSlices(func(a, b string) bool { return a < b })
}
