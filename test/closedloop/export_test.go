package closedloop

import "time"

// What the external test package (scenario_test.go, package
// closedloop_test) uses of this one's unexported parts. The scenario tests
// live outside package closedloop so that they can import envoysim and
// upstream, which import closedloop.
var Goodput = goodput

// NewFakeUpstream is the bench's own fake upstream (fakeupstream_test.go).
func NewFakeUpstream(c UpstreamConfig, service time.Duration) Upstream {
	return newFakeUpstream(c, service)
}
