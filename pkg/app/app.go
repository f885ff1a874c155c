// Package app is Tollgate's composition root: it parses the command line,
// builds the logger, metrics registry, rules, store, limiter and APIs, and
// hands them to the server. It is the only package that wires them.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
)

// Exit codes of Run.
const (
	ExitOK    = 0
	ExitError = 1 // bad rules, a store or listener that cannot start
	ExitUsage = 2 // bad command line
)

// Addrs are the addresses serve listens on, with real ports when the
// flags asked for port 0.
type Addrs struct {
	GRPC  net.Addr
	Admin net.Addr
}

// App is one invocation of the tollgate command. Its fields are the
// process's environment, passed in so that tests can run it in-process
// and in parallel.
type App struct {
	Stdout io.Writer
	// Stderr receives usage errors, validate's problems and the log.
	Stderr io.Writer
	// LookupEnv reads TOLLGATE_* variables (Optional; nil reads none).
	// main passes os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Version is what `tollgate version` prints (Optional; default "dev").
	Version string
	// Listening, when set, is called once serve has bound its listeners
	// and before it serves, so a caller that asked for port 0 can learn
	// the ports.
	Listening func(Addrs)

	// wrapStore lets in-package tests slow or fail the store.
	wrapStore func(pingStore) pingStore
}

const usage = `Usage: tollgate <command> [arguments]

Commands:
  serve [flags]    serve Envoy's rate limit API and the admin HTTP API
  validate PATH    check a rule file or directory; print each problem as file:line: path: message
  explain [flags]  show which rules, plan, shedding step, breakers and store keys a request meets
  health [flags]   ask the admin port of a serve on this host whether it is ready; exit 0 or 1
  version          print the version (also: tollgate --version)

Run 'tollgate serve -h' for serve's flags.
`

// errUsage marks a command line error that has already been reported.
var errUsage = errors.New("usage")

// Run runs the command in args (without the program name) until it ends
// or ctx is done, and returns the process exit code.
func (a *App) Run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.Stderr, usage)
		return ExitUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		return a.serve(ctx, rest)
	case "validate":
		return a.validate(rest)
	case "explain":
		return a.explain(ctx, rest)
	case "health":
		return a.health(ctx, rest)
	case "version", "--version", "-version", "-v":
		return a.version(rest)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(a.Stdout, usage)
		return ExitOK
	default:
		fmt.Fprintf(a.Stderr, "tollgate: unknown command %q\nRun 'tollgate --help' for the commands.\n", cmd)
		return ExitUsage
	}
}

func (a *App) version(args []string) int {
	if len(args) != 0 {
		fmt.Fprintf(a.Stderr, "tollgate version: takes no arguments\n")
		return ExitUsage
	}
	v := a.Version
	if v == "" {
		v = "dev"
	}
	fmt.Fprintln(a.Stdout, v)
	return ExitOK
}

func (a *App) lookupEnv(name string) (string, bool) {
	if a.LookupEnv == nil {
		return "", false
	}
	return a.LookupEnv(name)
}

// envName is the variable that sets a flag: TOLLGATE_ and the flag's name
// in upper case with dashes as underscores (grpc-addr -> TOLLGATE_GRPC_ADDR).
func envName(flagName string) string {
	return "TOLLGATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args into fs (parseArgs), then fills every flag the
// command line did not set from its environment variable: a flag beats
// the variable.
func (a *App) parseFlags(fs *flag.FlagSet, args []string) error {
	if err := a.parseArgs(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := a.lookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q (--%s): %s", name, v, f.Name, refusal(v, f.Value, e))
			}
		}
	})
	if err != nil {
		fmt.Fprintf(fs.Output(), "tollgate %s: %v\n", fs.Name(), err)
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "tollgate %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return errUsage
	}
	return nil
}
