package envoysim

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/test/closedloop"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

// TestAgainstTollgate runs a real `tollgate serve` (memory store, the
// shipped config/ and config/authz/authz.yaml) behind the simulator: an
// admitted request is settled from its ext_proc stream and its entry
// releases it; a request with a wrong key is denied and its UAEX entry
// reaches the access log service (without a ticket, so it is ignored).
func TestAgainstTollgate(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs tollgate")
	}
	bin := tollgatetest.Build(t)
	tg := tollgatetest.Start(t, bin, "tollgate", "--config", "../../../config", "--authz-config", "../../../config/authz/authz.yaml")
	up := upstreamFunc(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(usageJSON))
	})
	g := newGateway(t, Config{Bootstrap: authzBootstrap, Replicas: []string{tg.GRPC}, Upstream: up.URL, Instances: 1})
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}],"max_tokens":16}`
	req := func(key string) *closedloop.Request {
		r := chatRequest(body)
		r.Header.Set("Authorization", "Bearer "+key)
		return r
	}
	if res := g.Do(context.Background(), req("demo-acme-key-0123456789")); res.Status != 200 || res.Source != closedloop.SourceUpstream {
		t.Errorf("admitted result = %+v", res)
	}
	if res := g.Do(context.Background(), req("not-a-key")); res.Status != 401 || res.Source != closedloop.SourceTollgate {
		t.Errorf("denied result = %+v, want Tollgate's 401", res)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	deadline := time.Now().Add(waitLimit)
	for {
		got := metrics(t, "http://"+tg.Admin+"/metrics")
		settledOrReleased := got[`tollgate_accesslog_entries_total{result="released"}`] + got[`tollgate_accesslog_entries_total{result="duplicate"}`]
		if got[`tollgate_extproc_streams_total{result="usage"}`] == 1 && got[`tollgate_accesslog_entries_total{result="ignored"}`] == 1 && settledOrReleased == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics = %v; want one usage stream, one ignored and one released (or duplicate) entry", got)
		}
		time.Sleep(50 * time.Millisecond) // polling a process's /metrics: no event to wait on
	}
}

// metrics reads the extproc and access log counters from a /metrics page.
func metrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("get %s: %v", url, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tollgate_extproc_streams_total") && !strings.HasPrefix(line, "tollgate_accesslog_entries_total") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
