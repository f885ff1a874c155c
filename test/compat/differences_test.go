package compat

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// differences is a reference user's file without algorithm: fixed_window,
// for the rows of docs/migrating-from-envoy-ratelimit.md's "What behaves
// differently" that a ShouldRateLimit call shows. The other rows are
// tested where they are built (the guide names the tests).
const differences = `domain: diff
descriptors:
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: model
    value: gpt-*
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: model
    value: gpt-4*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestDifferences holds Tollgate to the differences the migration guide
// documents, on both stores: each subtest names its row.
func TestDifferences(t *testing.T) {
	t.Parallel()
	onBothStores(t, "diff", differences, func(t *testing.T, c rlsv3.RateLimitServiceClient, _ string) {
		runDifferences(t, c)
	})
}

func runDifferences(t *testing.T, c rlsv3.RateLimitServiceClient) {
	ctx := t.Context()
	ask := func(kv ...[]string) *rlsv3.RateLimitResponse {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: "diff", HitsAddend: 1}
		for _, e := range kv {
			req.Descriptors = append(req.Descriptors, desc(e...))
		}
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	t.Run("window: sliding by default", func(t *testing.T) {
		// 20 buckets of 3s: the hit leaves the count 60 to 63s from now,
		// where a fixed window would reset at the next whole minute.
		st := ask([]string{"window", "w"}).GetStatuses()[0]
		if got := st.GetDurationUntilReset().AsDuration(); got <= time.Minute || got > 63*time.Second {
			t.Errorf("reset after %v, want in (60s, 63s]: a sliding window", got)
		}
	})
	t.Run("rejected requests: all or nothing", func(t *testing.T) {
		ask([]string{"one", "full"})
		if resp := ask([]string{"one", "spare"}, []string{"one", "full"}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("a request over one=full's limit: %v, want OVER_LIMIT", resp)
		}
		// The refused request charged nothing, one=spare included.
		if st := ask([]string{"one", "spare"}).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("one=spare after a refused request: %v, want OK (the reference would have charged it)", st)
		}
	})
	t.Run("overlapping wildcards: most literal bytes first", func(t *testing.T) {
		if st := ask([]string{"model", "gpt-4o"}).GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 5 {
			t.Errorf("model=gpt-4o: %v, want gpt-4*'s 5/minute though gpt-* comes first", st)
		}
		if st := ask([]string{"model", "gpt-3"}).GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 10 {
			t.Errorf("model=gpt-3: %v, want gpt-*'s 10/minute", st)
		}
	})
	t.Run("quota_mode: an ordinary limit", func(t *testing.T) {
		ask([]string{"quota", "q"})
		if resp := ask([]string{"quota", "q"}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("a second request on a quota_mode rule of 1/minute: %v, want OVER_LIMIT", resp)
		}
	})
	t.Run("rate limit headers: always sent", func(t *testing.T) {
		for _, resp := range []*rlsv3.RateLimitResponse{ask([]string{"window", "h"}), ask([]string{"one", "full"})} {
			got := map[string]bool{}
			for _, h := range resp.GetResponseHeadersToAdd() {
				got[h.GetKey()] = true
			}
			want := []string{"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
				"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
				want = append(want, "retry-after")
			}
			for _, k := range want {
				if !got[k] {
					t.Errorf("%v answer without %s: %v", resp.GetOverallCode(), k, resp.GetResponseHeadersToAdd())
				}
			}
		}
	})
}
