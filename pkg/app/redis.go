package app

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storeguard"
)

// recoveries passes the Redis client's news that an address answers again
// to the store circuit, which is made after the client.
type recoveries struct {
	guard atomic.Pointer[storeguard.Guard]
}

func (r *recoveries) retry() {
	if g := r.guard.Load(); g != nil {
		g.Retry()
	}
}

// redisFlags are serve's TLS settings for the connection to Redis; the
// URL's scheme (rediss://, rediss+sentinel://, rediss+cluster://) turns
// TLS on, and its userinfo carries the ACL user and password.
type redisFlags struct {
	tlsCA, tlsCert, tlsKey, tlsServerName string
	passwordFile                          string
	// batch is --redis-batch: the most decisions per pipeline, 0 off;
	// batchSet says the command line or the environment set it.
	batch    int
	batchSet bool
	// batchWait is --redis-batch-wait (redisstore.WithBatchWait).
	batchWait time.Duration
	// optimistic is --redis-optimistic-fixed
	// (redisstore.WithOptimisticFixed).
	optimistic bool

	// password is from passwordFile or TOLLGATE_REDIS_PASSWORD, set by
	// check; nil leaves the URL's.
	password *string
}

// redisPasswordEnv holds the Redis password. It is no flag's variable on
// purpose: a --redis-password flag would put it on the command line.
const redisPasswordEnv = "TOLLGATE_REDIS_PASSWORD" //nolint:gosec // G101: the name of the variable, not a password

func (r *redisFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.tlsCA, "redis-tls-ca", "", "PEM CA bundle that signs the Redis servers' certificates (sentinels and cluster nodes too), for a rediss URL; empty trusts the system's roots")
	fs.StringVar(&r.tlsCert, "redis-tls-cert", "", "PEM client certificate for Redis servers with tls-auth-clients (with --redis-tls-key); re-read at every new connection")
	fs.StringVar(&r.tlsKey, "redis-tls-key", "", "PEM private key of --redis-tls-cert")
	fs.StringVar(&r.passwordFile, "redis-password-file", "", "file holding the Redis password (white space around it cut off), in place of one in --redis-url; "+redisPasswordEnv+" is the other way; read at start")
	fs.StringVar(&r.tlsServerName, "redis-tls-server-name", "", "name every Redis server's certificate must carry; empty checks each against the host it is dialled on")
	r.batch = DefaultRedisBatch
	fs.Var(batchFlag{r}, "redis-batch", "most concurrent decisions sent to Redis in one round trip, merged into one script call where they can be, each still all or nothing: less Redis and server CPU per decision under load; 0 or 1 sends each alone; not for redis+cluster:// (ignored)")
	fs.DurationVar(&r.batchWait, "redis-batch-wait", 0, "with --redis-batch, how long a batch waits for more decisions once one is queued (the store sends a decision that finds it idle at once): fewer, larger script calls, less Redis CPU a decision at moderate load, for up to this much more latency; 0 sends what is queued at once; at most "+maxRedisBatchWait.String())
	fs.BoolVar(&r.optimistic, "redis-optimistic-fixed", false, "run decisions whose every charge acquires on a fixed window by INCRBY without a script, taking back a denial's charges in a second round trip: less Redis CPU, and never more admitted, but a concurrent decision can be refused by charges about to be taken back")
}

// check rejects settings that cannot mean what they seem to. A rediss URL
// is checked by redisstore.NewClient, which refuses TLS settings on a
// plain one.
// The password comes from --redis-password-file or, failing that, from
// lookupEnv(TOLLGATE_REDIS_PASSWORD); given there and in the URL too, it
// is refused rather than one silently winning.
func (r *redisFlags) check(redisURL string, lookupEnv func(string) (string, bool)) error {
	envPass, envSet := lookupEnv(redisPasswordEnv)
	switch {
	case (r.tlsCert == "") != (r.tlsKey == ""):
		return errors.New("--redis-tls-cert and --redis-tls-key must be given together")
	case redisURL == "" && (r.tlsCA != "" || r.tlsCert != "" || r.tlsKey != "" || r.tlsServerName != ""):
		return errors.New("--redis-tls-* need --redis-url: without it counters stay in memory")
	case redisURL == "" && (r.passwordFile != "" || envSet):
		return errors.New("--redis-password-file and " + redisPasswordEnv + " need --redis-url: without it counters stay in memory")
	case r.passwordFile != "" && envSet:
		return errors.New("the Redis password is given twice: --redis-password-file and " + redisPasswordEnv)
	case r.batch < 0 || r.batch > maxRedisBatch:
		return fmt.Errorf("--redis-batch %d: want 0 (off) to %d", r.batch, maxRedisBatch)
	case redisURL == "" && r.batchSet && r.batch > 1:
		return errors.New("--redis-batch needs --redis-url: without it counters stay in memory")
	case r.batchWait < 0 || r.batchWait > maxRedisBatchWait:
		return fmt.Errorf("--redis-batch-wait %v: want 0 (off) to %v", r.batchWait, maxRedisBatchWait)
	case r.batchWait > 0 && (redisURL == "" || r.batch <= 1):
		return errors.New("--redis-batch-wait needs --redis-url and --redis-batch above 1: it is how long a batch gathers")
	case r.optimistic && redisURL == "":
		return errors.New("--redis-optimistic-fixed needs --redis-url: without it counters stay in memory, where every decision is isolated already")
	}
	switch {
	case r.passwordFile != "":
		raw, err := os.ReadFile(r.passwordFile)
		if err != nil {
			return fmt.Errorf("--redis-password-file: %w", err)
		}
		p := strings.TrimSpace(string(raw))
		if p == "" {
			return fmt.Errorf("--redis-password-file %q is empty", r.passwordFile)
		}
		r.password = &p
	case envSet:
		if envPass == "" {
			return errors.New(redisPasswordEnv + " is set but empty")
		}
		r.password = &envPass
	default:
		return nil
	}
	if urlHasPassword(redisURL) {
		return errors.New("the Redis password is given twice: in --redis-url and in --redis-password-file or " + redisPasswordEnv)
	}
	return nil
}

// urlHasPassword says whether a Redis URL's userinfo has a password; the
// userinfo ends at the last '@', as redisstore reads it.
func urlHasPassword(raw string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return false
	}
	at := strings.LastIndexByte(rest, '@')
	return at >= 0 && strings.Contains(rest[:at], ":")
}

// DefaultRedisBatch is --redis-batch's default: concurrent decisions
// share round trips and script calls (docs/benchmarks.md, issue 17).
const DefaultRedisBatch = 32

// batchFlag is --redis-batch, an int that records being set.
type batchFlag struct{ r *redisFlags }

func (b batchFlag) String() string {
	if b.r == nil {
		return strconv.Itoa(DefaultRedisBatch)
	}
	return strconv.Itoa(b.r.batch)
}

func (b batchFlag) Set(v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return errors.New(wantWholeNumber)
	}
	b.r.batch, b.r.batchSet = n, true
	return nil
}

// maxRedisBatch bounds --redis-batch: a pipeline's replies are read
// within one read timeout, and the queue holds redisstore.BatchWorkers
// pipelines' worth of calls.
const maxRedisBatch = 1000

// maxRedisBatchWait bounds --redis-batch-wait (1.5ms): a tenth of the
// default store timeout, so that gathering never costs a decision its
// answer.
const maxRedisBatchWait = admission.DefaultStoreTimeout / 10

// storeOptions are redisstore.New's options for these flags.
func (r *redisFlags) storeOptions() []redisstore.StoreOption {
	return []redisstore.StoreOption{redisstore.WithBatch(r.batch), redisstore.WithBatchWait(r.batchWait), redisstore.WithOptimisticFixed(r.optimistic)}
}

// options are redisstore.NewClient's options for these flags.
func (r *redisFlags) options() []redisstore.Option {
	opts := []redisstore.Option{redisstore.WithTLS(redisstore.TLS{
		CAFile:     r.tlsCA,
		CertFile:   r.tlsCert,
		KeyFile:    r.tlsKey,
		ServerName: r.tlsServerName,
	})}
	if r.password != nil {
		opts = append(opts, redisstore.WithPassword(*r.password))
	}
	return opts
}
