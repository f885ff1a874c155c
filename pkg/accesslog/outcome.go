package accesslog

import (
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
)

// Facts reads from an HTTP access log entry what the circuit breakers
// classify (breaker.Classify, docs/outcome-classes.md). Envoy fills the
// entry so (its gRPC access logger): response_code only when a status
// was sent (unset when the client left first), response_code_details
// "via_upstream" when the upstream sent it, upstream_cluster only when a
// host was picked, and each timing only once it happened.
func Facts(e *datav3.HTTPAccessLogEntry) breaker.Facts {
	c := e.GetCommonProperties()
	return breaker.Facts{
		Status:   e.GetResponse().GetResponseCode().GetValue(),
		Details:  e.GetResponse().GetResponseCodeDetails(),
		Flags:    flags(c.GetResponseFlags()),
		Duration: c.GetDuration().AsDuration(),
		Received: c.GetTimeToLastRxByte() != nil,
		Sent:     c.GetTimeToLastUpstreamTxByte() != nil,
		SentAt:   c.GetTimeToLastUpstreamTxByte().AsDuration(),
		Answered: c.GetTimeToFirstUpstreamRxByte() != nil,
		Upstream: c.GetUpstreamCluster(),
	}
}

// flagBits maps ResponseFlags fields to breaker.Flags. A field set in an
// entry and missing here (a flag Envoy added later included) is
// breaker.FlagOther, so that a new kind of trouble never reads as a clean
// success; delay_injected maps to nothing, as a delay says nothing of
// the answer.
var flagBits = map[protoreflect.Name]breaker.Flags{
	"upstream_connection_failure":       breaker.FlagUpstreamConnectionFailure,
	"upstream_connection_termination":   breaker.FlagUpstreamConnectionTermination,
	"upstream_remote_reset":             breaker.FlagUpstreamRemoteReset,
	"upstream_request_timeout":          breaker.FlagUpstreamRequestTimeout,
	"no_healthy_upstream":               breaker.FlagNoHealthyUpstream,
	"upstream_protocol_error":           breaker.FlagUpstreamProtocolError,
	"dns_resolution_failure":            breaker.FlagDNSResolutionFailure,
	"stream_idle_timeout":               breaker.FlagStreamIdleTimeout,
	"upstream_overflow":                 breaker.FlagUpstreamOverflow,
	"downstream_connection_termination": breaker.FlagDownstreamConnectionTermination,
	"downstream_remote_reset":           breaker.FlagDownstreamRemoteReset,
	"delay_injected":                    0,
}

// flags returns the breaker.Flags of f's set fields.
func flags(f *datav3.ResponseFlags) breaker.Flags {
	if f == nil {
		return 0
	}
	m := f.ProtoReflect()
	var out breaker.Flags
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		b, ok := flagBits[fd.Name()]
		if !ok {
			b = breaker.FlagOther
		}
		out |= b
		return true
	})
	if len(m.GetUnknown()) > 0 {
		// Fields of a newer Envoy than these protos.
		out |= breaker.FlagOther
	}
	return out
}
