// Package tollgatetest builds cmd/tollgate and runs it as a process, for
// the tests that drive real tollgate processes (test/replicas,
// test/outage, test/failover).
package tollgatetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

const (
	// BuildTimeout bounds go build of cmd/tollgate.
	BuildTimeout = 3 * time.Minute
	// ReadyTimeout bounds how long a process may take to report /readyz.
	ReadyTimeout = 15 * time.Second
	// stopTimeout is how long a process may drain after SIGTERM before
	// it is killed.
	stopTimeout = 5 * time.Second
	// starts is how many times Start tries, on fresh ports each time.
	starts = 3
)

// Build builds cmd/tollgate from the working tree into a temp dir of t
// and returns its path. go test puts its own GOROOT/bin first on PATH, so
// this is the toolchain running the test.
func Build(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tollgate")
	ctx, cancel := context.WithTimeout(context.Background(), BuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/tollgate-dev/tollgate/cmd/tollgate")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/tollgate: %v\n%s", err, out)
	}
	return bin
}

// Process is one running `tollgate serve`.
type Process struct {
	// Name labels the process in errors and logs.
	Name string
	// GRPC and Admin are its loopback addresses.
	GRPC, Admin string
	// Log holds the tail of its stdout and stderr.
	Log *redistest.TailBuffer
}

// Start runs `bin serve --grpc-addr A --admin-addr B args...` and waits
// for /readyz. A port picked free may be taken before tollgate binds it;
// the process then exits and the start is retried on other ports. The
// process gets SIGTERM (then SIGKILL after 5s) when the test ends, and
// the kernel kills it if the test binary dies first; its log tail is
// logged when the test failed.
func Start(t testing.TB, bin, name string, args ...string) *Process {
	t.Helper()
	var err error
	for range starts {
		var p *Process
		if p, err = tryStart(t, bin, name, args); err == nil {
			return p
		}
	}
	t.Fatalf("%s: %v", name, err)
	return nil
}

func tryStart(t testing.TB, bin, name string, extra []string) (*Process, error) {
	p := &Process{Name: name, GRPC: FreeAddr(t), Admin: FreeAddr(t), Log: &redistest.TailBuffer{Max: 16 << 10}}
	args := append([]string{"serve", "--grpc-addr", p.GRPC, "--admin-addr", p.Admin}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(stopTimeout):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	if err := waitReady(p.Admin, exited); err != nil {
		stop()
		if waitErr != nil {
			err = fmt.Errorf("%w (exit: %v)", err, waitErr)
		}
		return nil, fmt.Errorf("%w; log:\n%s", err, p.Log)
	}
	t.Cleanup(func() {
		stop()
		if out := p.Log.String(); t.Failed() && out != "" {
			t.Logf("%s (grpc %s) log tail:\n%s", name, p.GRPC, out)
		}
	})
	return p, nil
}

// waitReady polls /readyz until it answers 200, the process exits or
// ReadyTimeout passes.
func waitReady(adminAddr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	url := "http://" + adminAddr + "/readyz"
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		lastErr = err
		select {
		case <-exited:
			return errors.New("tollgate exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", ReadyTimeout, lastErr)
		case <-tick.C:
		}
	}
}

// FreeAddr asks the kernel for a free loopback port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
