package accesslog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/testutil"
)

// t0 is on a 180 s boundary, the bucket width of an hour's sliding window.
var t0 = time.Unix(1_800_000_000, 0)

// call is one Settle or Release call a fakeLimiter saw.
type call struct {
	Settle           bool // else Release
	Req              *limit.Request
	At               time.Time
	Reserved, Actual uint64
}

// fakeLimiter records calls and answers with done and err.
type fakeLimiter struct {
	mu    sync.Mutex
	calls []call
	done  bool
	err   error
	rules *limit.RuleSet
}

func (f *fakeLimiter) Settle(_ context.Context, req *limit.Request, at time.Time, reserved, actual uint64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{true, req, at, reserved, actual})
	return f.done, f.err
}

func (f *fakeLimiter) Release(_ context.Context, req *limit.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{Req: req})
	return f.err
}

func (f *fakeLimiter) Rules() *limit.RuleSet { return f.rules }

// testKeys are the keys the tests' loops open tickets with; otherKeys
// are a key no replica holds.
var (
	testKeys  = mustKeys(1)
	otherKeys = mustKeys(2)
)

func mustKeys(b byte) *ticket.Keys {
	k, err := ticket.NewKeys([]byte(strings.Repeat(string(rune('a'+b)), ticket.MinKeyBytes)))
	if err != nil {
		panic(err)
	}
	return k
}

// fixedClock is the time tickets are checked at: t0 plus a second.
type fixedClock struct{}

func (fixedClock) Now() time.Time { return t0.Add(time.Second) }

// newLoop is an outcome.Loop on lim opening tickets under testKeys.
func newLoop(t testing.TB, lim outcome.Limiter, reg prometheus.Registerer) *outcome.Loop {
	t.Helper()
	l, err := outcome.New(testKeys, lim, nil, reg, outcome.Options{Clock: fixedClock{}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// seal seals tk under keys.
func seal(keys *ticket.Keys, tk *ticket.Ticket) string {
	s, err := ticket.NewSealer(keys, 0)
	if err != nil {
		panic(err) // unreachable: keys are set
	}
	return s.Seal(tk)
}

type nopObserver struct{}

func (nopObserver) Observe(context.Context, *Outcome) {}

// recorder is an Observer that keeps what it sees.
type recorder struct {
	mu       sync.Mutex
	outcomes []Outcome
}

func (r *recorder) Observe(_ context.Context, o *Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes = append(r.outcomes, *o)
}

func testRuleSet(t testing.TB) *limit.RuleSet {
	t.Helper()
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "ai", Descriptors: []*limit.Rule{
		{Key: "tenant", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 10, Unit: limit.Hour}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

var testTicket = &ticket.Ticket{
	ID: "req.1", Domain: "ai", Reserved: true, Tokens: 1000, Prompt: 400, At: t0, Tier: "gold", Model: "gpt-4o",
	Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}}}},
	Overrides:   map[string]limit.Override{"x": {Amount: 5}},
}

// entry is an HTTP access log entry whose ext_authz metadata holds meta
// and whose response carries status and headers (name, value pairs).
func entry(meta map[string]*structpb.Value, status uint32, kv ...string) *datav3.HTTPAccessLogEntry {
	hs := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		hs[kv[i]] = kv[i+1]
	}
	e := &datav3.HTTPAccessLogEntry{
		CommonProperties: &datav3.AccessLogCommon{
			UpstreamCluster: "llm", Duration: durationpb.New(1500 * time.Millisecond),
			AccessLogType: datav3.AccessLogType_DownstreamEnd,
		},
		Response: &datav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(status), ResponseHeaders: hs},
	}
	if meta != nil {
		e.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			ticket.MetadataNamespace: {Fields: meta},
		}}
	}
	return e
}

// ticketMeta is Check's metadata for tk, sealed under testKeys.
func ticketMeta(tk *ticket.Ticket) map[string]*structpb.Value { return sealedMeta(testKeys, tk) }

func sealedMeta(keys *ticket.Keys, tk *ticket.Ticket) map[string]*structpb.Value {
	return map[string]*structpb.Value{
		ticket.FieldTenant: structpb.NewStringValue("acme"),
		ticket.FieldTier:   structpb.NewStringValue("gold"),
		ticket.FieldModel:  structpb.NewStringValue("gpt-4o"),
		ticket.Field:       structpb.NewStringValue(seal(keys, tk)),
	}
}

// send streams the entries to the service in one message per batch, and
// returns once the service has handled them all (it answers only then).
func send(t testing.TB, c alsv3.AccessLogServiceClient, batches ...[]*datav3.HTTPAccessLogEntry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range batches {
		msg := &alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: b},
		}}
		if i == 0 {
			msg.Identifier = &alsv3.StreamAccessLogsMessage_Identifier{Node: &corev3.Node{Id: "envoy-1"}, LogName: "tollgate"}
		}
		if err := stream.Send(msg); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("CloseAndRecv: %v", err)
	}
}

func TestStreamAccessLogs(t *testing.T) {
	t.Parallel()
	intermediate := entry(ticketMeta(testTicket), 200, "x-usage", "5")
	intermediate.CommonProperties.IntermediateLogEntry = true
	periodic := entry(ticketMeta(testTicket), 200, "x-usage", "5")
	periodic.CommonProperties.AccessLogType = datav3.AccessLogType_DownstreamPeriodic
	trailer := entry(ticketMeta(testTicket), 200)
	trailer.Response.ResponseTrailers = map[string]string{"x-usage": "321"}
	bare := entry(nil, 200)
	bare.CommonProperties, bare.Response = nil, nil
	otherDomain := *testTicket
	otherDomain.Domain = "gone"
	noReservation := *testTicket
	noReservation.Reserved, noReservation.Tokens = false, 0
	old := *testTicket
	old.At = t0.Add(-ticket.DefaultMaxAge - time.Minute)
	// An altered ticket: a genuine one with one character changed.
	altered := []byte(seal(testKeys, testTicket))
	altered[10] ^= 'A' ^ 'B'
	if altered[10] == 'A' || altered[10] == 'B' {
		altered[10] ^= 'A' ^ 'B' ^ 'C' ^ 'D'
	}
	rlsMeta := entry(nil, 200, "x-usage", "700")
	rlsMeta.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		ticket.RateLimitNamespace: {Fields: map[string]*structpb.Value{ticket.Field: structpb.NewStringValue(seal(testKeys, testTicket))}},
	}}
	settle := func(actual uint64) []call {
		return []call{{Settle: true, Req: testTicket.Request(), At: t0, Reserved: 1000, Actual: actual}}
	}
	release := []call{{Req: testTicket.Request()}}
	verified := map[string]float64{"tickets:accesslog/verified": 1}
	with := func(m map[string]float64, kv ...any) map[string]float64 {
		out := map[string]float64{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i].(string)] = float64(kv[i+1].(int))
		}
		return out
	}
	tests := []struct {
		name         string
		give         *datav3.HTTPAccessLogEntry
		done         bool
		err          error
		wantCalls    []call
		wantMetrics  map[string]float64
		wantObserved bool
	}{
		{
			name: "usage from the header settles", give: entry(ticketMeta(testTicket), 200, "x-usage", " 700 "), done: true,
			wantCalls: settle(700), wantObserved: true,
			wantMetrics: with(verified, "entries:settled", 1, "reports:accesslog/settled", 1, "tokens:accesslog/refund", 300),
		},
		{
			name: "more usage than reserved is charged", give: entry(ticketMeta(testTicket), 200, "x-usage", "1300"), done: true,
			wantCalls: settle(1300), wantObserved: true,
			wantMetrics: with(verified, "entries:settled", 1, "reports:accesslog/settled", 1, "tokens:accesslog/charge", 300),
		},
		{
			name: "usage from a trailer", give: trailer, done: true, wantCalls: settle(321), wantObserved: true,
			wantMetrics: with(verified, "entries:settled", 1, "reports:accesslog/settled", 1, "tokens:accesslog/refund", 679),
		},
		{
			name: "the rate limit filter's ticket", give: rlsMeta, done: true, wantCalls: settle(700), wantObserved: true,
			wantMetrics: with(verified, "entries:settled", 1, "reports:accesslog/settled", 1, "tokens:accesslog/refund", 300),
		},
		{
			// Real servers send no usage header: the entry must not
			// settle before ext_proc reports the usage from the body.
			name: "no usage header only releases", give: entry(ticketMeta(testTicket), 503), done: true,
			wantCalls: release, wantObserved: true,
			wantMetrics: with(verified, "entries:released", 1, "reports:accesslog/released", 1),
		},
		{
			name: "a malformed usage header is no usage", give: entry(ticketMeta(testTicket), 200, "x-usage", "-5"), done: true,
			wantCalls: release, wantObserved: true,
			wantMetrics: with(verified, "entries:released", 1, "reports:accesslog/released", 1),
		},
		{
			name: "a duplicate is counted", give: entry(ticketMeta(testTicket), 200, "x-usage", "700"), done: false,
			wantCalls: settle(700), wantObserved: true,
			wantMetrics: with(verified, "entries:duplicate", 1, "reports:accesslog/duplicate", 1),
		},
		{
			name: "a store failure is counted", give: entry(ticketMeta(testTicket), 200, "x-usage", "700"), err: errors.New("down"),
			wantCalls: settle(700), wantObserved: true,
			wantMetrics: with(verified, "entries:error", 1, "reports:accesslog/error", 1),
		},
		{
			name: "an invalid request settles nothing", give: entry(ticketMeta(testTicket), 200), err: fmt.Errorf("%w: no", limit.ErrInvalid),
			wantCalls: release, wantObserved: true,
			wantMetrics: with(verified, "entries:nothing", 1, "reports:accesslog/nothing", 1),
		},
		{
			name: "a domain the rules dropped settles nothing", give: entry(ticketMeta(&otherDomain), 200, "x-usage", "5"),
			wantObserved: true, wantMetrics: with(verified, "entries:nothing", 1),
		},
		{
			name: "a ticket without a reservation settles nothing", give: entry(ticketMeta(&noReservation), 200, "x-usage", "5"),
			wantObserved: true, wantMetrics: with(verified, "entries:nothing", 1),
		},
		{name: "no metadata is ignored", give: entry(nil, 200, "x-usage", "5"), wantMetrics: map[string]float64{"entries:ignored": 1}},
		{name: "an empty entry is ignored", give: bare, wantMetrics: map[string]float64{"entries:ignored": 1}},
		{
			name: "metadata without a ticket is ignored",
			give: entry(map[string]*structpb.Value{"tenant": structpb.NewStringValue("acme")}, 200), wantMetrics: map[string]float64{"entries:ignored": 1},
		},
		{name: "an intermediate entry is ignored", give: intermediate, wantMetrics: map[string]float64{"entries:ignored": 1}},
		{name: "a periodic entry is ignored", give: periodic, wantMetrics: map[string]float64{"entries:ignored": 1}},
		{
			name: "a ticket of the wrong type is ignored",
			give: entry(map[string]*structpb.Value{ticket.Field: structpb.NewNumberValue(4)}, 200), wantMetrics: map[string]float64{"entries:ignored": 1},
		},
		{
			name:        "a garbled ticket changes nothing",
			give:        entry(map[string]*structpb.Value{ticket.Field: structpb.NewStringValue("!!")}, 200, "x-usage", "0"),
			wantMetrics: map[string]float64{"entries:rejected": 1, "tickets:accesslog/malformed": 1},
		},
		{
			name:        "a ticket sealed under another key changes nothing",
			give:        entry(sealedMeta(otherKeys, testTicket), 200, "x-usage", "0"),
			wantMetrics: map[string]float64{"entries:rejected": 1, "tickets:accesslog/forged": 1},
		},
		{
			name:        "an altered ticket changes nothing",
			give:        entry(map[string]*structpb.Value{ticket.Field: structpb.NewStringValue(string(altered))}, 200, "x-usage", "0"),
			wantMetrics: map[string]float64{"entries:rejected": 1, "tickets:accesslog/forged": 1},
		},
		{
			name:        "an expired ticket changes nothing",
			give:        entry(ticketMeta(&old), 200, "x-usage", "0"),
			wantMetrics: map[string]float64{"entries:rejected": 1, "tickets:accesslog/expired": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lim := &fakeLimiter{done: tt.done, err: tt.err, rules: testRuleSet(t)}
			reg := prometheus.NewRegistry()
			obs := &recorder{}
			svc, err := New(newLoop(t, lim, reg), nil, reg, Options{UsageHeader: "X-Usage", Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			send(t, alsv3.NewAccessLogServiceClient(testutil.Serve(t, svc)), []*datav3.HTTPAccessLogEntry{tt.give})
			if diff := cmp.Diff(tt.wantCalls, lim.calls); diff != "" {
				t.Errorf("limiter calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantMetrics, counters(t, reg)); diff != "" {
				t.Errorf("metrics (-want +got):\n%s", diff)
			}
			// The observer sees the final entries of admitted requests
			// only: an intermediate entry would count a stream twice, and
			// an entry without a genuine ticket is nobody's outcome.
			if want := map[bool]int{false: 0, true: 1}[tt.wantObserved]; len(obs.outcomes) != want {
				t.Fatalf("observer saw %d outcomes, want %d", len(obs.outcomes), want)
			}
		})
	}
}

func TestObserverOutcome(t *testing.T) {
	t.Parallel()
	obs := &recorder{}
	rs, err := limit.NewRuleSet(&limit.Domain{Name: "ai",
		Descriptors: []*limit.Rule{{Key: "tenant", TokenLimit: &limit.Limit{Kind: limit.Tokens, Amount: 10, Unit: limit.Hour}}},
		Breakers: []limit.BreakerConfig{
			{Key: "model", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute},
			{Key: "tenant", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute},
			{Key: "region", FailureThreshold: 1, Window: time.Minute, OpenFor: time.Minute},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, err := New(newLoop(t, &fakeLimiter{rules: rs}, reg), nil, reg, Options{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	probe := *testTicket
	probe.Probes = []limit.Probe{{Key: "model", Name: "gpt-4o", ID: "1700000000000.0123456789abcdef0123456789abcdef"}}
	rlsProbe := entry(nil, 503)
	rlsProbe.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		ticket.RateLimitNamespace: {Fields: map[string]*structpb.Value{ticket.Field: structpb.NewStringValue(seal(testKeys, &ticket.Ticket{
			ID: "rls.1", Domain: "ai", At: t0, Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "t2"}}}},
			Probes: []limit.Probe{{Key: "tenant", Name: "t2", ID: "5.ffff"}},
		}))}},
	}}
	// A probe ID in metadata outside the ticket is nobody's: the old
	// unsigned place for it.
	unsigned := ticketMeta(testTicket)
	unsigned["tollgate_probes"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"model": structpb.NewStringValue("1700000000000.1"),
	}})
	intermediate := entry(ticketMeta(&probe), 200)
	intermediate.CommonProperties.IntermediateLogEntry = true
	// A request that passed both filters while half-open holds a probe
	// from each: the rate limit filter's rides on Check's ticket.
	both := entry(ticketMeta(&probe), 200)
	both.CommonProperties.Metadata.FilterMetadata[ticket.RateLimitNamespace] = &structpb.Struct{Fields: map[string]*structpb.Value{
		ticket.Field: structpb.NewStringValue(seal(testKeys, &ticket.Ticket{ID: "rls.2", Domain: "ai", At: t0,
			Descriptors: []limit.Descriptor{{Entries: []limit.Entry{{Key: "tenant", Value: "acme"}}}},
			Probes:      []limit.Probe{{Key: "tenant", Name: "acme", ID: "rl-probe"}, {Key: "model", Name: "gpt-4o", ID: "second"}},
		})),
	}}
	send(t, alsv3.NewAccessLogServiceClient(testutil.Serve(t, svc)),
		[]*datav3.HTTPAccessLogEntry{entry(ticketMeta(testTicket), 502), entry(nil, 200)},
		[]*datav3.HTTPAccessLogEntry{{}, intermediate, entry(ticketMeta(&probe), 200), rlsProbe, entry(unsigned, 200), both},
	)
	tenant := outcome.Breaker{Key: "tenant", Name: "acme"}
	want := []Outcome{
		{Status: 502, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Domain: "ai", Tier: "gold", Model: "gpt-4o", ID: "req.1",
			Breakers: []outcome.Breaker{{Key: "model", Name: "gpt-4o"}, tenant}},
		{Status: 200, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Domain: "ai", Tier: "gold", Model: "gpt-4o", ID: "req.1",
			Breakers: []outcome.Breaker{{Key: "model", Name: "gpt-4o", ProbeID: probe.Probes[0].ID}, tenant}},
		{Status: 503, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Domain: "ai", ID: "rls.1",
			Breakers: []outcome.Breaker{{Key: "tenant", Name: "t2", ProbeID: "5.ffff"}}},
		{Status: 200, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Domain: "ai", Tier: "gold", Model: "gpt-4o", ID: "req.1",
			Breakers: []outcome.Breaker{{Key: "model", Name: "gpt-4o"}, tenant}},
		{Status: 200, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Domain: "ai", Tier: "gold", Model: "gpt-4o", ID: "req.1",
			Breakers: []outcome.Breaker{{Key: "model", Name: "gpt-4o", ProbeID: probe.Probes[0].ID}, {Key: "tenant", Name: "acme", ProbeID: "rl-probe"}}},
	}
	// The facts are Facts(entry)'s, tested in outcome_test.go.
	if diff := cmp.Diff(want, obs.outcomes, cmpopts.IgnoreFields(Outcome{}, "Facts")); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
}

func TestTCPEntriesAreIgnored(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	svc, err := New(newLoop(t, &fakeLimiter{rules: testRuleSet(t)}, reg), nil, reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := alsv3.NewAccessLogServiceClient(testutil.Serve(t, svc)).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_TcpLogs{
		TcpLogs: &alsv3.StreamAccessLogsMessage_TCPAccessLogEntries{LogEntry: []*datav3.TCPAccessLogEntry{{}, {}}},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{"entries:ignored": 2}, counters(t, reg)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// counters are the non-zero counters of the access log and the outcome
// loop, as "name:labels", name without its tollgate_<subsystem>_ prefix
// and _total suffix, labels joined by "/".
func counters(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		name, ok := strings.CutPrefix(mf.GetName(), "tollgate_accesslog_")
		if !ok {
			if name, ok = strings.CutPrefix(mf.GetName(), "tollgate_outcome_"); !ok {
				continue
			}
		}
		name = strings.TrimSuffix(strings.TrimPrefix(name, "settled_"), "_total")
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			if v == 0 {
				continue
			}
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetValue())
			}
			out[name+":"+strings.Join(ls, "/")] = v
		}
	}
	return out
}

// FuzzAccessLogEntry: an entry is outside input; any bytes that decode as
// one are handled without a panic, and what the service settles agrees
// with an independent reading of the entry (expectSettlement): nothing
// without a ticket that verifies under the loop's keys on a final entry;
// a settlement with usage only for the usage the entry reports, against
// the ticket's reservation; a release only without usage; at most one
// call per entry; and the same entry again makes the very same call, so
// the limiter can settle it once.
func FuzzAccessLogEntry(f *testing.F) {
	unreserved := *testTicket
	unreserved.Reserved = false
	intermediate := entry(ticketMeta(testTicket), 200, "x-usage", "700")
	intermediate.CommonProperties.IntermediateLogEntry = true
	periodic := entry(ticketMeta(testTicket), 200, "x-usage", "700")
	periodic.CommonProperties.AccessLogType = datav3.AccessLogType_DownstreamPeriodic
	trailer := entry(ticketMeta(testTicket), 200)
	trailer.Response.ResponseTrailers = map[string]string{"x-usage": "650"}
	both := entry(ticketMeta(testTicket), 200, "x-usage", "700")
	both.Response.ResponseTrailers = map[string]string{"x-usage": "650"}
	limited := entry(nil, 200, "x-usage", "300")
	limited.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		ticket.RateLimitNamespace: {Fields: ticketMeta(testTicket)},
	}}
	for _, e := range []*datav3.HTTPAccessLogEntry{
		intermediate, periodic, trailer, both, limited,
		entry(ticketMeta(testTicket), 200, "x-usage", "700"),
		entry(ticketMeta(testTicket), 200, "x-usage", " 5 "),
		entry(ticketMeta(testTicket), 200, "x-usage", "-1"),
		entry(ticketMeta(testTicket), 0),
		entry(ticketMeta(&unreserved), 200, "x-usage", "700"),
		entry(map[string]*structpb.Value{ticket.Field: structpb.NewStringValue("AQ")}, 0),
		entry(sealedMeta(otherKeys, testTicket), 200),
		{},
	} {
		b, err := proto.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var e datav3.HTTPAccessLogEntry
		if proto.Unmarshal(wire, &e) != nil {
			return
		}
		lim := &fakeLimiter{done: true, rules: testRuleSet(t)}
		reg := prometheus.NewRegistry()
		svc, err := New(newLoop(t, lim, reg), nil, reg, Options{UsageHeader: "x-usage", Observer: nopObserver{}})
		if err != nil {
			t.Fatal(err)
		}
		svc.entry(context.Background(), &e)
		first := slices.Clone(lim.calls)
		want, wantCall := expectSettlement(t, &e)
		switch {
		case !wantCall && len(first) > 0:
			t.Fatalf("calls %+v, want none (no verified, reserved ticket on a final entry)", first)
		case wantCall && len(first) != 1:
			t.Fatalf("%d calls %+v, want one: %+v", len(first), first, want)
		case wantCall:
			got := first[0]
			if got.Settle != want.Settle || got.Reserved != want.Reserved || got.Actual != want.Actual || !got.At.Equal(want.At) {
				t.Fatalf("call %+v, want settle %v of reserved %d, actual %d, at %v", got, want.Settle, want.Reserved, want.Actual, want.At)
			}
		}
		svc.entry(context.Background(), &e)
		if diff := cmp.Diff(first, lim.calls[len(first):], cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("the same entry again made other calls (-first +again):\n%s", diff)
		}
	})
}

// expectSettlement reads, independently of the service, what an entry
// must settle: its tickets (Check's, else the rate limit filter's)
// opened with a sealer of testKeys at the loop's time, whether it is
// the request's final entry, and the usage its x-usage header (else
// trailer) reports. ok is false when it must settle nothing.
func expectSettlement(t *testing.T, e *datav3.HTTPAccessLogEntry) (want call, ok bool) {
	t.Helper()
	common := e.GetCommonProperties()
	if common.GetIntermediateLogEntry() {
		return call{}, false
	}
	if typ := common.GetAccessLogType(); typ != datav3.AccessLogType_NotSet && typ != datav3.AccessLogType_DownstreamEnd {
		return call{}, false
	}
	sealer, err := ticket.NewSealer(testKeys, 0)
	if err != nil {
		t.Fatal(err)
	}
	var tk *ticket.Ticket
	for _, ns := range []string{ticket.MetadataNamespace, ticket.RateLimitNamespace} {
		s := common.GetMetadata().GetFilterMetadata()[ns].GetFields()[ticket.Field].GetStringValue()
		if s == "" {
			continue
		}
		if opened, err := sealer.Open(s, fixedClock{}.Now()); err == nil {
			tk = opened
			break
		}
	}
	if tk == nil || !tk.Reserved || tk.Domain != "ai" {
		return call{}, false
	}
	want = call{At: tk.At, Reserved: tk.Tokens}
	for _, m := range []map[string]string{e.GetResponse().GetResponseHeaders(), e.GetResponse().GetResponseTrailers()} {
		v, found := m["x-usage"]
		if !found {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err == nil {
			want.Settle, want.Actual = true, n
		}
		break
	}
	if !want.Settle {
		want.At, want.Reserved = time.Time{}, 0 // a release carries neither
	}
	return want, true
}
