// Package lifecycle holds process-level tests of how one Tollgate behaves
// over its life rather than per decision: under a flood of connections
// and streams, while its rules are rewritten, while it shuts down, and
// for minutes on end (the soak, run by `make soak`). Each test builds
// cmd/tollgate once, starts it on free ports, drives it with
// go-control-plane's gRPC clients and reads its admin /metrics and its
// /proc status.
package lifecycle

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/test/redistest"
)

const (
	buildTimeout = 3 * time.Minute
	readyTimeout = 15 * time.Second
)

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// tollgateBin builds cmd/tollgate once for the package.
func tollgateBin(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "tollgate-lifecycle-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "tollgate")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		// go test puts its own GOROOT/bin first on PATH, so this is the same toolchain.
		out, err := exec.CommandContext(ctx, "go", "build", "-o", build.bin, "github.com/tollgate-dev/tollgate/cmd/tollgate").CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build ./cmd/tollgate: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// proc is one running tollgate process.
type proc struct {
	grpcAddr, adminAddr string
	cmd                 *exec.Cmd
	log                 *redistest.TailBuffer
	exited              chan struct{}
	waitErr             error
}

// start starts tollgate serve with args after the address flags and waits
// for /readyz. A port picked free may be taken before tollgate binds it;
// the start is then retried on other ports. The process is stopped (and
// its log shown if the test failed) at cleanup.
func start(t testing.TB, args ...string) *proc {
	t.Helper()
	var err error
	for range 3 {
		var p *proc
		if p, err = tryStart(t, args); err == nil {
			return p
		}
	}
	t.Fatalf("start tollgate: %v", err)
	return nil
}

func tryStart(t testing.TB, args []string) (*proc, error) {
	p := &proc{grpcAddr: freeAddr(t), adminAddr: freeAddr(t), log: &redistest.TailBuffer{Max: 64 << 10}, exited: make(chan struct{})}
	p.cmd = exec.Command(tollgateBin(t), append([]string{"serve", "--grpc-addr", p.grpcAddr, "--admin-addr", p.adminAddr}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.cmd.Path, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	if err := waitReady(t.Context(), p); err != nil {
		p.stop()
		return nil, fmt.Errorf("%w (exit: %v); log:\n%s", err, p.waitErr, p.log)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("tollgate (grpc %s) log tail:\n%s", p.grpcAddr, p.log)
		}
	})
	return p, nil
}

// stop sends SIGTERM, then SIGKILL if tollgate has not exited within 15s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// adminClient keeps no idle connections, so no goroutine outlives a test.
var adminClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func waitReady(ctx context.Context, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	url := "http://" + p.adminAddr + "/readyz"
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := adminClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		lastErr = err
		select {
		case <-p.exited:
			return errors.New("tollgate exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", readyTimeout, lastErr)
		case <-tick.C:
		}
	}
}

// scrape reads /metrics as series -> value, the series as exposed:
// `name` or `name{label="value",...}`.
func (p *proc) scrape(t testing.TB) map[string]float64 {
	t.Helper()
	resp, err := adminClient.Get("http://" + p.adminAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return out
}

// memory returns the process's resident set now and at its peak, in
// bytes, from /proc/<pid>/status (VmRSS, VmHWM).
func (p *proc) memory(t testing.TB) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("read /proc status: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = n << 10
		case "VmHWM:":
			peak = n << 10
		}
	}
	if rss == 0 || peak == 0 {
		t.Fatalf("no VmRSS/VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	}
	return rss, peak
}

// dial opens a gRPC client connection to p, closed at cleanup.
func (p *proc) dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", p.grpcAddr, err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// request is a ShouldRateLimit for one descriptor.
func request(domain string, kv ...string) *rlsv3.RateLimitRequest {
	var entries []*rlpb.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		entries = append(entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlpb.RateLimitDescriptor{{Entries: entries}}}
}

// freeAddr asks the kernel for a free loopback port.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func writeFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
