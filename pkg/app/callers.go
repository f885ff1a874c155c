package app

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/server"
)

// grpcServices returns the gRPC services a name given to --allow-callers
// stands for: the APIs the server registers (ext_proc included, whether or
// not this build serves it), by short name or gRPC service name, plus
// health and reflection. reflection stands for both versions grpc-go
// registers: restricting one would leave the other open.
func grpcServices(name string) ([]string, bool) {
	switch name {
	case "ratelimit", "envoy.service.ratelimit.v3.RateLimitService":
		return []string{"envoy.service.ratelimit.v3.RateLimitService"}, true
	case "ext_authz", "envoy.service.auth.v3.Authorization":
		return []string{"envoy.service.auth.v3.Authorization"}, true
	case "accesslog", "envoy.service.accesslog.v3.AccessLogService":
		return []string{"envoy.service.accesslog.v3.AccessLogService"}, true
	case "ext_proc", "envoy.service.ext_proc.v3.ExternalProcessor":
		return []string{"envoy.service.ext_proc.v3.ExternalProcessor"}, true
	case "health", "grpc.health.v1.Health":
		return []string{"grpc.health.v1.Health"}, true
	case "reflection":
		return []string{"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}, true
	}
	return nil, false
}

// serviceNames are the short names --allow-callers takes, for its errors.
const serviceNames = "accesslog, ext_proc, ext_authz, ratelimit, health, reflection, or a gRPC service name of the first five"

// callerFlags is --allow-callers: who may call which API on the gRPC port.
// It stays comparable, as serveFlags is compared whole in tests.
type callerFlags struct {
	raw    string          // every --allow-callers value, joined by ";"
	parsed *server.Callers // nil: every API open, as without the flag
}

func (c *callerFlags) register(fs *flag.FlagSet) {
	fs.Func("allow-callers", "SERVICE=SAN[,SAN...][;SERVICE=...]: only clients whose certificate has one of these URI SANs (SPIFFE IDs) may call SERVICE; "+
		"a SAN ending in /* matches as a prefix. SERVICE: "+serviceNames+". "+
		"Services not listed stay open to every client certificate. Repeatable; needs --tls-client-ca", c.set)
}

// set adds one --allow-callers value; check parses them all together.
func (c *callerFlags) set(v string) error {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	if c.raw != "" {
		c.raw += ";"
	}
	c.raw += v
	return nil
}

// check builds the allow-list, so a bad entry or SAN stops the start with
// a usage error. An allow-list needs client certificates: without them no
// caller could ever match.
func (c *callerFlags) check(tls tlsFlags) error {
	allow, err := parseAllowCallers(c.raw)
	if err != nil {
		return fmt.Errorf("--allow-callers: %w", err)
	}
	if len(allow) == 0 {
		return nil
	}
	if tls.clientCA == "" {
		return errors.New("--allow-callers needs --tls-client-ca: callers are told apart by their client certificates")
	}
	callers, err := server.NewCallers(allow)
	if err != nil {
		return fmt.Errorf("--allow-callers: %w", err)
	}
	c.parsed = callers
	return nil
}

// parseAllowCallers reads SERVICE=SAN[,SAN...] entries separated by ";"
// into gRPC service name -> SANs. Blank input is no allow-list. The SANs
// themselves are checked by server.NewCallers.
func parseAllowCallers(s string) (map[string][]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	allow := map[string][]string{}
	for entry := range strings.SplitSeq(s, ";") {
		name, list, ok := strings.Cut(entry, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want SERVICE=SAN[,SAN...]", strings.TrimSpace(entry))
		}
		services, ok := grpcServices(name)
		if !ok {
			return nil, fmt.Errorf("%q is not a service Tollgate serves; want %s", name, serviceNames)
		}
		var sans []string
		for san := range strings.SplitSeq(list, ",") {
			san = strings.TrimSpace(san)
			if san == "" {
				return nil, fmt.Errorf("%s: an empty SAN in %q", name, strings.TrimSpace(list))
			}
			sans = append(sans, san)
		}
		for _, svc := range services {
			if _, dup := allow[svc]; dup {
				return nil, fmt.Errorf("%s: %s is listed twice; put all its SANs in one entry", name, svc)
			}
			allow[svc] = sans
		}
	}
	return allow, nil
}
