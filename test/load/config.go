// Package load drives Envoy's RateLimitService v3 (ShouldRateLimit) over
// real gRPC and reports throughput, latency percentiles and answers. It is
// the logic behind cmd/tollgate-load and works against any RLS, Tollgate
// or envoyproxy/ratelimit alike.
package load

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Spread modes for -spread.
const (
	// SpreadRandom picks a tenant uniformly at random per call.
	SpreadRandom = "random"
	// SpreadRoundRobin walks the tenants in order across all workers, so
	// N calls reach each of N tenants once.
	SpreadRoundRobin = "round-robin"
)

// Config is one load run.
type Config struct {
	// Addr is the RLS gRPC address, or several separated by commas (one
	// per replica; the workers spread over them) (Required); the flag
	// defaults to 127.0.0.1:8081.
	Addr string
	// Concurrency is the number of workers, each with one call in flight (Required, > 0).
	Concurrency int
	// Conns is the number of gRPC connections; worker i uses connection i mod Conns (Required, > 0).
	Conns int
	// Duration bounds the measured run; 0 means only Requests bounds it.
	Duration time.Duration
	// Requests bounds the number of measured calls; 0 means only Duration bounds it.
	Requests int64
	// Warmup runs before the measured run; its calls are not counted.
	Warmup time.Duration
	// Rate caps the calls started per second, all workers together (0:
	// none): the workers start calls at evenly spaced times, so that two
	// servers, or a server and the baseline, can be compared at the same
	// load. Redis's CPU per command depends on the load: fewer commands a
	// wake-up cost more each.
	Rate float64
	// Timeout is the deadline of each call (Required, > 0).
	Timeout time.Duration
	// Domain is the request's domain (Required).
	Domain string
	// Descriptors are sent with every request (Required, at least one).
	Descriptors []Descriptor
	// Tenants, when > 0, replaces the value of every entry keyed SpreadKey
	// with tenant-0 .. tenant-(Tenants-1), one per request.
	Tenants   int
	SpreadKey string
	// Spread is SpreadRandom (uniform, the default) or SpreadRoundRobin.
	Spread string
	// Hits is the request's hits_addend; 0 leaves it unset (the server counts 1).
	Hits uint32
	// JSON prints the result as one JSON object.
	JSON bool
	// RedisInfo, when set, is the Redis (host:port or redis:// URL) whose
	// used_memory and DBSIZE are read before and after the run, to report
	// the memory of each key the run added (Optional).
	RedisInfo string
	// API is the call made: APIRateLimit (ShouldRateLimit, the default)
	// or APICheck (ext_authz Check).
	API string
	// APIKey is sent as "authorization: Bearer <key>" with Check
	// (Optional; empty sends none).
	APIKey string
	// BodyBytes is the size of the JSON chat completion body sent with
	// Check (about; at least 100).
	BodyBytes int
	// Model is the body's model.
	Model string
	// RedisURL is the Redis that -api redis-baseline sends its commands
	// to (host:port or redis:// URL).
	RedisURL string
	// Window is the fixed window of -api redis-baseline: each key holds
	// the window's start, and PEXPIRE sets it to expire after Window.
	Window time.Duration
	// ServerPID, when > 0, is the process whose CPU time (/proc/PID/stat)
	// is reported per decision.
	ServerPID int
}

// The calls -api names.
const (
	APIRateLimit = "ratelimit"
	APICheck     = "check"
	// APIRedisBaseline sends no RPC: per call, one pipeline of INCRBY and
	// PEXPIRE per descriptor straight to Redis, what
	// envoyproxy/ratelimit does per call with its fixed windows.
	APIRedisBaseline = "redis-baseline"
)

// Addrs returns the addresses in Addr.
func (c *Config) Addrs() []string { return strings.Split(c.Addr, ",") }

// Validate checks c for a run that is well formed and bounded.
func (c *Config) Validate() error {
	switch {
	case c.Addr == "" || slices.Contains(c.Addrs(), ""):
		return fmt.Errorf("-addr %q has an empty address", c.Addr)
	case c.Concurrency <= 0:
		return fmt.Errorf("-c is %d, want > 0", c.Concurrency)
	case c.Conns <= 0:
		return fmt.Errorf("-conns is %d, want > 0", c.Conns)
	case !(c.Rate >= 0) || c.Rate > 1e8:
		return fmt.Errorf("-rate is %v, want 0 (no cap) up to 1e8 calls/s", c.Rate)
	case c.Duration < 0 || c.Requests < 0 || c.Warmup < 0:
		return errors.New("-d, -n and -warmup must not be negative")
	case c.Duration == 0 && c.Requests == 0:
		return errors.New("-d and -n are both 0: the run would never stop")
	case c.Timeout <= 0:
		return fmt.Errorf("-timeout is %v, want > 0", c.Timeout)
	case c.API != APIRateLimit && c.API != APICheck && c.API != APIRedisBaseline:
		return fmt.Errorf("-api is %q, want %s, %s or %s", c.API, APIRateLimit, APICheck, APIRedisBaseline)
	case c.API == APIRedisBaseline && c.RedisURL == "":
		return errors.New("-api redis-baseline needs -redis-url")
	case c.API == APIRedisBaseline && c.Window < time.Millisecond:
		return fmt.Errorf("-window is %v, want at least 1ms", c.Window)
	case c.ServerPID < 0:
		return fmt.Errorf("-server-pid is %d, want > 0 (or 0: none)", c.ServerPID)
	case c.API == APICheck && c.BodyBytes < 100:
		return fmt.Errorf("-body-bytes is %d, want >= 100", c.BodyBytes)
	case c.API == APICheck && c.Tenants > 0:
		return errors.New("-tenants spreads descriptors, which -api check does not send")
	case c.API == APICheck:
		return nil
	case c.Domain == "":
		return errors.New("-domain is required")
	case len(c.Descriptors) == 0:
		return errors.New("at least one -descriptor is required")
	case c.Tenants < 0:
		return fmt.Errorf("-tenants is %d, want >= 0", c.Tenants)
	case c.Spread != SpreadRandom && c.Spread != SpreadRoundRobin:
		return fmt.Errorf("-spread is %q, want %s or %s", c.Spread, SpreadRandom, SpreadRoundRobin)
	}
	if c.Tenants > 0 && !c.hasSpreadKey() {
		return fmt.Errorf("-tenants is set but no descriptor has a key of %q (-spread-key)", c.SpreadKey)
	}
	return nil
}

func (c *Config) hasSpreadKey() bool {
	for _, d := range c.Descriptors {
		for _, e := range d {
			if c.isSpreadKey(e.Key) {
				return true
			}
		}
	}
	return false
}

// isSpreadKey tells whether -tenants replaces the value of entries keyed
// k: SpreadKey is one key or several separated by commas.
func (c *Config) isSpreadKey(k string) bool {
	return slices.Contains(strings.Split(c.SpreadKey, ","), k)
}

const usageHead = `Usage: tollgate-load -domain D -descriptor k=v[,k=v...] [flags]
       tollgate-load -api check -key K [-body-bytes N] [flags]
       tollgate-load -api redis-baseline -redis-url R -domain D -descriptor ... [flags]

Sends ShouldRateLimit calls (or, with -api check, ext_authz Check calls
carrying an API key and a JSON chat completion body) over gRPC for -d (and at
most -n calls, whichever ends first), then prints requests/s, latency
percentiles of answered calls and the counts of OK, OVER_LIMIT (for Check:
denied) and errors by gRPC code. With -api redis-baseline it calls no service:
per call, one pipeline of INCRBY + PEXPIRE per descriptor goes straight to
Redis, the Redis work of envoyproxy/ratelimit. It also prints CPU per measured
decision: its own, Redis's (-redis-info, from INFO cpu) and a server process's
(-server-pid, from /proc/PID/stat).

Descriptor syntax: entries separated by ',', each key=value. The first '=' ends
the key. A backslash escapes ',', '=' or '\' (\, \= \\). Repeat -descriptor to
send several descriptors per request. Example:
  tollgate-load -domain api -descriptor 'tenant=acme,model=gpt-4o' -tenants 100 -c 64 -d 30s

Flags:
`

// ParseFlags parses the command line into a validated Config. It returns
// flag.ErrHelp for -h.
func ParseFlags(args []string, stderr io.Writer) (Config, error) {
	c := Config{}
	fs := flag.NewFlagSet("tollgate-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:8081", "RLS gRPC `address`, or several separated by commas (replicas sharing the workers)")
	fs.IntVar(&c.Concurrency, "c", 50, "concurrent workers, each with one call in flight")
	fs.IntVar(&c.Conns, "conns", 1, "gRPC connections, shared by the workers round-robin")
	fs.DurationVar(&c.Duration, "d", 10*time.Second, "measured duration (0: bounded by -n only)")
	fs.Int64Var(&c.Requests, "n", 0, "measured calls at most (0: bounded by -d only)")
	fs.DurationVar(&c.Warmup, "warmup", 0, "run this long first without counting")
	fs.DurationVar(&c.Timeout, "timeout", time.Second, "deadline of each call")
	fs.Float64Var(&c.Rate, "rate", 0, "start at most this many calls per second, all workers together, evenly spaced (0: no cap)")
	fs.StringVar(&c.Domain, "domain", "", "rate limit `domain` (required)")
	fs.Var(descriptorsFlag{&c.Descriptors}, "descriptor", "descriptor `k=v[,k=v...]`, repeatable (required)")
	fs.IntVar(&c.Tenants, "tenants", 0, "spread over N tenants: replace the -spread-key value with tenant-0..N-1")
	fs.StringVar(&c.SpreadKey, "spread-key", "tenant", "descriptor `key` whose value -tenants replaces, or several separated by commas (each gets the same tenant-N)")
	fs.StringVar(&c.Spread, "spread", SpreadRandom, "how -tenants picks a tenant per request: random or round-robin")
	hits := fs.Uint64("hits", 0, "request hits_addend (0: unset, the server counts 1)")
	fs.BoolVar(&c.JSON, "json", false, "print the result as JSON")
	fs.StringVar(&c.RedisInfo, "redis-info", "", "Redis `address` (host:port or redis:// URL) behind the service: report used_memory and DBSIZE before and after the run, bytes per added key, and Redis CPU (INFO cpu) and commands per measured decision")
	fs.StringVar(&c.API, "api", APIRateLimit, "the call: ratelimit (ShouldRateLimit), check (ext_authz Check) or redis-baseline (no RPC: per call one pipeline of INCRBY + PEXPIRE per descriptor to -redis-url)")
	fs.StringVar(&c.RedisURL, "redis-url", "", "Redis `address` (host:port or redis:// URL) of -api redis-baseline")
	fs.DurationVar(&c.Window, "window", time.Second, "fixed window of -api redis-baseline: in each key, and its PEXPIRE")
	fs.IntVar(&c.ServerPID, "server-pid", 0, "report the CPU time (/proc/`PID`/stat utime+stime) of this server process per measured decision")
	fs.StringVar(&c.APIKey, "key", "", "API `key` sent with -api check as authorization: Bearer")
	fs.IntVar(&c.BodyBytes, "body-bytes", 2048, "size of the chat completion body sent with -api check")
	fs.StringVar(&c.Model, "model", "gpt-4o", "model named in the -api check body")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *hits > math.MaxUint32 {
		return Config{}, fmt.Errorf("-hits is %d, at most %d", *hits, uint64(math.MaxUint32))
	}
	c.Hits = uint32(*hits)
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}
