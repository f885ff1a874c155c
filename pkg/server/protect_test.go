package server

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// metric returns the value of the series name whose labels include
// want, and whether it exists.
func metric(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == k && l.GetValue() == v)
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func TestMaxInFlightAnswersAtOnce(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		give       func(ctx context.Context, method string, req any) (any, error)
		wantCode   codes.Code
		wantDomain string // the hook's answer, when it gives one
	}{
		{name: "default", wantCode: codes.ResourceExhausted},
		{
			name: "hook",
			give: func(_ context.Context, method string, req any) (any, error) {
				if method != shouldRateLimit {
					return nil, status.Errorf(codes.Internal, "hook got method %q", method)
				}
				if _, ok := req.(*rlsv3.RateLimitRequest); !ok {
					return nil, status.Errorf(codes.Internal, "hook got %T", req)
				}
				return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
			},
			wantCode: codes.OK,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const bound = 2
			entered := make(chan struct{}, bound)
			release := make(chan struct{})
			reg := prometheus.NewRegistry()
			r := start(t, Config{
				Gatherer:    reg,
				Registerer:  reg,
				MaxInFlight: bound,
				Overloaded:  tt.give,
				Services: []Service{&fakeRLS{handle: func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
					if req.GetDomain() == "slow" {
						entered <- struct{}{}
						<-release
					}
					return okHandler(ctx, req)
				}}},
			})
			waitHealth(t, r.conn, "", healthpb.HealthCheckResponse_SERVING)
			client := rlsv3.NewRateLimitServiceClient(r.conn)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()

			slow := make(chan error, bound)
			for range bound {
				go func() {
					_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "slow"})
					slow <- err
				}()
			}
			for range bound {
				select {
				case <-entered:
				case <-ctx.Done():
					t.Fatal("the slow calls never reached the handler")
				}
			}
			if got, _ := metric(t, reg, "tollgate_grpc_calls_in_flight", nil); got != bound {
				t.Errorf("calls in flight = %v, want %d", got, bound)
			}

			// The bound is reached: the next call is answered at once,
			// without reaching the handler (which would block).
			resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fast"})
			if status.Code(err) != tt.wantCode {
				t.Errorf("call past the bound: %v, want code %v", err, tt.wantCode)
			}
			if tt.give != nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("call past the bound = %v, want the hook's OVER_LIMIT", resp)
			}
			if got, _ := metric(t, reg, "tollgate_grpc_overloaded_total", map[string]string{"method": shouldRateLimit}); got != 1 {
				t.Errorf("tollgate_grpc_overloaded_total = %v, want 1", got)
			}
			// Health checks are not counted, so they still answer.
			hc, err := healthpb.NewHealthClient(r.conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health check at the bound = %v, %v; want SERVING", hc, err)
			}

			close(release)
			for range bound {
				if err := <-slow; err != nil {
					t.Errorf("slow call: %v", err)
				}
			}
			if _, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fast"}); err != nil {
				t.Errorf("call after the slow ones finished: %v", err)
			}
			if got, _ := metric(t, reg, "tollgate_grpc_calls_in_flight", nil); got != 0 {
				t.Errorf("calls in flight after all finished = %v, want 0", got)
			}
		})
	}
}

func TestNegativeMaxInFlightIsUnbounded(t *testing.T) {
	t.Parallel()
	const calls = 8
	entered := make(chan struct{}, calls)
	release := make(chan struct{})
	r := start(t, Config{
		MaxInFlight: -1,
		Services: []Service{&fakeRLS{handle: func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			entered <- struct{}{}
			<-release
			return okHandler(ctx, req)
		}}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	errs := make(chan error, calls)
	for range calls {
		go func() {
			_, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
			errs <- err
		}()
	}
	for range calls {
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("not every call reached the handler")
		}
	}
	close(release)
	for range calls {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestMaxConnectionsClosesConnectionsPastTheCap(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := start(t, Config{
		Gatherer:       reg,
		Registerer:     reg,
		MaxConnections: 1,
		Services:       []Service{&fakeRLS{handle: okHandler}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// r.conn holds the only slot.
	if _, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"}); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	second, err := grpc.NewClient("passthrough:///"+r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	_, err = rlsv3.NewRateLimitServiceClient(second).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("call on a connection past the cap: %v, want Unavailable", err)
	}
	if got, _ := metric(t, reg, "tollgate_grpc_connections_rejected_total", nil); got < 1 {
		t.Errorf("tollgate_grpc_connections_rejected_total = %v, want >= 1", got)
	}
	if got, _ := metric(t, reg, "tollgate_grpc_connections", nil); got != 1 {
		t.Errorf("tollgate_grpc_connections = %v, want 1", got)
	}
	// The slot comes back when the first connection closes.
	_ = r.conn.Close()
	for {
		if got, _ := metric(t, reg, "tollgate_grpc_connections", nil); got == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the closed connection never gave its slot back")
		}
		time.Sleep(5 * time.Millisecond) // polling a real server
	}
	third, err := grpc.NewClient("passthrough:///"+r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if _, err := rlsv3.NewRateLimitServiceClient(third).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"}); err != nil {
		t.Errorf("call once a slot is free: %v", err)
	}
}

func TestConnectionTimeoutClosesSilentConnections(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := start(t, Config{
		Gatherer:          reg,
		Registerer:        reg,
		ConnectionTimeout: 100 * time.Millisecond,
		Services:          []Service{&fakeRLS{handle: okHandler}},
	})
	c, err := net.Dial("tcp", r.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Send nothing: the server must close the connection by itself.
	_ = c.SetReadDeadline(time.Now().Add(wait))
	began := time.Now()
	_, err = io.Copy(io.Discard, c) // the server's SETTINGS, then EOF
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a silent connection was still open after %v", wait)
	}
	t.Logf("a silent connection was closed after %v", time.Since(began).Round(time.Millisecond))
}

func TestNewRejectsClashingMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cfg := Config{Services: []Service{&fakeRLS{handle: okHandler}}, Gatherer: reg, Registerer: reg}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil {
		t.Error("a second server on the same registry succeeded; want the clash reported")
	}
}
