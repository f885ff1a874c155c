package app

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const validateUsage = `Usage: tollgate validate [--authz-config FILE] [--strict] PATH

Checks the files serve would load, as serve loads them, and prints each
problem as file:line: path: message, so an editor or CI can jump to it:
the rules at PATH (a rule file, or a directory of *.yaml files), and with
--authz-config the ext_authz settings and the keys file they name, each
alone and against the rules (the domain, the descriptors, the keys' tiers
and limit names). Warnings are what loads but is ignored or read
leniently; --strict refuses them too.

Exit status: 0 valid, 1 problems (or warnings under --strict), 2 usage.

`

// validate loads the files at PATH (and --authz-config) as serve would
// and reports each problem on its own line.
func (a *App) validate(args []string) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), validateUsage)
		fs.PrintDefaults()
	}
	authzPath := fs.String("authz-config", "", "ext_authz settings file, checked with its keys file and against the rules")
	strict := fs.Bool("strict", false, "refuse warnings too: exit 1 when there is any")
	if err := a.parseArgs(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(a.Stderr, "tollgate validate: want one PATH, got %d arguments\nRun 'tollgate validate --help' for its usage.\n", fs.NArg())
		return ExitUsage
	}
	rs, err := config.Load(fs.Arg(0))
	if err != nil {
		// config.Errors renders one problem per line already.
		fmt.Fprintln(a.Stderr, err)
		return ExitError
	}
	warnings := allWarnings(rs)
	summary := fmt.Sprintf("ok: %d domains", len(rs.Domains()))
	if *authzPath != "" {
		set, err := extauthz.LoadSettings(*authzPath)
		if err != nil {
			fmt.Fprintln(a.Stderr, err)
			return ExitError
		}
		problems, more := set.Against(rs)
		if len(problems) > 0 {
			fmt.Fprintln(a.Stderr, problems)
			return ExitError
		}
		warnings = append(warnings, more...)
		summary += fmt.Sprintf("; authz config %s: domain %s, %d descriptors, %d keys", *authzPath, set.Domain, len(set.Descriptors), set.Keys.Len())
	}
	for _, w := range warnings {
		fmt.Fprintln(a.Stderr, w)
	}
	if err := strictly(*strict, warnings); err != nil {
		fmt.Fprintf(a.Stderr, "tollgate validate: %d warnings, refused under --strict\n", len(warnings))
		return ExitError
	}
	fmt.Fprintln(a.Stdout, summary)
	return ExitOK
}

// allWarnings are every warning validate prints for rs: the parser's,
// the queues' and the fair-shared limits'.
func allWarnings(rs *limit.RuleSet) []string {
	return append(append(ruleWarnings(rs), queueWarnings(rs)...), fairWarnings(rs)...)
}

// strictly is, under --strict, the error of warnings: each on a line,
// then how many were refused; nil without --strict or warnings.
func strictly(strict bool, warnings []string) error {
	if !strict || len(warnings) == 0 {
		return nil
	}
	return errors.New(strings.Join(warnings, "\n") + fmt.Sprintf("\n%d warnings, refused under --strict", len(warnings)))
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
