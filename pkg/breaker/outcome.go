package breaker

import "time"

// Class is what one finished request says about its upstream's health.
type Class uint8

// The classes; docs/outcome-classes.md has the table Classify follows.
const (
	// Neutral says nothing of the upstream: the client went away, the
	// client's request was at fault, or Envoy or a filter answered without
	// the upstream. A probe's neutral outcome frees its slot.
	Neutral Class = iota
	// Success is a clean 2xx or 3xx from the upstream.
	Success
	// Failure is the upstream failing: a 5xx it sent (a 503 or 504 only
	// while it was not busy), a connection it refused or reset, or a
	// timeout waiting for it while it was not busy.
	Failure
	// Overload is the upstream, or Envoy in front of it, turning work
	// away for want of capacity: the vendor's 429, Envoy's cluster
	// overflow (UO), and a 503, 504 or timeout (UT) while the upstream
	// was busy (Outcome.Busy). It never counts toward opening a breaker:
	// a busy upstream is not a broken one, and shedding, not the
	// breaker, is what relieves it. Pressure counts it.
	Overload

	numClasses = iota
)

func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Overload:
		return "overload"
	}
	return "neutral"
}

// Flags are the Envoy response flags (the access log's ResponseFlags) that
// Classify reads, one bit each; every other flag Envoy can set is
// FlagOther. An adapter maps each flag it sees.
type Flags uint32

// The flags, with Envoy's short names.
const (
	// FlagUpstreamConnectionFailure (UF): the upstream refused or dropped
	// the connection attempt.
	FlagUpstreamConnectionFailure Flags = 1 << iota
	// FlagUpstreamConnectionTermination (UC): the upstream closed the
	// connection under the request.
	FlagUpstreamConnectionTermination
	// FlagUpstreamRemoteReset (UR): the upstream reset the stream.
	FlagUpstreamRemoteReset
	// FlagUpstreamRequestTimeout (UT): Envoy's route or per-try timeout
	// fired waiting for the upstream.
	FlagUpstreamRequestTimeout
	// FlagNoHealthyUpstream (UH): health checks or outlier detection left
	// no host to send to.
	FlagNoHealthyUpstream
	// FlagUpstreamProtocolError (UPE): the upstream's response broke HTTP.
	FlagUpstreamProtocolError
	// FlagDNSResolutionFailure (DF): the upstream's name did not resolve.
	FlagDNSResolutionFailure
	// FlagStreamIdleTimeout (SI): nothing moved on the stream, either way,
	// for the stream idle timeout.
	FlagStreamIdleTimeout
	// FlagDownstreamConnectionTermination (DC): the client's connection
	// ended under the request.
	FlagDownstreamConnectionTermination
	// FlagDownstreamRemoteReset (DR): the client reset its HTTP/2 or
	// HTTP/3 stream.
	FlagDownstreamRemoteReset
	// FlagUpstreamOverflow (UO): Envoy's circuit breaker on the cluster
	// (max requests, pending or retries) refused the request.
	FlagUpstreamOverflow
	// FlagOther is any other flag: a local reply or reset by Envoy or a
	// filter (RL, UAEX, RLSE, NR, NC, FI, OM, DO, IH, DPE, LH, NFCF,
	// RFCF), Envoy's own duration caps (DT, UMSDR), a local reset (LR),
	// or retries exhausted (URX).
	FlagOther
)

// upstreamFailed are the flags that say the upstream failed, whatever
// the status.
const upstreamFailed = FlagUpstreamConnectionFailure | FlagUpstreamConnectionTermination |
	FlagUpstreamRemoteReset | FlagNoHealthyUpstream |
	FlagUpstreamProtocolError | FlagDNSResolutionFailure

// clientEnded are the flags of a client that went away.
const clientEnded = FlagDownstreamConnectionTermination | FlagDownstreamRemoteReset

// DetailsViaUpstream is Envoy's response code details for a status the
// upstream sent.
const DetailsViaUpstream = "via_upstream"

// Facts are what Envoy reports about a finished request, as Classify
// needs them; pkg/accesslog reads them from an access log entry.
type Facts struct {
	// Status is the HTTP status sent downstream, 0 when none was (the
	// client went away first).
	Status uint32
	// Details is Envoy's response code details: DetailsViaUpstream when
	// the upstream sent Status, otherwise why Envoy answered itself. Empty
	// from an Envoy too old to send it.
	Details string
	// Flags are Envoy's response flags.
	Flags Flags
	// Duration is the request's duration.
	Duration time.Duration
	// Received: Envoy had the whole request from the client.
	Received bool
	// Sent: the whole request had gone upstream, SentAt after its start.
	Sent   bool
	SentAt time.Duration
	// Answered: at least one byte of a response came from the upstream.
	Answered bool
	// Upstream is the cluster of the host the request went to; empty when
	// no host was picked.
	Upstream string
}

// Outcome is a finished request as a breaker needs it.
type Outcome struct {
	Facts
	// Name is the value of the breaker's descriptor key for the request.
	Name string
	// Busy says the upstream Name had as many requests in flight as its
	// capacity when the request finished (a BusyFunc's answer): its 503,
	// 504 or timeout is then Overload, not Failure. Only read when
	// MayBeOverload(Facts).
	Busy bool
	// ProbeID is the Verdict's ProbeID when the request was a probe.
	ProbeID string
	// Once, when set, names the request (its ticket's ID): its failure
	// counts at most once however often it is delivered.
	Once string
}

// BusyFunc says whether the upstream name (a breaker's value, usually a
// model) of domain has as many requests in flight as its capacity now.
// A nil BusyFunc is never busy.
type BusyFunc func(domain, name string) bool

// Classify says what o tells of its upstream under c, following the
// table in docs/outcome-classes.md, first match wins:
//
//  1. no Name: Neutral.
//  2. UT (Envoy's timeout waiting for the upstream): Overload when Busy,
//     else Failure.
//  3. UF, UC, UR, UH, UPE or DF: Failure, whatever the status.
//  4. UO (Envoy's own cluster circuit breaker refused): Overload.
//  5. SI: Failure when Envoy had the whole request and had sent it upstream
//     and no byte came back (the upstream stayed silent); otherwise Neutral
//     (the client stopped sending, or the answer had started and the client
//     may have stopped reading).
//  6. a status the upstream sent (Details via_upstream; or no Details, an
//     Upstream and no flags, from an old Envoy): 429 is Overload; 503 or
//     504 is Overload when Busy, else Failure; another 5xx is a Failure;
//     2xx or 3xx with no flag at all is a Success; anything else (408,
//     other 4xx, a 2xx the client cut with DC) is Neutral.
//  7. the client went away (Status 0, DC or DR): Failure only when
//     c.Timeout is set and the upstream had had the whole request for at
//     least Timeout without a byte back; otherwise Neutral.
//  8. anything else is a reply by Envoy or a filter (Tollgate's own
//     denials, rate limits, no route, Envoy's overload manager): Neutral.
func Classify(c Config, o Outcome) Class {
	if o.Name == "" {
		return Neutral
	}
	return ClassifyFacts(o.Facts, o.Busy, c.Timeout)
}

// ClassifyFacts is Classify for a request that has a name: rules 2 to 8,
// with busy as Outcome.Busy and timeout as Config.Timeout. Pressure
// classifies with it, for requests with or without a breaker.
func ClassifyFacts(f Facts, busy bool, timeout time.Duration) Class {
	switch {
	case f.Flags&FlagUpstreamRequestTimeout != 0:
		if busy {
			return Overload
		}
		return Failure
	case f.Flags&upstreamFailed != 0:
		return Failure
	case f.Flags&FlagUpstreamOverflow != 0:
		return Overload
	case f.Flags&FlagStreamIdleTimeout != 0:
		if f.Received && f.Sent && !f.Answered {
			return Failure
		}
		return Neutral
	case f.Status != 0 && viaUpstream(f):
		switch {
		case f.Status == 429:
			return Overload
		case f.Status == 503 || f.Status == 504:
			if busy {
				return Overload
			}
			return Failure
		case f.Status >= 500 && f.Status < 600:
			return Failure
		case f.Status >= 200 && f.Status < 400 && f.Flags == 0:
			return Success
		}
		return Neutral
	case f.Status == 0 || f.Flags&clientEnded != 0:
		if timeout > 0 && f.Sent && !f.Answered && f.Duration-f.SentAt >= timeout {
			return Failure
		}
	}
	return Neutral
}

// MayBeOverload says whether busy can change f's class: a caller asks
// its BusyFunc only then, so that the common outcome costs no lookup.
func MayBeOverload(f Facts) bool {
	return ClassifyFacts(f, false, 0) != ClassifyFacts(f, true, 0)
}

// viaUpstream says whether f's status came from the upstream.
func viaUpstream(f Facts) bool {
	if f.Details == "" {
		// An Envoy without response code details: a status with a host
		// and no flag is the upstream's.
		return f.Upstream != "" && f.Flags == 0
	}
	return f.Details == DetailsViaUpstream
}
