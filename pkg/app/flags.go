package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// parseArgs parses args into fs and reports a mistake in one line that
// names the flag, then a pointer to --help: the whole usage (serve's is
// some 80 lines) buries the line that matters. -h and --help print the
// usage and return flag.ErrHelp. A value a flag refuses is reported with
// what was given and the form the flag takes (refusal).
func (a *App) parseArgs(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	var refused error
	// Each value is wrapped only while parsing: the help compares a
	// flag's default with its type's zero value, which a wrapper hides.
	fs.VisitAll(func(f *flag.Flag) { f.Value = &recorded{Value: f.Value, name: f.Name, refused: &refused} })
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.VisitAll(func(f *flag.Flag) { f.Value = f.Value.(*recorded).Value })
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fs.PrintDefaults()
		}
		return err
	case refused != nil:
		err = refused
	}
	fmt.Fprintf(out, "tollgate %s: %v\nRun 'tollgate %s --help' for its usage.\n", fs.Name(), err, fs.Name())
	return errUsage
}

// recorded is a flag's value while parseArgs parses: it keeps the first
// refusal, which flag.FlagSet.Parse would flatten into a string.
type recorded struct {
	flag.Value
	name    string
	refused *error
}

func (r *recorded) Set(s string) error {
	err := r.Value.Set(s)
	if err != nil && *r.refused == nil {
		*r.refused = fmt.Errorf("--%s %q: %s", r.name, s, refusal(s, r.Value, err))
	}
	return err
}

// IsBoolFlag keeps a bool flag taking no argument (-debug, not -debug true).
func (r *recorded) IsBoolFlag() bool {
	b, ok := r.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// refusal says why v refused given (err), in the form the flag takes a
// value: the standard library's values say only "parse error".
// Tollgate's own values say it themselves.
func refusal(given string, v flag.Value, err error) string {
	why := err.Error()
	if g, ok := v.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			why = "want a duration: a number and a unit (ns, us, ms, s, m, h), such as 15ms, 2s, 1m or 1h30m"
			if _, perr := strconv.ParseFloat(strings.TrimSpace(given), 64); perr == nil {
				why = "a duration needs a unit: 15ms, 2s, 1m"
			}
		case bool:
			why = "want true or false"
		case int, int64:
			why = wantWholeNumber
			if _, perr := strconv.ParseInt(given, 0, 64); errors.Is(perr, strconv.ErrRange) {
				why = "out of range"
			}
		case uint, uint64:
			why = "want a whole number, 0 or more, such as 100"
			if _, perr := strconv.ParseUint(given, 0, 64); errors.Is(perr, strconv.ErrRange) {
				why = "out of range"
			}
		case float64:
			why = "want a number, such as 0.5"
		}
	}
	return why
}

// wantWholeNumber is how an integer flag refuses a value.
const wantWholeNumber = "want a whole number, such as 100"
