package closedloop_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/test/closedloop"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// TestRedisSpendSettled sends JSON and SSE requests through envoysim's
// ext_authz chain to a real replica and the model upstream, and reads the
// tenant's spend back with RedisSpend: Check reserves the estimate
// (prompt/4 + max_tokens), ext_proc settles it to the usage the answer
// reports, and the lease goes back to Redis. The settled spend must be
// the upstream's usage to the token; an estimate left unsettled would be
// 164 a request, well above the ~130 served.
func TestRedisSpendSettled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, a tollgate process and the upstream; skipped with -short")
	}
	t.Parallel()
	bin := tollgatetest.Build(t)
	tn := closedloop.NewTenants("spender", 1)[0]
	c := closedloop.StartCluster(t, bin, 1, closedloop.ShippedRules(), map[string][]closedloop.Tenant{"standard": {tn}})
	up := newRealUpstream(closedloop.IssueUpstream)
	base, err := up.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	gw, err := newEnvoyGateway(t.Context(), closedloop.GatewayConfig{Replicas: c.GRPCAddrs(), Upstream: base, Mode: closedloop.ModeExtAuthz, Instances: 1})
	if err != nil {
		t.Fatal(err)
	}
	var seen int64
	for _, stream := range []bool{false, true, false, true, true} {
		res := gw.Do(t.Context(), spendRequest(t, tn, stream))
		if res.Status != http.StatusOK || res.Source != closedloop.SourceUpstream || res.PromptTokens == 0 {
			t.Fatalf("stream %v: result %+v, want the upstream's 200 with usage", stream, res)
		}
		seen += res.PromptTokens + res.CompletionTokens
	}
	if err := gw.Close(); err != nil {
		t.Fatalf("close gateway: %v", err)
	}
	if used := up.Stats().Usage[tn.Name]; used != seen {
		t.Fatalf("upstream usage of %s = %d, the client saw %d", tn.Name, used, seen)
	}
	// The replica's lease holds the reservation until it goes back
	// (within --lease-max-life, 1s): poll for the settled figure, bounded.
	deadline := time.Now().Add(10 * time.Second)
	var got int64
	for time.Now().Before(deadline) {
		if got, err = closedloop.RedisSpend(t.Context(), c, tn.Name); err != nil {
			t.Fatal(err)
		}
		if got == seen {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Errorf("RedisSpend(%s) = %d, want the upstream's usage %d", tn.Name, got, seen)
}

// spendRequest is a chat completion as the driver builds it: a prompt of
// 100 tokens at 4 characters each, max_tokens 64.
func spendRequest(t testing.TB, tn closedloop.Tenant, stream bool) *closedloop.Request {
	t.Helper()
	b := map[string]any{"model": closedloop.Model, "max_tokens": 64, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": strings.Repeat("tok ", 100)}}}
	if stream {
		b["stream_options"] = map[string]bool{"include_usage": true}
	}
	body, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Authorization", "Bearer "+tn.Key)
	h.Set("X-Sim-Tenant", tn.Name)
	return &closedloop.Request{Tenant: tn.Name, Tier: "standard", Model: closedloop.Model, Method: http.MethodPost,
		Path: "/v1/chat/completions", Header: h, Body: body, Stream: stream, Timeout: 10 * time.Second}
}
