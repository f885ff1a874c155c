package app

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/pressure"
)

// MinAdminTokenBytes is the shortest token --admin-token-file and
// --pressure-token-file accept, the pressure handler's own minimum.
const MinAdminTokenBytes = pressure.MinTokenBytes

// debugFlags are serve's diagnostics on the admin port. Both are off by
// default: /debug/config shows the rules and the store's address, and a
// profile costs CPU while it runs and shows the command line.
type debugFlags struct {
	debug     bool
	pprof     bool
	tokenFile string

	token string // read from tokenFile by check
}

func (d *debugFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&d.debug, "debug", false, "serve /debug/config and /debug/pressure on the admin port; needs a loopback --admin-addr or --admin-token-file")
	fs.BoolVar(&d.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin port (profiles cost CPU while they run); needs a loopback --admin-addr or --admin-token-file")
	fs.StringVar(&d.tokenFile, "admin-token-file", "", fmt.Sprintf("file holding the bearer token (at least %d bytes) every /debug/ path on the admin port then needs; read at start", MinAdminTokenBytes))
}

// on says whether any /debug/ endpoint is served.
func (d *debugFlags) on() bool { return d.debug || d.pprof }

// check reads the token and refuses a /debug/ endpoint that anyone who
// reaches the admin port could read: one needs the admin port on
// loopback, or a token.
func (d *debugFlags) check(adminAddr string) error {
	if d.tokenFile != "" {
		tok, err := readToken("--admin-token-file", d.tokenFile)
		if err != nil {
			return err
		}
		d.token = tok
	}
	if d.on() && d.token == "" && !loopback(adminAddr) {
		return fmt.Errorf("--debug and --pprof need --admin-addr on loopback (127.0.0.1:8080), or --admin-token-file: --admin-addr %q is reachable from other hosts", adminAddr)
	}
	return nil
}

// readToken reads a bearer token from path, surrounding white space cut
// off, and refuses one under MinAdminTokenBytes. Errors never quote it.
func readToken(flagName, path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	tok := strings.TrimSpace(string(raw))
	if n := len(tok); n < MinAdminTokenBytes {
		return "", fmt.Errorf("%s %q: the token is %d bytes, want at least %d (head -c 32 /dev/urandom | base64)", flagName, path, n, MinAdminTokenBytes)
	}
	return tok, nil
}

// loopback says whether addr (host:port) listens on loopback only. An
// empty host, 0.0.0.0 and :: listen on every interface; a name other
// than localhost might resolve anywhere.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redactArgs returns args with the password of every URL in them
// replaced, for /debug/pprof/cmdline: --redis-url may carry one.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, arg := range args {
		if name, value, ok := strings.Cut(arg, "="); ok && strings.HasPrefix(name, "-") {
			out[i] = name + "=" + redactURL(value)
			continue
		}
		out[i] = redactURL(arg)
	}
	return out
}
