package app

import (
	"errors"
	"flag"
	"fmt"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

// validate loads the rules at PATH as serve would and reports each
// problem on its own line, so an editor or CI can jump to it.
func (a *App) validate(args []string) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tollgate validate PATH\n\nPATH is a rule file or a directory of *.yaml files.\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return ExitUsage
	}
	rs, err := config.Load(fs.Arg(0))
	if err != nil {
		// config.Errors renders one problem per line already.
		fmt.Fprintln(a.Stderr, err)
		return ExitError
	}
	for _, w := range append(queueWarnings(rs), fairWarnings(rs)...) {
		fmt.Fprintln(a.Stderr, w)
	}
	fmt.Fprintf(a.Stdout, "ok: %d domains\n", len(rs.Domains()))
	return ExitOK
}
