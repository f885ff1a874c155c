package app

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/pressure"
	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
)

// pressureFlags are serve's pressure and breaker settings.
type pressureFlags struct {
	replicaID    string
	interval     time.Duration
	ttl          time.Duration
	combine      string
	capacity     int
	tokenFile    string
	latencySLA   time.Duration
	maxErrorRate float64
	window       time.Duration
	maxOverload  float64
	errors       bool
	promURL      string
	promQuery    string
	promInterval time.Duration
}

func (p *pressureFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.replicaID, "replica-id", "", "this replica's name on the pressure board, unique among live replicas; default the hostname, else a random id")
	fs.DurationVar(&p.interval, "pressure-interval", time.Second, "how often each replica publishes its pressure and reads the combined one")
	fs.DurationVar(&p.ttl, "pressure-ttl", 5*time.Second, "how long a published pressure counts: a replica that stops publishing stops counting after this")
	fs.StringVar(&p.combine, "pressure-combine", "max", "how replicas' pressures combine: max or mean")
	fs.IntVar(&p.capacity, "pressure-capacity", 0, "in-flight ShouldRateLimit and Check calls this replica handles comfortably (in-flight/capacity is a pressure signal); 0: no in-flight signal")
	fs.StringVar(&p.tokenFile, "pressure-token-file", "", "file holding the bearer token of PUT/GET /v1/pressure on the admin port; empty: the endpoint is not served")
	fs.DurationVar(&p.latencySLA, "pressure-latency-sla", 0, "upstream p95 latency promised (from the access log): a p95 above it is a pressure signal, full at 2x; also turns on the error-rate signal; 0: off")
	fs.Float64Var(&p.maxErrorRate, "pressure-max-error-rate", pressure.DefaultMaxErrorRate, "upstream failure rate (5xx, resets, timeouts of an upstream not at capacity; docs/outcome-classes.md) that is full pressure, in (0,1]")
	fs.DurationVar(&p.window, "pressure-window", pressure.DefaultOutcomeInterval, "the sliding window of the access log's latency, failure and overload signals (moves in tenths); at least 10ms")
	fs.Float64Var(&p.maxOverload, "pressure-max-overload-rate", pressure.DefaultMaxOverloadRate, "rate of overload answers (the vendor's 429, a busy upstream's 503/504/timeout, Envoy's overflow) that is full pressure, in (0,1]")
	fs.BoolVar(&p.errors, "pressure-errors", false, "use the error-rate signal without --pressure-latency-sla")
	fs.StringVar(&p.promURL, "pressure-prom-url", "", "Prometheus base URL polled for a global pressure signal (with --pressure-prom-query); empty: off")
	fs.StringVar(&p.promQuery, "pressure-prom-query", "", "PromQL instant query whose largest sample, clamped to [0,1], is a global pressure signal")
	fs.DurationVar(&p.promInterval, "pressure-prom-interval", pressure.DefaultPromInterval, "how often --pressure-prom-query is polled")
}

// check rejects settings that cannot mean what they seem to.
func (p *pressureFlags) check() error {
	if _, err := pressure.ParseCombine(p.combine); err != nil {
		return fmt.Errorf("--pressure-combine: %w", err)
	}
	switch {
	case p.interval <= 0:
		return fmt.Errorf("--pressure-interval: %v is not positive", p.interval)
	case p.ttl < p.interval:
		return fmt.Errorf("--pressure-ttl %v is under --pressure-interval %v: every replica would blink out between publishes", p.ttl, p.interval)
	case p.capacity < 0:
		return fmt.Errorf("--pressure-capacity: %d is negative", p.capacity)
	case p.latencySLA < 0 || (p.latencySLA > 0 && p.latencySLA < time.Millisecond):
		return fmt.Errorf("--pressure-latency-sla: %v is not 0 or at least 1ms", p.latencySLA)
	case !(p.maxErrorRate > 0 && p.maxErrorRate <= 1):
		return fmt.Errorf("--pressure-max-error-rate: %v is not in (0,1]", p.maxErrorRate)
	case !(p.maxOverload > 0 && p.maxOverload <= 1):
		return fmt.Errorf("--pressure-max-overload-rate: %v is not in (0,1]", p.maxOverload)
	case p.window < 10*time.Millisecond:
		return fmt.Errorf("--pressure-window: %v is under 10ms", p.window)
	case (p.promURL == "") != (p.promQuery == ""):
		return errors.New("--pressure-prom-url and --pressure-prom-query must be given together")
	case p.promInterval <= 0:
		return fmt.Errorf("--pressure-prom-interval: %v is not positive", p.promInterval)
	}
	if p.tokenFile != "" {
		if _, err := readToken("--pressure-token-file", p.tokenFile); err != nil {
			return err
		}
	}
	return nil
}

// replica is --replica-id, the hostname, or a random id.
func (p *pressureFlags) replica() string {
	if p.replicaID != "" {
		return p.replicaID
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails
	return "tollgate-" + hex.EncodeToString(b)
}

// config is the pressure runtime's Config of these flags, which check
// has accepted.
func (p *pressureFlags) config() pressureruntime.Config {
	combine, _ := pressure.ParseCombine(p.combine) // check rejected a bad one
	return pressureruntime.Config{
		Replica: p.replica(), Interval: p.interval, TTL: p.ttl, Combine: combine, Capacity: p.capacity,
		TokenFile: p.tokenFile, LatencySLA: p.latencySLA, Errors: p.errors,
		MaxErrorRate: p.maxErrorRate, MaxOverloadRate: p.maxOverload, Window: p.window,
		PromURL: p.promURL, PromQuery: p.promQuery, PromInterval: p.promInterval,
	}
}
