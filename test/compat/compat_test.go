// Package compat replays envoyproxy/ratelimit's documented answers against
// `tollgate serve` over real gRPC, on the in-memory store and on Redis,
// with the rules in fixed_window mode, the reference's algorithm (issue
// 18). Each case names the reference behaviour it holds Tollgate to.
package compat

import (
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// rules are written as a reference user writes them, including what the
// reference loads and ignores (a unit beside a key, an amount beside
// unlimited), and wildcards anywhere in a value.
const rules = `domain: compat
algorithm: fixed_window
descriptors:
  - key: limited
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: free
    unit: second
    rate_limit: {unlimited: true, requests_per_unit: 5}
  - key: zero
    rate_limit: {unit: minute}
  - key: generic
    rate_limit: {name: generic, unit: minute, requests_per_unit: 1}
  - key: special
    rate_limit: {unit: minute, requests_per_unit: 3, replaces: [{name: generic}]}
  - key: quiet
    shadow_mode: true
    rate_limit: {name: quiet, unit: minute, requests_per_unit: 1}
  - key: mid
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: shared
    value: bar*b
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multi
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: route
    value: /api*v1
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: svc
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata: {name: service_1}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota: {name: service_2}
  - key: rpc
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
`

func TestCompat(t *testing.T) {
	t.Parallel()
	onBothStores(t, "compat", rules, func(t *testing.T, c rlsv3.RateLimitServiceClient, admin string) {
		run(t, c)
		metricNames(t, admin)
	})
}

// onBothStores serves rules (one file) with tollgate serve, once on the
// in-memory store and once on Redis, in parallel subtests, and calls test
// with a client of each and its admin address.
func onBothStores(t *testing.T, name, rules string, test func(t *testing.T, c rlsv3.RateLimitServiceClient, admin string)) {
	t.Helper()
	bin := tollgatetest.Build(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	for _, store := range []struct {
		name string
		args []string
	}{
		{"memory", nil},
		{"redis", []string{"--redis-url", srv.URL(), "--lease-fraction", "0"}},
	} {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			p := tollgatetest.Start(t, bin, name+"-"+store.name, append([]string{"--config", dir}, store.args...)...)
			cc, err := grpc.NewClient(p.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cc.Close() })
			test(t, rlsv3.NewRateLimitServiceClient(cc), p.Admin)
		})
	}
}

func desc(kv ...string) *rlpb.RateLimitDescriptor {
	d := &rlpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits gives d a hits_addend of its own, as Envoy sends one set by the
// rate limit action (apply_on_stream_done reports usage so).
func hits(d *rlpb.RateLimitDescriptor, n uint64) *rlpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func override(d *rlpb.RateLimitDescriptor, n uint32) *rlpb.RateLimitDescriptor {
	d.Limit = &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_MINUTE}
	return d
}

func run(t *testing.T, c rlsv3.RateLimitServiceClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(hits uint32, ds ...*rlpb.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "compat", HitsAddend: hits, Descriptors: ds})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}

	t.Run("unlimited reports the most a uint32 holds", func(t *testing.T) {
		st := call(1, desc("free", "x")).GetStatuses()[0]
		if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != math.MaxUint32 {
			t.Errorf("status %v, want OK, no limit, remaining %d", st, uint32(math.MaxUint32))
		}
	})
	t.Run("a descriptor with no entries is OK without a limit", func(t *testing.T) {
		resp := call(1, desc("limited", "empty-neighbour"), &rlpb.RateLimitDescriptor{})
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 || resp.GetStatuses()[1].GetCurrentLimit() != nil {
			t.Errorf("response %v, want OK and a second status without a limit", resp)
		}
	})
	t.Run("over the limit reports 0 remaining", func(t *testing.T) {
		st := call(25, desc("limited", "big")).GetStatuses()[0]
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 {
			t.Errorf("hits_addend 25 on 20/minute: %v, want OVER_LIMIT with 0 remaining", st)
		}
	})
	t.Run("a check exactly at the limit is OK with 0 remaining", func(t *testing.T) {
		if st := call(20, desc("limited", "at")).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 {
			t.Fatalf("20 hits on 20/minute: %v, want OK with 0 remaining", st)
		}
		if st := call(0, hits(desc("limited", "at"), 0)).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 {
			t.Errorf("hits_addend 0 at the limit: %v, want OK with 0 remaining", st)
		}
		if st := call(1, desc("limited", "at")).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("one more hit: %v, want OVER_LIMIT", st)
		}
	})
	t.Run("a cost report is charged past the limit", func(t *testing.T) {
		if st := call(15, desc("limited", "debit")).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 5 {
			t.Fatalf("15 hits on 20/minute: %v, want OK with 5 remaining", st)
		}
		// The report after the response: 10 more, past the limit. Its
		// answer (which Envoy ignores) is OVER_LIMIT, and it is kept.
		if st := call(0, hits(desc("limited", "debit"), 10)).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 {
			t.Errorf("a report of 10 with 5 left: %v, want OVER_LIMIT with 0 remaining", st)
		}
		if st := call(0, hits(desc("limited", "debit"), 0)).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("a check after the report: %v, want OVER_LIMIT (25 of 20 used)", st)
		}
		if resp := call(1, desc("limited", "debit")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("a request after the report: %v, want OVER_LIMIT", resp)
		}
	})
	t.Run("fixed windows reset at the epoch-aligned minute", func(t *testing.T) {
		before := time.Now()
		st := call(1, desc("limited", "reset")).GetStatuses()[0]
		after := time.Now()
		// The reset is to the next whole minute, seen from some instant
		// between before and after (ms resolution, a second of slack).
		lo := before.Truncate(time.Minute).Add(time.Minute).Sub(after) - time.Second
		hi := after.Truncate(time.Minute).Add(time.Minute).Sub(before) + time.Second
		if got := st.GetDurationUntilReset().AsDuration(); got < lo || got > hi || st.GetLimitRemaining() != 19 {
			t.Errorf("status %v: reset %v, want between %v and %v, remaining 19", st, got, lo, hi)
		}
	})
	t.Run("an override limits an unlimited descriptor and has no name", func(t *testing.T) {
		d := func() *rlpb.RateLimitDescriptor { return override(desc("free", "over"), 1) }
		first, second := call(1, d()).GetStatuses()[0], call(1, d()).GetStatuses()[0]
		if first.GetCode() != rlsv3.RateLimitResponse_OK || first.GetCurrentLimit().GetName() != "" || first.GetCurrentLimit().GetRequestsPerUnit() != 1 {
			t.Errorf("first call %v, want OK under the override, without a name", first)
		}
		if second.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("second call %v, want OVER_LIMIT", second)
		}
	})
	t.Run("an override where no rule matches resets at the epoch-aligned minute", func(t *testing.T) {
		before := time.Now()
		st := call(1, override(desc("nothing", "matches"), 7)).GetStatuses()[0]
		after := time.Now()
		lo := before.Truncate(time.Minute).Add(time.Minute).Sub(after) - time.Second
		hi := after.Truncate(time.Minute).Add(time.Minute).Sub(before) + time.Second
		if got := st.GetDurationUntilReset().AsDuration(); got < lo || got > hi || st.GetLimitRemaining() != 6 || st.GetCurrentLimit().GetRequestsPerUnit() != 7 {
			t.Errorf("status %v: reset %v, want between %v and %v, 6 of 7 remaining", st, got, lo, hi)
		}
	})
	t.Run("a unit without requests_per_unit is a limit of 0", func(t *testing.T) {
		if st := call(1, desc("zero", "z")).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCurrentLimit().GetRequestsPerUnit() != 0 {
			t.Errorf("status %v, want OVER_LIMIT under 0/minute", st)
		}
	})
	t.Run("replaces drops the named limit; a status names its limit", func(t *testing.T) {
		resp := call(1, desc("generic", "g"), desc("special", "s"))
		g, s := resp.GetStatuses()[0], resp.GetStatuses()[1]
		if g.GetCode() != rlsv3.RateLimitResponse_OK || g.GetCurrentLimit() != nil {
			t.Errorf("the replaced descriptor: %v, want OK with no limit", g)
		}
		if s.GetCurrentLimit().GetRequestsPerUnit() != 3 || s.GetLimitRemaining() != 2 {
			t.Errorf("the replacing descriptor: %v, want 2 of 3 remaining", s)
		}
		// Without the replacing descriptor the named limit counts, and
		// the status carries its name.
		st := call(1, desc("generic", "g")).GetStatuses()[0]
		if st.GetCurrentLimit().GetName() != "generic" || st.GetLimitRemaining() != 0 {
			t.Errorf("generic alone: %v, want the limit named generic with 0 remaining (it was not charged before)", st)
		}
	})
	t.Run("an override under shadow_mode is enforced", func(t *testing.T) {
		d := func() *rlpb.RateLimitDescriptor { return override(desc("quiet", "over"), 1) }
		call(1, d())
		if resp := call(1, d()); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("second call over the override of a shadow rule: %v, want OVER_LIMIT", resp)
		}
	})
	// remaining is what each call in order leaves, or -1 for no limit.
	remaining := func(t *testing.T, key string, values []string, want []int) {
		t.Helper()
		for i, v := range values {
			st := call(1, desc(key, v)).GetStatuses()[0]
			got := int(st.GetLimitRemaining())
			if st.GetCurrentLimit() == nil {
				got = -1
			}
			if got != want[i] {
				t.Errorf("%s=%s: %v, want remaining %d (-1: no limit)", key, v, st, want[i])
			}
		}
	}
	t.Run("a * in the middle matches any run, each value on its own counter", func(t *testing.T) {
		remaining(t, "mid", []string{"barab", "bar123b", "barb", "barab", "bara", "xbarb"}, []int{19, 19, 19, 18, -1, -1})
	})
	t.Run("share_threshold puts every value a pattern matches on one counter", func(t *testing.T) {
		remaining(t, "shared", []string{"barab", "bar123b", "barb"}, []int{19, 18, 17})
		remaining(t, "route", []string{"/apiv1", "/api/users/v1", "/api/v2"}, []int{99, 98, -1})
		remaining(t, "rpc", []string{"svc1ep2rpc", "svcAepBrpc", "svcrpc", "svcep-rpc"}, []int{49, 48, -1, 47})
	})
	t.Run("descriptor metadata is returned for the descriptors within their limits", func(t *testing.T) {
		meta := func(ds ...*rlpb.RateLimitDescriptor) map[string]any {
			t.Helper()
			if f := call(1, ds...).GetDynamicMetadata().GetFields()["metadata"]; f != nil {
				return f.GetStructValue().AsMap()
			}
			return nil
		}
		if got := meta(desc("key1", "value1", "subkey1", "y")); !reflect.DeepEqual(got, map[string]any{"name": "service_1"}) {
			t.Errorf("key1=value1, subkey1=y: metadata %v, want name service_1", got)
		}
		if got := meta(desc("key1", "value1", "subkey1", "subvalue1")); got != nil {
			t.Errorf("key1=value1, subkey1=subvalue1: metadata %v, want none (its rule has none)", got)
		}
		want := map[string]any{"name": "service_1", "service_with_quota": map[string]any{"name": "service_2"}}
		if got := meta(desc("key1", "value1", "subkey1", "z"), desc("key2", "k")); !reflect.DeepEqual(got, want) {
			t.Errorf("two descriptors: metadata %v, want %v", got, want)
		}
	})
	t.Run("value_to_metric names the value", func(t *testing.T) {
		for _, v := range []string{"billing", "search", "billing"} {
			if st := call(1, desc("svc", v, "method", "GET")).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("svc=%s: %v, want OK", v, st)
			}
		}
	})
	t.Run("several * match in order", func(t *testing.T) {
		remaining(t, "multi", []string{"foobarbaz", "foo-bar-baz", "foobazbar", "foobarbaz"}, []int{9, 9, -1, 8})
	})
}

// metricNames checks, after run, that detailed_metric and value_to_metric
// name descriptors as envoyproxy/ratelimit names its stats: a
// share_threshold entry by its pattern, even under detailed_metric, and a
// value_to_metric entry by its value.
func metricNames(t *testing.T, admin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`tollgate_rls_detailed_decisions_total{descriptor="route=/api*v1",domain="compat",result="ok",rule="route_/api*v1"} 2`,
		`tollgate_rls_detailed_decisions_total{descriptor="svc=billing,method",domain="compat",result="ok",rule="svc.method"} 2`,
		`tollgate_rls_detailed_decisions_total{descriptor="svc=search,method",domain="compat",result="ok",rule="svc.method"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(string(body), `descriptor="route=/apiv1"`) {
		t.Error("a share_threshold entry is named by its value")
	}
}
