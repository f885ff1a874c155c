package accesslog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/pkg/breaker"
	"github.com/tollgate-dev/tollgate/pkg/extauthz/reservation"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// t0 is on a 180 s boundary, the bucket width of an hour's sliding window.
var t0 = time.Unix(1_800_000_000, 0)

// call is one Reconcile call a fakeReconciler saw.
type call struct {
	Req              *limit.Request
	At               time.Time
	Reserved, Actual uint64
	HaveActual       bool
}

// fakeReconciler records calls and answers with done and err.
type fakeReconciler struct {
	mu    sync.Mutex
	calls []call
	done  bool
	err   error
	rules *limit.RuleSet
}

func (f *fakeReconciler) Reconcile(_ context.Context, req *limit.Request, at time.Time, reserved, actual uint64, have bool) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{req, at, reserved, actual, have})
	return f.done, f.err
}

func (f *fakeReconciler) Rules() *limit.RuleSet { return f.rules }

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

var testTicket = &reservation.Reservation{
	ID: "req.1", Domain: "ai", Tokens: 1000, At: t0,
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
			reservation.MetadataNamespace: {Fields: meta},
		}}
	}
	return e
}

func ticketMeta(r *reservation.Reservation) map[string]*structpb.Value {
	return map[string]*structpb.Value{
		reservation.FieldTenant: structpb.NewStringValue("acme"),
		reservation.FieldTier:   structpb.NewStringValue("gold"),
		reservation.FieldModel:  structpb.NewStringValue("gpt-4o"),
		reservation.Field:       structpb.NewStringValue(reservation.Encode(r)),
	}
}

// serve runs svc on a loopback gRPC server until the test ends.
func serve(t testing.TB, svcs ...interface{ Register(grpc.ServiceRegistrar) }) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	for _, s := range svcs {
		s.Register(srv)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
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
	want := func(actual uint64, have bool) []call {
		return []call{{Req: testTicket.Request(), At: t0, Reserved: 1000, Actual: actual, HaveActual: have}}
	}
	tests := []struct {
		name        string
		give        *datav3.HTTPAccessLogEntry
		done        bool
		err         error
		wantCalls   []call
		wantMetrics map[string]float64
		notFinal    bool // the observer must not see it
	}{
		{
			name: "usage from the header is reconciled", give: entry(ticketMeta(testTicket), 200, "x-usage", " 700 "), done: true,
			wantCalls:   want(700, true),
			wantMetrics: map[string]float64{"reconciled": 1, "refund": 300},
		},
		{
			name: "more usage than reserved is charged", give: entry(ticketMeta(testTicket), 200, "x-usage", "1300"), done: true,
			wantCalls:   want(1300, true),
			wantMetrics: map[string]float64{"reconciled": 1, "charge": 300},
		},
		{
			name: "usage from a trailer", give: trailer, done: true,
			wantCalls:   want(321, true),
			wantMetrics: map[string]float64{"reconciled": 1, "refund": 679},
		},
		{
			name: "no usage header releases without usage", give: entry(ticketMeta(testTicket), 503), done: true,
			wantCalls:   want(0, false),
			wantMetrics: map[string]float64{"reconciled": 1},
		},
		{
			name: "a malformed usage header is no usage", give: entry(ticketMeta(testTicket), 200, "x-usage", "-5"), done: true,
			wantCalls:   want(0, false),
			wantMetrics: map[string]float64{"reconciled": 1},
		},
		{
			name: "a duplicate is counted", give: entry(ticketMeta(testTicket), 200, "x-usage", "700"), done: false,
			wantCalls:   want(700, true),
			wantMetrics: map[string]float64{"duplicate": 1, "duplicates": 1},
		},
		{
			name: "a store failure is counted", give: entry(ticketMeta(testTicket), 200, "x-usage", "700"), err: errors.New("down"),
			wantCalls:   want(700, true),
			wantMetrics: map[string]float64{"error": 1},
		},
		{
			name: "an invalid request is counted", give: entry(ticketMeta(testTicket), 200), err: fmt.Errorf("%w: no", limit.ErrInvalid),
			wantCalls:   want(0, false),
			wantMetrics: map[string]float64{"invalid": 1},
		},
		{name: "no metadata is ignored", give: entry(nil, 200, "x-usage", "5"), wantMetrics: map[string]float64{"ignored": 1}},
		{name: "an empty entry is ignored", give: bare, wantMetrics: map[string]float64{"ignored": 1}},
		{
			name: "metadata without a ticket is ignored",
			give: entry(map[string]*structpb.Value{"tenant": structpb.NewStringValue("acme")}, 200), wantMetrics: map[string]float64{"ignored": 1},
		},
		{name: "an intermediate entry is ignored", give: intermediate, wantMetrics: map[string]float64{"ignored": 1}, notFinal: true},
		{name: "a periodic entry is ignored", give: periodic, wantMetrics: map[string]float64{"ignored": 1}, notFinal: true},
		{
			name: "a domain the rules dropped is ignored", give: entry(ticketMeta(&otherDomain), 200),
			wantMetrics: map[string]float64{"ignored": 1},
		},
		{
			name: "a garbled ticket is invalid",
			give: entry(map[string]*structpb.Value{reservation.Field: structpb.NewStringValue("!!")}, 200), wantMetrics: map[string]float64{"invalid": 1},
		},
		{
			name: "a ticket of the wrong type is ignored",
			give: entry(map[string]*structpb.Value{reservation.Field: structpb.NewNumberValue(4)}, 200), wantMetrics: map[string]float64{"ignored": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := &fakeReconciler{done: tt.done, err: tt.err, rules: testRuleSet(t)}
			reg := prometheus.NewRegistry()
			obs := &recorder{}
			svc, err := New(rec, nil, reg, Options{UsageHeader: "X-Usage", Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			send(t, alsv3.NewAccessLogServiceClient(serve(t, svc)), []*datav3.HTTPAccessLogEntry{tt.give})
			if diff := cmp.Diff(tt.wantCalls, rec.calls); diff != "" {
				t.Errorf("Reconcile calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantMetrics, counters(t, reg)); diff != "" {
				t.Errorf("metrics (-want +got):\n%s", diff)
			}
			// The observer sees final entries only: a stream's
			// intermediate entries would count its outcome twice.
			if want := map[bool]int{false: 1, true: 0}[tt.notFinal]; len(obs.outcomes) != want {
				t.Fatalf("observer saw %d outcomes, want %d", len(obs.outcomes), want)
			}
		})
	}
}

func TestObserverOutcome(t *testing.T) {
	t.Parallel()
	obs := &recorder{}
	svc, err := New(&fakeReconciler{rules: testRuleSet(t)}, nil, prometheus.NewRegistry(), Options{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	probeMeta := ticketMeta(testTicket)
	probeMeta[reservation.FieldProbes] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"model": structpb.NewStringValue("1700000000000.1"),
	}})
	probe := entry(probeMeta, 200)
	rlsProbe := entry(nil, 503)
	rlsProbe.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		reservation.RateLimitNamespace: {Fields: map[string]*structpb.Value{
			reservation.FieldProbes: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"tenant": structpb.NewStringValue("5.2"),
			}}),
		}},
	}}
	intermediate := entry(probeMeta, 200)
	intermediate.CommonProperties.IntermediateLogEntry = true
	send(t, alsv3.NewAccessLogServiceClient(serve(t, svc)),
		[]*datav3.HTTPAccessLogEntry{entry(ticketMeta(testTicket), 502), entry(nil, 200)},
		[]*datav3.HTTPAccessLogEntry{{}, intermediate, probe, rlsProbe},
	)
	facts := func(status uint32) breaker.Facts {
		return breaker.Facts{Status: status, Duration: 1500 * time.Millisecond, Upstream: "llm"}
	}
	want := []Outcome{
		{Status: 502, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Tenant: "acme", Tier: "gold", Model: "gpt-4o",
			Facts: facts(502), Final: true},
		{Status: 200, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Facts: facts(200), Final: true},
		{Final: true},
		{Status: 200, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Tenant: "acme", Tier: "gold", Model: "gpt-4o",
			Facts: facts(200), Final: true, Probes: map[string]string{"model": "1700000000000.1"}},
		{Status: 503, Duration: 1500 * time.Millisecond, UpstreamCluster: "llm", Facts: facts(503), Final: true,
			Probes: map[string]string{"tenant": "5.2"}},
	}
	if diff := cmp.Diff(want, obs.outcomes); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
}

func TestTCPEntriesAreIgnored(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	svc, err := New(&fakeReconciler{rules: testRuleSet(t)}, nil, reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := alsv3.NewAccessLogServiceClient(serve(t, svc)).StreamAccessLogs(context.Background())
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
	if diff := cmp.Diff(map[string]float64{"ignored": 2}, counters(t, reg)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// counters are the service's non-zero counters by result or direction,
// and "duplicates" for tollgate_accesslog_duplicates_total.
func counters(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "tollgate_accesslog_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			if v == 0 {
				continue
			}
			name := "duplicates"
			for _, l := range m.GetLabel() {
				name = l.GetValue()
			}
			out[name] = v
		}
	}
	return out
}

// FuzzAccessLogEntry: an entry is outside input; any bytes that decode as
// one are handled without a panic.
func FuzzAccessLogEntry(f *testing.F) {
	for _, e := range []*datav3.HTTPAccessLogEntry{
		entry(ticketMeta(testTicket), 200, "x-usage", "700"),
		entry(map[string]*structpb.Value{reservation.Field: structpb.NewStringValue("AQ")}, 0),
		{},
	} {
		b, err := proto.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	svc, err := New(&fakeReconciler{done: true, rules: testRuleSet(f)}, nil, prometheus.NewRegistry(), Options{UsageHeader: "x-usage", Observer: nopObserver{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var e datav3.HTTPAccessLogEntry
		if proto.Unmarshal(wire, &e) != nil {
			return
		}
		svc.entry(context.Background(), &e)
	})
}
