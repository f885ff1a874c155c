package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestWarmGatesGRPC: until Warm succeeds the replica is not ready, says
// why, and decides nothing: a call made meanwhile waits, and is answered
// once Warm has succeeded. ReadyDetail's lines follow the first line of
// /readyz either way.
func TestWarmGatesGRPC(t *testing.T) {
	t.Parallel()
	var fail, warmed atomic.Bool
	fail.Store(true)
	tried := make(chan struct{}, 100)
	var early atomic.Int64
	r := start(t, Config{
		Services: []Service{&fakeRLS{handle: func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			if !warmed.Load() {
				early.Add(1)
			}
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
		}}},
		Warm: func(context.Context) error {
			select {
			case tried <- struct{}{}:
			default:
			}
			if fail.Load() {
				return errors.New("ping redis: dial tcp 127.0.0.1:6379: connect: connection refused")
			}
			warmed.Store(true)
			return nil
		},
		ReadyDetail: func() string { return "store circuit: closed\n" },
	})
	for range 2 {
		select {
		case <-tried:
		case <-time.After(wait):
			t.Fatal("Warm was not called")
		}
	}
	want := "not ready: warming up: ping redis: dial tcp 127.0.0.1:6379: connect: connection refused\nstore circuit: closed\n"
	if code, body := httpGet(t, "http://"+r.adminAddr+"/readyz"); code != http.StatusServiceUnavailable || body != want {
		t.Errorf("/readyz while warming = %d %q, want 503 %q", code, body, want)
	}

	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a call was answered before Warm succeeded: %v", err)
	case <-tried: // another failed Warm while the call waits
	case <-time.After(wait):
		t.Fatal("Warm was not retried")
	}
	fail.Store(false)
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the call made while warming: %v, want it answered once warm", err)
		}
	case <-time.After(wait):
		t.Fatal("the call made while warming was never answered")
	}
	if early.Load() != 0 {
		t.Errorf("%d calls were decided before Warm succeeded", early.Load())
	}
	waitHealth(t, r.conn, "", healthpb.HealthCheckResponse_SERVING)
	if code, body := httpGet(t, "http://"+r.adminAddr+"/readyz"); code != http.StatusOK || body != "ok\nstore circuit: closed\n" {
		t.Errorf("/readyz once warm = %d %q, want 200 with the detail", code, body)
	}
}

// TestWarmNeverSucceeds: a replica that cannot warm up still stops at
// once when asked, serving nothing on its gRPC port, and its admin port
// answers meanwhile.
func TestWarmNeverSucceeds(t *testing.T) {
	t.Parallel()
	r := start(t, Config{
		Services: []Service{&fakeRLS{handle: okHandler}},
		Warm:     func(context.Context) error { return errors.New("ping redis: WRONGPASS invalid username-password pair") },
	})
	if code, _ := httpGet(t, "http://"+r.adminAddr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200 while warming", code)
	}
	for deadline := time.Now().Add(wait); ; {
		code, body := httpGet(t, "http://"+r.adminAddr+"/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "WRONGPASS") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 503 saying WRONGPASS", code, body)
		}
	}
	start := time.Now()
	if err := r.stop(t); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("stopping while warming took %v", took)
	}
	if c, err := net.DialTimeout("tcp", r.grpcAddr, time.Second); err == nil {
		_ = c.Close()
		t.Errorf("the gRPC port still accepts after Serve returned")
	}
}

// TestWarmMax: a Warm that does not succeed holds the gRPC port for
// WarmMax, not for ever: then the port serves, the log says why, and the
// replica stays unready while Warm is retried. A start used to wait as
// long as the store answered slowly (issue 14 item 9).
func TestWarmMax(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give func(context.Context) error
		want string // in /readyz and the log line
	}{
		{
			name: "fails at once",
			give: func(context.Context) error { return errors.New("warm up redis: i/o timeout") },
			want: "warm up redis: i/o timeout",
		},
		{
			name: "times out",
			give: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
			want: "warming up",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			core, logs := observer.New(zap.WarnLevel)
			r := start(t, Config{
				Services: []Service{&fakeRLS{handle: okHandler}},
				Logger:   zap.New(core),
				Warm:     tt.give,
				WarmMax:  100 * time.Millisecond,
			})
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if _, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"}); err != nil {
				t.Fatalf("a call while Warm does not succeed: %v, want it answered after WarmMax", err)
			}
			if code, body := httpGet(t, "http://"+r.adminAddr+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, tt.want) {
				t.Errorf("/readyz past WarmMax = %d %q, want 503 saying %q", code, body, tt.want)
			}
			lines := logs.FilterMessageSnippet("warm-up unfinished").All()
			if len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0].ContextMap()["error"]), tt.want) {
				t.Errorf("log lines on WarmMax: %v, want one saying %q", lines, tt.want)
			}
			if err := r.stop(t); err != nil {
				t.Errorf("Serve = %v, want nil", err)
			}
		})
	}
}
