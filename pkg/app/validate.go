package app

import (
	"errors"
	"flag"
	"fmt"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
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
	for _, w := range append(append(ruleWarnings(rs), queueWarnings(rs)...), fairWarnings(rs)...) {
		fmt.Fprintln(a.Stderr, w)
	}
	fmt.Fprintf(a.Stdout, "ok: %d domains\n", len(rs.Domains()))
	return ExitOK
}

// ruleWarnings are the parser's warnings of every domain: what a file
// says that loads but is ignored or read leniently, as
// envoyproxy/ratelimit reads it (limit.Domain.Warnings).
func ruleWarnings(rs *limit.RuleSet) []string {
	var out []string
	for _, d := range rs.Domains() {
		out = append(out, d.Warnings...)
	}
	return out
}

// logRuleWarnings logs ruleWarnings, one line each, at serve's load and
// reload.
func logRuleWarnings(log *zap.Logger, rs *limit.RuleSet) {
	for _, w := range ruleWarnings(rs) {
		log.Warn("rules: "+w, zap.String("kind", "rules_warning"))
	}
}
