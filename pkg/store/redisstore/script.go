package redisstore

import (
	"context"
	"crypto/sha1" //nolint:gosec // G505: a fingerprint of our own script (as Redis names scripts), not a security check
	"encoding/hex"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// applier runs apply.lua as a Redis 7 function (FCALL) and, on a server
// without functions, as a script (EVALSHA).
//
// A script's body runs on every call, so every helper it defines is made
// again each time; a function library runs its body once, at FUNCTION
// LOAD. For apply.lua that saves 2-5 µs of Redis CPU a call, out of 10-25
// (BenchmarkApplyCost).
//
// The library and its function are named after a hash of the source, so
// replicas of two versions share a Redis without replacing each other's
// code. A server that lost the library (a restart without persistence, a
// FUNCTION FLUSH) answers "Function not found" without running anything:
// the library is loaded again, on every master of a cluster, and the call
// retried once. A server that has no functions (before Redis 7), or that
// will not load one (an ACL without FUNCTION), turns the store to scripts
// for good, which go-redis loads with EVAL on NOSCRIPT.
type applier struct {
	lib string // the FUNCTION LOAD source
	// names and scripts run each of the library's functions, by fnKind:
	// apply, counts and plains (see call.go's leanFn).
	names   [fnKinds]string
	scripts [fnKinds]*redis.Script
	// useScripts is set once a server turned functions down.
	useScripts atomic.Bool
}

func newApplier(body string) *applier {
	sum := sha1.Sum([]byte(body)) //nolint:gosec // G401: see the import
	v := hex.EncodeToString(sum[:8])
	a := &applier{lib: "#!lua name=tollgate_" + v + "\n" + body + "\n"}
	for fn, lua := range fnNames {
		a.names[fn] = "tollgate_" + lua + "_" + v
		a.lib += "redis.register_function('" + a.names[fn] + "', " + lua + ")\n"
		a.scripts[fn] = redis.NewScript(body + "\nreturn " + lua + "(KEYS, ARGV)\n")
	}
	return a
}

// cmd queues or runs one call on c, a client or a pipeline: FCALL, or
// EVALSHA once the store runs scripts.
func (a *applier) cmd(ctx context.Context, c redis.Cmdable, call *call) *redis.Cmd {
	return a.cmdKA(ctx, c, call.fn, call.keys, call.args)
}

// cmdKA queues or runs fn on keys and args.
func (a *applier) cmdKA(ctx context.Context, c redis.Cmdable, fn fnKind, keys []string, args []any) *redis.Cmd {
	if a.useScripts.Load() {
		return a.scripts[fn].EvalSha(ctx, c, keys, args...)
	}
	return c.FCall(ctx, a.names[fn], keys, args...)
}

// functionMissing reports an FCALL the server did not run because it does
// not hold the function.
func functionMissing(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found")
}

// noFunctions reports a server that has no FCALL or FUNCTION command.
func noFunctions(err error) bool {
	return redis.HasErrorPrefix(err, "unknown command")
}

// isReply reports an error Redis answered (a redis.Error), as opposed to
// one on the way (a timeout, a closed connection).
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// retryable reports an error after which the call did not run and runs
// again once the code is loaded: NOSCRIPT, or a missing function or
// command.
func retryable(err error) bool {
	return functionMissing(err) || noFunctions(err) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// load loads the library on c's server, every master for a cluster. It
// turns the store to scripts when a server has no functions or refuses
// the library. A server it cannot reach (a master that is down) is left
// for later: the call that needed the library fails only if its own
// master still lacks it.
func (a *applier) load(ctx context.Context, c redis.UniversalClient) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			a.loadOn(ctx, m)
			return nil
		})
		return
	}
	a.loadOn(ctx, c)
}

func (a *applier) loadOn(ctx context.Context, c redis.Cmdable) {
	err := c.FunctionLoad(ctx, a.lib).Err()
	loaded := redis.HasErrorPrefix(err, "Library '") && strings.HasSuffix(err.Error(), "already exists") // by another replica
	if isReply(err) && !loaded {
		// An answer: this server will not load the library.
		a.useScripts.Store(true)
	}
}

// run runs one call on c; a call the server did not run for want of the
// code runs again, once, after loading it.
func (a *applier) run(ctx context.Context, c redis.UniversalClient, call *call) ([]any, error) {
	cmd := a.cmd(ctx, c, call)
	switch err := cmd.Err(); {
	case noFunctions(err):
		a.useScripts.Store(true)
		cmd = a.cmd(ctx, c, call)
	case functionMissing(err):
		a.load(ctx, c)
		cmd = a.cmd(ctx, c, call)
	}
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		// EVAL runs the script and loads it.
		cmd = a.scripts[call.fn].Eval(ctx, c, call.keys, call.args...)
	}
	return cmd.Slice()
}
