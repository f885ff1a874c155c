// Command tollgate serves Envoy's rate limit API from shared counters.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate-dev/tollgate/pkg/app"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := &app.App{Stdout: os.Stdout, Stderr: os.Stderr, LookupEnv: os.LookupEnv, Version: version}
	code := a.Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
