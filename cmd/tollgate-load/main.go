// Command tollgate-load drives ShouldRateLimit calls against a rate limit
// service and reports throughput and latency. See test/load for flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate-dev/tollgate/test/load"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := load.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
