package accesslog

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"math"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
)

// Timings of the entries below, from the request's start.
const (
	rxDone   = 4 * time.Millisecond   // the client's last byte
	txDone   = 6 * time.Millisecond   // the last byte sent upstream
	rxFirst  = 350 * time.Millisecond // the upstream's first byte
	duration = 2 * time.Second
)

// envoyEntry is a final entry as Envoy's gRPC access logger writes it for
// a request it received in full and proxied to host 10.0.0.7:8000 of
// cluster "llm", whose answer started at rxFirst: the common case. Each
// row changes what differs in its scenario.
func envoyEntry(status uint32, details string, flags *datav3.ResponseFlags) *datav3.HTTPAccessLogEntry {
	e := &datav3.HTTPAccessLogEntry{
		CommonProperties: &datav3.AccessLogCommon{
			TimeToLastRxByte:            durationpb.New(rxDone),
			TimeToFirstUpstreamTxByte:   durationpb.New(5 * time.Millisecond),
			TimeToLastUpstreamTxByte:    durationpb.New(txDone),
			TimeToFirstUpstreamRxByte:   durationpb.New(rxFirst),
			TimeToLastUpstreamRxByte:    durationpb.New(duration - time.Millisecond),
			TimeToFirstDownstreamTxByte: durationpb.New(rxFirst + time.Millisecond),
			TimeToLastDownstreamTxByte:  durationpb.New(duration),
			UpstreamRemoteAddress: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: "10.0.0.7", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8000},
			}}},
			UpstreamCluster:             "llm",
			ResponseFlags:               flags,
			Duration:                    durationpb.New(duration),
			UpstreamRequestAttemptCount: 1,
			AccessLogType:               datav3.AccessLogType_DownstreamEnd,
		},
		ProtocolVersion: datav3.HTTPAccessLogEntry_HTTP2,
		Request:         &datav3.HTTPRequestProperties{RequestMethod: corev3.RequestMethod_POST, Path: "/v1/chat/completions"},
		Response:        &datav3.HTTPResponseProperties{ResponseCodeDetails: details},
	}
	if status != 0 {
		e.Response.ResponseCode = wrapperspb.UInt32(status)
	}
	return e
}

// noAnswer: the request went upstream and nothing came back.
func noAnswer(e *datav3.HTTPAccessLogEntry) *datav3.HTTPAccessLogEntry {
	c := e.CommonProperties
	c.TimeToFirstUpstreamRxByte, c.TimeToLastUpstreamRxByte = nil, nil
	return e
}

// notSent: Envoy answered before the request went upstream, and picked
// no host (so no upstream cluster or address).
func notSent(e *datav3.HTTPAccessLogEntry) *datav3.HTTPAccessLogEntry {
	c := noAnswer(e).CommonProperties
	c.TimeToFirstUpstreamTxByte, c.TimeToLastUpstreamTxByte = nil, nil
	c.UpstreamRemoteAddress, c.UpstreamCluster, c.UpstreamRequestAttemptCount = nil, "", 0
	return e
}

// incomplete: the client never sent its whole request.
func incomplete(e *datav3.HTTPAccessLogEntry) *datav3.HTTPAccessLogEntry {
	notSent(e).CommonProperties.TimeToLastRxByte = nil
	return e
}

// lasting sets the entry's duration.
func lasting(d time.Duration, e *datav3.HTTPAccessLogEntry) *datav3.HTTPAccessLogEntry {
	e.CommonProperties.Duration = durationpb.New(d)
	e.CommonProperties.TimeToLastDownstreamTxByte = nil
	return e
}

// withUnknownFlag adds to the flags a field these protos do not know,
// as a newer Envoy's would arrive.
func withUnknownFlag(e *datav3.HTTPAccessLogEntry) *datav3.HTTPAccessLogEntry {
	if e.CommonProperties.ResponseFlags == nil {
		e.CommonProperties.ResponseFlags = &datav3.ResponseFlags{}
	}
	b := protowire.AppendTag(nil, 99, protowire.VarintType)
	b = protowire.AppendVarint(b, 1)
	e.CommonProperties.ResponseFlags.ProtoReflect().SetUnknown(b)
	return e
}

const clientLeft = "downstream_remote_disconnect"

// breakerTimeout is the `timeout:` of the rows that name it.
const breakerTimeout = 30 * time.Second

// outcomeRows are the rows of docs/outcome-classes.md, by name.
var outcomeRows = []struct {
	name    string
	give    *datav3.HTTPAccessLogEntry
	timeout time.Duration // the breaker's timeout:, 0 for none
	noName  bool          // the request carries no value for the breaker
	busy    bool          // the upstream was at its capacity (breaker.Outcome.Busy)
	want    breaker.Class
}{
	{name: "upstream 5xx", give: envoyEntry(503, "via_upstream", nil), want: breaker.Failure},
	{name: "upstream 5xx after retries (URX)", give: envoyEntry(500, "via_upstream",
		&datav3.ResponseFlags{UpstreamRetryLimitExceeded: true}), want: breaker.Failure},
	{name: "upstream 5xx, busy", give: envoyEntry(500, "via_upstream", nil), busy: true, want: breaker.Failure},
	{name: "upstream 503, busy", give: envoyEntry(503, "via_upstream", nil), busy: true, want: breaker.Overload},
	{name: "upstream 504, busy", give: envoyEntry(504, "via_upstream", nil), busy: true, want: breaker.Overload},
	{name: "upstream 504, not busy", give: envoyEntry(504, "via_upstream", nil), want: breaker.Failure},
	{name: "upstream 503 after retries, busy", give: envoyEntry(503, "via_upstream",
		&datav3.ResponseFlags{UpstreamRetryLimitExceeded: true}), busy: true, want: breaker.Overload},
	{name: "vendor 429", give: envoyEntry(429, "via_upstream", nil), want: breaker.Overload},
	{name: "connect failure (UF)", give: noAnswer(envoyEntry(503, "upstream_reset_before_response_started{remote_connection_failure}",
		&datav3.ResponseFlags{UpstreamConnectionFailure: true})), want: breaker.Failure},
	{name: "connection terminated (UC)", give: noAnswer(envoyEntry(503, "upstream_reset_before_response_started{connection_termination}",
		&datav3.ResponseFlags{UpstreamConnectionTermination: true})), want: breaker.Failure},
	{name: "upstream reset (UR)", give: noAnswer(envoyEntry(503, "upstream_reset_before_response_started{remote_reset}",
		&datav3.ResponseFlags{UpstreamRemoteReset: true})), want: breaker.Failure},
	{name: "upstream reset after response started", give: envoyEntry(200, "upstream_reset_after_response_started{remote_reset}",
		&datav3.ResponseFlags{UpstreamRemoteReset: true}), want: breaker.Failure},
	{name: "upstream protocol error (UPE)", give: envoyEntry(502, "upstream_reset_before_response_started{protocol_error}",
		&datav3.ResponseFlags{UpstreamProtocolError: true}), want: breaker.Failure},
	{name: "dns failure (DF)", give: notSent(envoyEntry(503, "dns_resolution_failure",
		&datav3.ResponseFlags{DnsResolutionFailure: true})), want: breaker.Failure},
	{name: "route timeout (UT)", give: noAnswer(envoyEntry(504, "response_timeout",
		&datav3.ResponseFlags{UpstreamRequestTimeout: true})), want: breaker.Failure},
	{name: "per-try timeout (UT)", give: noAnswer(envoyEntry(504, "upstream_per_try_timeout",
		&datav3.ResponseFlags{UpstreamRequestTimeout: true})), want: breaker.Failure},
	{name: "route timeout (UT), busy", give: noAnswer(envoyEntry(504, "response_timeout",
		&datav3.ResponseFlags{UpstreamRequestTimeout: true})), busy: true, want: breaker.Overload},
	{name: "upstream reset (UR), busy", give: noAnswer(envoyEntry(503, "upstream_reset_before_response_started{remote_reset}",
		&datav3.ResponseFlags{UpstreamRemoteReset: true})), busy: true, want: breaker.Failure},
	{name: "no healthy upstream (UH)", give: notSent(envoyEntry(503, "no_healthy_upstream",
		&datav3.ResponseFlags{NoHealthyUpstream: true})), want: breaker.Failure},
	{name: "stream idle, upstream silent (SI)", give: noAnswer(envoyEntry(504, "stream_idle_timeout",
		&datav3.ResponseFlags{StreamIdleTimeout: true})), want: breaker.Failure},
	{name: "stream idle, request incomplete (SI)", give: incomplete(envoyEntry(408, "stream_idle_timeout",
		&datav3.ResponseFlags{StreamIdleTimeout: true})), want: breaker.Neutral},
	{name: "stream idle, answer started (SI)", give: envoyEntry(200, "stream_idle_timeout",
		&datav3.ResponseFlags{StreamIdleTimeout: true}), want: breaker.Neutral},
	{name: "upstream 2xx", give: envoyEntry(200, "via_upstream", nil), want: breaker.Success},
	{name: "upstream 3xx", give: envoyEntry(302, "via_upstream", nil), want: breaker.Success},
	{name: "upstream 2xx with a delay injected (DI)", give: envoyEntry(200, "via_upstream",
		&datav3.ResponseFlags{DelayInjected: true}), want: breaker.Success},
	{name: "upstream 408", give: envoyEntry(408, "via_upstream", nil), want: breaker.Neutral},
	{name: "upstream 4xx", give: envoyEntry(400, "via_upstream", nil), want: breaker.Neutral},
	{name: "client disconnect (DC)", give: noAnswer(envoyEntry(0, clientLeft,
		&datav3.ResponseFlags{DownstreamConnectionTermination: true})), want: breaker.Neutral},
	{name: "client reset (DR)", give: noAnswer(envoyEntry(0, "http2.remote_reset",
		&datav3.ResponseFlags{DownstreamRemoteReset: true})), want: breaker.Neutral},
	{name: "client cut a streamed 2xx", give: envoyEntry(200, clientLeft,
		&datav3.ResponseFlags{DownstreamConnectionTermination: true}), want: breaker.Neutral},
	{name: "client left, upstream silent past timeout", give: lasting(txDone+breakerTimeout, noAnswer(envoyEntry(0, clientLeft,
		&datav3.ResponseFlags{DownstreamConnectionTermination: true}))), timeout: breakerTimeout, want: breaker.Failure},
	{name: "client left, upstream silent, no timeout", give: lasting(txDone+breakerTimeout, noAnswer(envoyEntry(0, clientLeft,
		&datav3.ResponseFlags{DownstreamConnectionTermination: true}))), want: breaker.Neutral},
	{name: "client left before timeout", give: lasting(txDone+breakerTimeout-time.Millisecond, noAnswer(envoyEntry(0, clientLeft,
		&datav3.ResponseFlags{DownstreamConnectionTermination: true}))), timeout: breakerTimeout, want: breaker.Neutral},
	{name: "client left during its upload", give: lasting(2*breakerTimeout, incomplete(envoyEntry(0, clientLeft,
		&datav3.ResponseFlags{DownstreamConnectionTermination: true}))), timeout: breakerTimeout, want: breaker.Neutral},
	{name: "tollgate denial (UAEX)", give: notSent(envoyEntry(429, "ext_authz_denied",
		&datav3.ResponseFlags{UnauthorizedDetails: &datav3.ResponseFlags_Unauthorized{
			Reason: datav3.ResponseFlags_Unauthorized_EXTERNAL_SERVICE,
		}})), want: breaker.Neutral},
	{name: "rate limited (RL)", give: notSent(envoyEntry(429, "request_rate_limited",
		&datav3.ResponseFlags{RateLimited: true})), want: breaker.Neutral},
	{name: "rate limit service error (RLSE)", give: notSent(envoyEntry(500, "rate_limiter_error",
		&datav3.ResponseFlags{RateLimitServiceError: true})), want: breaker.Neutral},
	{name: "envoy overflow (UO)", give: noAnswer(envoyEntry(503, "upstream_reset_before_response_started{overflow}",
		&datav3.ResponseFlags{UpstreamOverflow: true})), want: breaker.Overload},
	{name: "envoy overload (OM)", give: notSent(envoyEntry(503, "overload",
		&datav3.ResponseFlags{OverloadManager: true})), want: breaker.Neutral},
	{name: "local reset (LR)", give: noAnswer(envoyEntry(503, "upstream_reset_before_response_started{local_reset}",
		&datav3.ResponseFlags{LocalReset: true})), want: breaker.Neutral},
	{name: "no route (NR)", give: notSent(envoyEntry(404, "route_not_found",
		&datav3.ResponseFlags{NoRouteFound: true})), want: breaker.Neutral},
	{name: "served from cache (RFCF)", give: notSent(envoyEntry(200, "via_upstream",
		&datav3.ResponseFlags{ResponseFromCacheFilter: true})), want: breaker.Neutral},
	{name: "unknown flag", give: withUnknownFlag(envoyEntry(200, "via_upstream", nil)), want: breaker.Neutral},
	{name: "old envoy 5xx", give: envoyEntry(500, "", nil), want: breaker.Failure},
	{name: "old envoy 2xx", give: envoyEntry(200, "", nil), want: breaker.Success},
	{name: "old envoy local reply", give: notSent(envoyEntry(503, "", nil)), want: breaker.Neutral},
	{name: "no breaker name", give: envoyEntry(503, "via_upstream", nil), noName: true, want: breaker.Neutral},
	{name: "no breaker name, busy", give: envoyEntry(429, "via_upstream", nil), noName: true, busy: true, want: breaker.Neutral},
}

// TestOutcomeClasses: each row of the outcome table, from an entry built
// as Envoy fills it, through Facts and breaker.Classify.
func TestOutcomeClasses(t *testing.T) {
	t.Parallel()
	for _, tt := range outcomeRows {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := breaker.Outcome{Facts: Facts(tt.give), Name: "gpt-4o", Busy: tt.busy}
			if tt.noName {
				o.Name = ""
			}
			c := breaker.Config{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute, Timeout: tt.timeout}
			if got := breaker.Classify(c, o); got != tt.want {
				t.Errorf("Classify = %v, want %v (facts %+v)", got, tt.want, o.Facts)
			}
			// Busy matters exactly where MayBeOverload says it may, so
			// that the observer may skip the lookup elsewhere.
			flip := o
			flip.Busy = !o.Busy
			if differs := breaker.Classify(c, o) != breaker.Classify(c, flip); differs && !breaker.MayBeOverload(o.Facts) {
				t.Errorf("busy changes the class but MayBeOverload is false (facts %+v)", o.Facts)
			}
		})
	}
}

// TestOutcomeTableDocumented: the rows above and the table in
// docs/outcome-classes.md are the same list.
func TestOutcomeTableDocumented(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../docs/outcome-classes.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var doc []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## The table"
		case in && strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| row |"):
			doc = append(doc, strings.TrimSpace(strings.Split(line, "|")[1]))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var tests []string
	for _, r := range outcomeRows {
		tests = append(tests, r.name)
	}
	for _, n := range doc {
		if !slices.Contains(tests, n) {
			t.Errorf("the table's row %q has no test", n)
		}
	}
	for _, n := range tests {
		if !slices.Contains(doc, n) {
			t.Errorf("test row %q is not in the table", n)
		}
	}
	if len(doc) != len(tests) {
		t.Errorf("%d rows in the table, %d tests", len(doc), len(tests))
	}
}

// TestFactsFlags: every flag of the ResponseFlags message maps to the
// breaker flag of its name (read from pkg/breaker, breakerFlagsByName),
// or to FlagOther; and the names flagBits maps
// are fields of the message (a typo would silently be FlagOther).
func TestFactsFlags(t *testing.T) {
	t.Parallel()
	flagOf, err := breakerFlagsByName()
	if err != nil {
		t.Fatal(err)
	}
	fields := (&datav3.ResponseFlags{}).ProtoReflect().Descriptor().Fields()
	for name := range flagBits {
		if fields.ByName(name) == nil {
			t.Errorf("flagBits names %q, not a ResponseFlags field", name)
		}
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		m := (&datav3.ResponseFlags{}).ProtoReflect()
		if fd.Kind() == protoreflect.BoolKind {
			m.Set(fd, protoreflect.ValueOfBool(true))
		} else {
			m.Set(fd, protoreflect.ValueOfMessage(m.NewField(fd).Message()))
		}
		want := flagOf[fd.Name()]
		if got := flags(m.Interface().(*datav3.ResponseFlags)); got != want {
			t.Errorf("flag %s: %b, want %b", fd.Name(), got, want)
		}
	}
}

// TestFactsOfGarbage: an empty or half-filled entry yields facts, never a
// panic.
func TestFactsOfGarbage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give *datav3.HTTPAccessLogEntry
		want breaker.Facts
	}{
		{name: "nil", give: nil},
		{name: "empty", give: &datav3.HTTPAccessLogEntry{}},
		{name: "empty common", give: &datav3.HTTPAccessLogEntry{CommonProperties: &datav3.AccessLogCommon{ResponseFlags: &datav3.ResponseFlags{}}}},
		{name: "negative times", give: &datav3.HTTPAccessLogEntry{CommonProperties: &datav3.AccessLogCommon{
			Duration: durationpb.New(-time.Second), TimeToLastUpstreamTxByte: &durationpb.Duration{Seconds: -1 << 62},
		}}, want: breaker.Facts{Duration: -time.Second, Sent: true, SentAt: time.Duration(-1 << 63)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Facts(tt.give); got != tt.want {
				t.Errorf("Facts = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzFacts reads arbitrary entries (the table's rows as seeds): Facts
// agrees with an independent reading of the entry (factsByName: the
// fields found by their names in the Envoy API, through protoreflect,
// with the durations converted by hand); Classify never panics; a
// success is always an upstream 2xx or 3xx with no flag; and an upstream
// failure flag is always a failure.
func FuzzFacts(f *testing.F) {
	flagOf, err := breakerFlagsByName()
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range outcomeRows {
		b, err := proto.Marshal(r.give)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, int64(r.timeout))
	}
	f.Fuzz(func(t *testing.T, wire []byte, timeout int64) {
		var e datav3.HTTPAccessLogEntry
		if proto.Unmarshal(wire, &e) != nil {
			return
		}
		facts := Facts(&e)
		if want := factsByName(e.ProtoReflect(), flagOf); facts != want {
			t.Fatalf("Facts = %+v, want %+v (read by name)", facts, want)
		}
		c := breaker.Config{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute, Timeout: time.Duration(max(timeout, 0))}
		got := breaker.Classify(c, breaker.Outcome{Facts: facts, Name: "m"})
		if got == breaker.Success && (facts.Status < 200 || facts.Status >= 400 || facts.Flags != 0) {
			t.Fatalf("success of %+v", facts)
		}
		upstreamFailed := breaker.FlagUpstreamConnectionFailure | breaker.FlagUpstreamConnectionTermination |
			breaker.FlagUpstreamRemoteReset | breaker.FlagUpstreamRequestTimeout | breaker.FlagNoHealthyUpstream |
			breaker.FlagUpstreamProtocolError | breaker.FlagDNSResolutionFailure
		if facts.Flags&upstreamFailed != 0 && got != breaker.Failure {
			t.Fatalf("%v of %+v, want failure", got, facts)
		}
	})
}

// factsByName reads the breaker facts of an HTTPAccessLogEntry field by
// field, by the names data/accesslog/v3 gives them, not through the
// generated getters Facts uses: a mix-up of two fields, or of presence
// and value, shows as a difference.
func factsByName(e protoreflect.Message, flagOf map[protoreflect.Name]breaker.Flags) breaker.Facts {
	msg := func(m protoreflect.Message, name protoreflect.Name) (protoreflect.Message, bool) {
		fd := m.Descriptor().Fields().ByName(name)
		if fd == nil {
			panic("no field " + string(name)) // the test's names are wrong
		}
		return m.Get(fd).Message(), m.Has(fd)
	}
	scalar := func(m protoreflect.Message, name protoreflect.Name) protoreflect.Value {
		fd := m.Descriptor().Fields().ByName(name)
		if fd == nil {
			panic("no field " + string(name))
		}
		return m.Get(fd)
	}
	// duration converts a google.protobuf.Duration as its documentation
	// says (seconds and nanos of the same sign), saturating at the range
	// of time.Duration.
	duration := func(d protoreflect.Message) time.Duration {
		ns := new(big.Int).Mul(big.NewInt(scalar(d, "seconds").Int()), big.NewInt(int64(time.Second)))
		ns.Add(ns, big.NewInt(scalar(d, "nanos").Int()))
		switch {
		case ns.Cmp(big.NewInt(math.MaxInt64)) > 0:
			return math.MaxInt64
		case ns.Cmp(big.NewInt(math.MinInt64)) < 0:
			return math.MinInt64
		}
		return time.Duration(ns.Int64())
	}
	common, _ := msg(e, "common_properties")
	resp, _ := msg(e, "response")
	code, _ := msg(resp, "response_code")
	var out breaker.Facts
	out.Status = uint32(scalar(code, "value").Uint())
	out.Details = scalar(resp, "response_code_details").String()
	d, _ := msg(common, "duration")
	out.Duration = duration(d)
	_, out.Received = msg(common, "time_to_last_rx_byte")
	var sentAt protoreflect.Message
	sentAt, out.Sent = msg(common, "time_to_last_upstream_tx_byte")
	if out.Sent {
		out.SentAt = duration(sentAt)
	}
	_, out.Answered = msg(common, "time_to_first_upstream_rx_byte")
	out.Upstream = scalar(common, "upstream_cluster").String()
	flags, _ := msg(common, "response_flags")
	fields := flags.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !flags.Has(fd) {
			continue
		}
		out.Flags |= flagOf[fd.Name()]
	}
	if len(flags.GetUnknown()) > 0 {
		out.Flags |= breaker.FlagOther
	}
	return out
}

// breakerFlagsByName reads the breaker flag a ResponseFlags field means
// from pkg/breaker's source, not from flagBits: field upstream_overflow
// is the constant FlagUpstreamOverflow, dns_ is DNS; a field no constant
// is named after is FlagOther, delay_injected none (a delay says nothing
// of the answer). So a field mapped to the wrong flag in flagBits shows
// as a difference here, which a copy of the table would repeat.
var breakerFlagsByName = sync.OnceValues(func() (map[protoreflect.Name]breaker.Flags, error) {
	fset := token.NewFileSet()
	// outcome.go declares the flags and needs only the standard library.
	f, err := parser.ParseFile(fset, "../breaker/outcome.go", nil, 0)
	if err != nil {
		return nil, fmt.Errorf("parse pkg/breaker: %w", err)
	}
	// Alone, the file's uses of the package's other files do not resolve;
	// its constants do, and a missing FlagOther says the reading failed.
	conf := types.Config{Importer: importer.Default(), Error: func(error) {}}
	pkg, _ := conf.Check("breaker", fset, []*ast.File{f}, nil)
	if _, ok := pkg.Scope().Lookup("FlagOther").(*types.Const); !ok {
		return nil, fmt.Errorf("pkg/breaker/outcome.go declares no FlagOther")
	}
	out := map[protoreflect.Name]breaker.Flags{"delay_injected": 0}
	fields := (&datav3.ResponseFlags{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		name := fields.Get(i).Name()
		if _, ok := out[name]; ok {
			continue
		}
		var camel strings.Builder
		for w := range strings.SplitSeq(string(name), "_") {
			if w == "dns" {
				camel.WriteString("DNS")
				continue
			}
			camel.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
		out[name] = breaker.FlagOther
		if c, ok := pkg.Scope().Lookup("Flag" + camel.String()).(*types.Const); ok {
			v, exact := constant.Uint64Val(c.Val())
			if !exact {
				return nil, fmt.Errorf("breaker.%s = %v: not a flag", c.Name(), c.Val())
			}
			out[name] = breaker.Flags(v)
		}
	}
	return out, nil
})
