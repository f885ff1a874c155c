package app

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// health asks a serve in this container or host whether it is ready:
// the image's HEALTHCHECK, since a distroless image has no shell or
// curl to do it. Its --admin-addr is serve's flag and variable
// (TOLLGATE_ADMIN_ADDR), so one setting moves both.
func (a *App) health(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	adminAddr := fs.String("admin-addr", ":8080", "serve's --admin-addr; an unspecified host (\":8080\", \"0.0.0.0:8080\") is asked on loopback")
	path := fs.String("path", "/readyz", "the admin path to GET: /readyz (ready for traffic) or /healthz (the process serves)")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tollgate health [flags]\n\nGET the admin port's --path; exit 0 on 200, else 1. Every flag can also be set with TOLLGATE_<FLAG>.\n\n")
		fs.PrintDefaults()
	}
	if err := a.parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	url, err := healthURL(*adminAddr, *path)
	if err != nil {
		fmt.Fprintf(a.Stderr, "tollgate health: %v\n", err)
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	status, line, err := get(ctx, url)
	if err != nil {
		fmt.Fprintf(a.Stderr, "tollgate health: %v\n", err)
		return ExitError
	}
	// The body's first line is "ok" or "not ready: <reason>": what
	// docker inspect then shows.
	fmt.Fprintf(a.Stdout, "%s: %d %s\n", url, status, line)
	if status != http.StatusOK {
		return ExitError
	}
	return ExitOK
}

// healthURL is the URL of path on the admin port serve binds at addr.
func healthURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--admin-addr %q: %w", addr, err)
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("--path %q: want an absolute path such as /readyz", path)
	}
	switch ip := net.ParseIP(host); {
	case host == "" || (ip != nil && ip.Equal(net.IPv4zero)):
		host = "127.0.0.1"
	case ip != nil && ip.Equal(net.IPv6unspecified):
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// get GETs url and returns the status and the body's first line.
func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	// No proxy from the environment: the admin port is on this host.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }() // a close error loses nothing: the answer is read
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 512), 4096)
	sc.Scan()
	return resp.StatusCode, sc.Text(), nil
}
