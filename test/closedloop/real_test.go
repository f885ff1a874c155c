package closedloop_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"

	"github.com/tollgate-dev/tollgate/test/closedloop"
	"github.com/tollgate-dev/tollgate/test/closedloop/envoysim"
	"github.com/tollgate-dev/tollgate/test/closedloop/upstream"
)

// realUpstream is test/closedloop/upstream's model server as the bench
// drives it.
type realUpstream struct {
	cfg upstream.Config
	u   *upstream.Upstream
	srv *httptest.Server
}

func newRealUpstream(c closedloop.UpstreamConfig) closedloop.Upstream {
	cfg := upstream.DefaultConfig()
	cfg.Slots, cfg.Queue, cfg.QueueTimeout, cfg.Seed = c.Slots, c.Queue, c.QueueTimeout, uint64(c.Seed)
	return &realUpstream{cfg: cfg}
}

func (r *realUpstream) Start() (string, error) {
	u, err := upstream.New(r.cfg)
	if err != nil {
		return "", err
	}
	r.u = u
	r.srv = httptest.NewServer(u)
	return r.srv.URL, nil
}

func (r *realUpstream) Close() {
	if r.srv != nil {
		r.srv.Close()
	}
}

func (r *realUpstream) SetMode(m closedloop.UpstreamMode) {
	k := upstream.Normal
	switch m.Kind {
	case closedloop.UpstreamFail:
		k = upstream.Fail
	case closedloop.UpstreamVendor429:
		k = upstream.Vendor429
	}
	// A mode the scenarios build is valid; a bad one is a bench bug that
	// the scenario's laws would show as an upstream that never changed.
	_ = r.u.SetMode(upstream.Mode{Kind: k, FailFraction: m.FailFraction, FailStatus: m.FailStatus, Rate: m.RateLimit})
}

func (r *realUpstream) Stats() closedloop.UpstreamStats {
	s := r.u.Stats()
	out := closedloop.UpstreamStats{
		Served: uint64(s.Totals.Served), QueueFull: uint64(s.Totals.QueueFull), QueueTimeout: uint64(s.Totals.QueueTimeout),
		Vendor429: uint64(s.Totals.Vendor429), Failed: uint64(s.Totals.Failed), Cancelled: uint64(s.Totals.Cancelled),
		InFlight: s.InFlight, Queued: s.Queued, Usage: make(map[string]int64, len(s.Tenants)),
	}
	for t, u := range s.Tenants {
		out.Usage[t] = u.TotalTokens()
	}
	return out
}

// newEnvoyGateway is envoysim's Envoy-faithful gateway on the shipped
// bootstrap of the mode.
func newEnvoyGateway(_ context.Context, c closedloop.GatewayConfig) (closedloop.Gateway, error) {
	boot := "envoy/envoy-ext-authz.yaml"
	if c.Mode == closedloop.ModeRateLimit {
		boot = "envoy/envoy.yaml"
	}
	return envoysim.New(envoysim.Config{
		Bootstrap: filepath.Join(closedloop.RootDir(), boot), Replicas: c.Replicas, Upstream: c.Upstream, Instances: c.Instances,
	})
}
