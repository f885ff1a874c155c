package app

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

const (
	gatewaySAN = "spiffe://cluster.local/ns/gateway/sa/envoy"
	alsName    = "envoy.service.accesslog.v3.AccessLogService"
)

// TestGRPCServicesNames pins the names --allow-callers maps to against the
// generated service descriptors, so a typo cannot leave an API open.
func TestGRPCServicesNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		give string
		want []string
	}{
		{give: "ratelimit", want: []string{rlsv3.RateLimitService_ServiceDesc.ServiceName}},
		{give: "ext_authz", want: []string{authv3.Authorization_ServiceDesc.ServiceName}},
		{give: "accesslog", want: []string{alsv3.AccessLogService_ServiceDesc.ServiceName}},
		{give: "ext_proc", want: []string{extprocv3.ExternalProcessor_ServiceDesc.ServiceName}},
		{give: "health", want: []string{healthpb.Health_ServiceDesc.ServiceName}},
		{give: "reflection", want: []string{reflectionv1.ServerReflection_ServiceDesc.ServiceName, reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName}},
	}
	for _, tt := range tests {
		got, ok := grpcServices(tt.give)
		if !ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("grpcServices(%q) = %v, %v; want %v", tt.give, got, ok, tt.want)
		}
		if len(tt.want) == 1 { // the gRPC name is taken as well
			if got, ok := grpcServices(tt.want[0]); !ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("grpcServices(%q) = %v, %v; want %v", tt.want[0], got, ok, tt.want)
			}
		}
	}
}

func TestCallerFlags(t *testing.T) {
	t.Parallel()
	mtls := []string{"--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "ca"}
	tests := []struct {
		name       string
		give       []string
		env        map[string]string
		want       []string // the restricted services
		wantStderr string
	}{
		{name: "none", give: mtls},
		{name: "one service", give: append([]string{"--allow-callers", "accesslog=" + gatewaySAN}, mtls...), want: []string{alsName}},
		{
			name: "two services in one value, spaces around",
			give: append([]string{"--allow-callers", " accesslog = " + gatewaySAN + " , spiffe://cluster.local/ns/gw2/sa/* ; ext_proc=" + gatewaySAN}, mtls...),
			want: []string{alsName, "envoy.service.ext_proc.v3.ExternalProcessor"},
		},
		{
			name: "repeated",
			give: append([]string{"--allow-callers", "accesslog=" + gatewaySAN, "--allow-callers", "envoy.service.auth.v3.Authorization=" + gatewaySAN}, mtls...),
			want: []string{alsName, "envoy.service.auth.v3.Authorization"},
		},
		{
			name: "reflection is both versions",
			give: append([]string{"--allow-callers", "reflection=" + gatewaySAN}, mtls...),
			want: []string{"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"},
		},
		{
			name: "from the environment",
			env:  map[string]string{"TOLLGATE_ALLOW_CALLERS": "accesslog=" + gatewaySAN + ";ext_proc=" + gatewaySAN, "TOLLGATE_TLS_CERT": "c", "TOLLGATE_TLS_KEY": "k", "TOLLGATE_TLS_CLIENT_CA": "ca"},
			want: []string{alsName, "envoy.service.ext_proc.v3.ExternalProcessor"},
		},
		{
			name: "the flag beats the variable",
			give: append([]string{"--allow-callers", "ratelimit=" + gatewaySAN}, mtls...),
			env:  map[string]string{"TOLLGATE_ALLOW_CALLERS": "accesslog=" + gatewaySAN},
			want: []string{"envoy.service.ratelimit.v3.RateLimitService"},
		},
		{name: "an empty variable", env: map[string]string{"TOLLGATE_ALLOW_CALLERS": ""}},
		{
			name:       "without client certificates",
			give:       []string{"--tls-cert", "c", "--tls-key", "k", "--allow-callers", "accesslog=" + gatewaySAN},
			wantStderr: "tollgate serve: --allow-callers needs --tls-client-ca: callers are told apart by their client certificates\n",
		},
		{
			name:       "unknown service",
			give:       append([]string{"--allow-callers", "access_log=" + gatewaySAN}, mtls...),
			wantStderr: `tollgate serve: --allow-callers: "access_log" is not a service Tollgate serves; want ` + serviceNames + "\n",
		},
		{
			name:       "one reflection version",
			give:       append([]string{"--allow-callers", "grpc.reflection.v1.ServerReflection=" + gatewaySAN}, mtls...),
			wantStderr: `tollgate serve: --allow-callers: "grpc.reflection.v1.ServerReflection" is not a service Tollgate serves`,
		},
		{
			name:       "no SANs",
			give:       append([]string{"--allow-callers", "accesslog"}, mtls...),
			wantStderr: `tollgate serve: --allow-callers: "accesslog": want SERVICE=SAN[,SAN...]` + "\n",
		},
		{
			name:       "an empty SAN",
			give:       append([]string{"--allow-callers", "accesslog=" + gatewaySAN + ","}, mtls...),
			wantStderr: `tollgate serve: --allow-callers: accesslog: an empty SAN in "` + gatewaySAN + `,"` + "\n",
		},
		{
			name:       "a trailing separator",
			give:       append([]string{"--allow-callers", "accesslog=" + gatewaySAN + ";"}, mtls...),
			wantStderr: `tollgate serve: --allow-callers: "": want SERVICE=SAN[,SAN...]` + "\n",
		},
		{
			name:       "a service twice",
			give:       append([]string{"--allow-callers", "accesslog=" + gatewaySAN, "--allow-callers", alsName + "=spiffe://td/x"}, mtls...),
			wantStderr: "tollgate serve: --allow-callers: " + alsName + ": " + alsName + " is listed twice; put all its SANs in one entry\n",
		},
		{
			name:       "a bad SAN",
			give:       append([]string{"--allow-callers", "accesslog=cluster.local/ns/gateway/sa/envoy"}, mtls...),
			wantStderr: `tollgate serve: --allow-callers: callers: ` + alsName + `: SAN "cluster.local/ns/gateway/sa/envoy" is not an absolute URI`,
		},
		{
			name:       "a prefix inside a name",
			give:       append([]string{"--allow-callers", "accesslog=spiffe://cluster.local/ns/gateway/sa/envoy*"}, mtls...),
			wantStderr: "a prefix ends in /*, so that it stops at a path segment\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr buffer
			a := &App{Stderr: &stderr, LookupEnv: env(tt.env)}
			got, err := a.parseServeFlags(tt.give)
			if tt.wantStderr != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantStderr) {
					t.Errorf("parseServeFlags = %v; stderr %q, want it to contain %q", err, stderr.String(), tt.wantStderr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseServeFlags: %v\n%s", err, stderr.String())
			}
			if services := got.callers.parsed.Services(); !reflect.DeepEqual(services, tt.want) {
				t.Errorf("restricted services = %v, want %v", services, tt.want)
			}
		})
	}
}

// FuzzParseAllowCallers: any value gets an answer, not a panic, and what
// is accepted names only known services, each with non-empty SANs.
func FuzzParseAllowCallers(f *testing.F) {
	for _, s := range []string{
		"accesslog=" + gatewaySAN,
		"accesslog=" + gatewaySAN + ",spiffe://td/ns/x/sa/*;ext_proc=" + gatewaySAN,
		"reflection=urn:x;health=spiffe://a/b",
		";;=,",
		"accesslog==",
		"  ",
		"envoy.service.accesslog.v3.AccessLogService=spiffe://td/%zz",
	} {
		f.Add(s)
	}
	known := map[string]bool{}
	for _, short := range []string{"ratelimit", "ext_authz", "accesslog", "ext_proc", "health", "reflection"} {
		services, _ := grpcServices(short)
		for _, svc := range services {
			known[svc] = true
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		allow, err := parseAllowCallers(s)
		if err != nil {
			return
		}
		for svc, sans := range allow {
			if !known[svc] {
				t.Errorf("%q: accepted unknown service %q", s, svc)
			}
			for _, san := range sans {
				if san == "" || strings.TrimSpace(san) != san || strings.ContainsAny(san, ",;") {
					t.Errorf("%q: accepted SAN %q", s, san)
				}
			}
		}
		if len(allow) > 0 {
			_ = (&callerFlags{raw: s}).check(tlsFlags{clientCA: "ca"})
		}
	})
}

// streamAccessLog sends one HTTP access log entry on a new connection.
func streamAccessLog(ctx context.Context, t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		return err
	}
	msg := &alsv3.StreamAccessLogsMessage{
		Identifier: &alsv3.StreamAccessLogsMessage_Identifier{LogName: "tollgate"},
		LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{
			LogEntry: []*accesslogv3.HTTPAccessLogEntry{{CommonProperties: &accesslogv3.AccessLogCommon{}}},
		}},
	}
	if err := stream.Send(msg); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.CloseAndRecv()
	return err
}

// TestServeCallers runs `tollgate serve` with mutual TLS and the access log
// restricted to the gateway: the gateway's entries arrive, another
// workload's are refused and never reach the access log service, and
// both may still call the rate limit service.
func TestServeCallers(t *testing.T) {
	t.Parallel()
	ctx, cancelTest := context.WithTimeout(context.Background(), wait)
	defer cancelTest()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeFile(t, rules, goodRules)
	_, client := pki(t, dir)
	gateway, other := client(gatewaySAN), client("spiffe://cluster.local/ns/default/sa/sleep")

	addrs := make(chan Addrs, 1)
	stderr := &buffer{}
	a := &App{
		Stdout: io.Discard,
		Stderr: stderr,
		LookupEnv: env(map[string]string{
			"TOLLGATE_TLS_CERT":      filepath.Join(dir, "tls.crt"),
			"TOLLGATE_TLS_KEY":       filepath.Join(dir, "tls.key"),
			"TOLLGATE_TLS_CLIENT_CA": filepath.Join(dir, "ca.crt"),
			"TOLLGATE_ALLOW_CALLERS": "accesslog=" + gatewaySAN + ";ext_proc=" + gatewaySAN,
		}),
		Listening: func(ad Addrs) { addrs <- ad },
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	exit := make(chan int, 1)
	go func() {
		exit <- a.Run(runCtx, []string{"serve", "--config", rules, "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"})
	}()
	var e *e2e
	select {
	case ad := <-addrs:
		e = &e2e{t: t, ctx: ctx, addrs: ad, stderr: stderr}
	case code := <-exit:
		t.Fatalf("serve exited with %d before listening:\n%s", code, stderr.String())
	case <-ctx.Done():
		t.Fatal("serve never listened")
	}
	grpcAddr := e.addrs.GRPC.String()

	if err := streamAccessLog(ctx, t, grpcAddr, gateway); err != nil {
		t.Errorf("the gateway's access log: %v", err)
	}
	for range 2 {
		if err := streamAccessLog(ctx, t, grpcAddr, other); status.Code(err) != codes.PermissionDenied {
			t.Errorf("another workload's access log: %v, want PermissionDenied", err)
		}
	}
	for name, creds := range map[string]credentials.TransportCredentials{"gateway": gateway, "other": other} {
		conn, err := grpc.NewClient("passthrough:///"+grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:      "e2e",
			Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}},
		})
		_ = conn.Close()
		if err != nil {
			t.Errorf("%s's ShouldRateLimit: %v", name, err)
		}
	}

	_, metrics := e.get("/metrics")
	for _, want := range []string{
		`tollgate_grpc_caller_denied_total{service="envoy.service.accesslog.v3.AccessLogService"} 2`,
		`tollgate_grpc_caller_denied_total{service="envoy.service.ext_proc.v3.ExternalProcessor"} 0`,
		// Only the gateway's entry reached the access log service.
		`tollgate_accesslog_entries_total{result="ignored"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if log := stderr.String(); !strings.Contains(log, `"msg":"caller not allowed"`) || !strings.Contains(log, `"uri_sans":["spiffe://cluster.local/ns/default/sa/sleep"]`) {
		t.Errorf("the refusal is not logged with the caller's SAN:\n%s", log)
	}

	stop()
	select {
	case code := <-exit:
		if code != ExitOK {
			t.Errorf("serve exited with %d, want 0\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("serve did not exit after cancel")
	}
}
