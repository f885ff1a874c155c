package app

import (
	"errors"
	"flag"
	"fmt"
	"strconv"

	"github.com/tollgate-dev/tollgate/pkg/server"
)

// protectFlags bound what one replica takes on, so that a flood of calls
// or connections is refused at once instead of growing memory until the
// kernel kills the process. A flag left unset stays zero and so leaves
// server.Config's default in force: the defaults live in one place.
type protectFlags struct {
	maxInFlight    setInt
	maxConnections setInt
	maxStreams     setInt
}

// setInt is an int flag that knows whether it was set.
type setInt struct {
	n   int
	set bool
}

func (s *setInt) String() string {
	if s == nil || !s.set {
		return ""
	}
	return strconv.Itoa(s.n)
}

func (s *setInt) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return errors.New(wantWholeNumber)
	}
	s.n, s.set = n, true
	return nil
}

func (p *protectFlags) register(fs *flag.FlagSet) {
	fs.Var(&p.maxInFlight, "max-in-flight", fmt.Sprintf(
		"unary gRPC calls this replica handles at once, health checks aside; past it a call is answered at once without deciding instead of queueing (ShouldRateLimit by --store-failure; Check refused with 503); 0: no cap (default %d)",
		server.DefaultMaxInFlight))
	fs.Var(&p.maxConnections, "max-connections", fmt.Sprintf(
		"open connections on the gRPC port; past it a new connection is closed as soon as it is accepted; 0: no cap (default %d)",
		server.DefaultMaxConnections))
	fs.Var(&p.maxStreams, "max-concurrent-streams", fmt.Sprintf(
		"calls open at once on one gRPC connection (Envoy opens another connection past it); a stream whose client never reads its answer stays open, costing about 5 KiB, so --max-connections times this bounds what such clients can pin (default %d)",
		server.DefaultMaxConcurrentStreams))
}

func (p *protectFlags) check() error {
	if p.maxInFlight.n < 0 {
		return errors.New("--max-in-flight must be 0 (no cap) or more")
	}
	if p.maxConnections.n < 0 {
		return errors.New("--max-connections must be 0 (no cap) or more")
	}
	if p.maxStreams.set && (p.maxStreams.n < 1 || p.maxStreams.n > 1<<31-1) {
		return errors.New("--max-concurrent-streams must be between 1 and 2147483647")
	}
	return nil
}

// serverCap turns a flag's "0: no cap" into server.Config's, where 0
// means the default and a negative value no cap.
func serverCap(s setInt) int {
	switch {
	case !s.set:
		return 0
	case s.n == 0:
		return -1
	}
	return s.n
}

// inFlight is server.Config.MaxInFlight.
func (p *protectFlags) inFlight() int { return serverCap(p.maxInFlight) }

// connections is server.Config.MaxConnections.
func (p *protectFlags) connections() int { return serverCap(p.maxConnections) }

// streams is server.Config.MaxConcurrentStreams.
func (p *protectFlags) streams() uint32 { return uint32(p.maxStreams.n) }
