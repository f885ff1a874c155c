// Command launch starts `tollgate serve` many times and reports how long
// each start took: from exec to the gRPC port bound (the "serving" log
// line), to the first gRPC answer (grpc.health.v1 Check), and to /readyz
// 200. It is the start-up check of issue 14 item 9 (docs/security.md, finding 9);
// `make launch` runs it. It is not part of `make test`: 1,000 launches
// take minutes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

type options struct {
	bin      string
	n        int
	parallel int
	slow     time.Duration
	timeout  time.Duration
	redis    bool
	args     []string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "launch: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var o options
	var extra string
	flag.StringVar(&o.bin, "bin", "", "tollgate binary (empty: go build ./cmd/tollgate into a temp dir)")
	flag.IntVar(&o.n, "n", 1000, "launches")
	flag.IntVar(&o.parallel, "parallel", 4, "launches at once: they load the box, as the busy box of the report was (pin the run to one CPU with taskset -c 1 to load it more without starving the rest of the machine)")
	flag.DurationVar(&o.slow, "slow", 2*time.Second, "a start slower than this to /readyz is listed with its stderr, and fails the run")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up on one launch after this long")
	flag.BoolVar(&o.redis, "redis", false, "serve with a redis-server started here (on a free loopback port) instead of the in-memory store")
	flag.StringVar(&extra, "args", "--config config --authz-config config/authz/authz.yaml --pressure-token-file config/authz/pressure.token",
		"serve's arguments besides --grpc-addr, --admin-addr and --redis-url (space-separated)")
	flag.Parse()
	o.args = strings.Fields(extra)
	if o.n < 1 || o.parallel < 1 {
		return errors.New("-n and -parallel must be at least 1")
	}

	if o.bin == "" {
		dir, err := os.MkdirTemp("", "tollgate-launch")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir) //nolint:errcheck // a leftover temp dir is not worth failing the measurement
		o.bin = filepath.Join(dir, "tollgate")
		build := exec.Command("go", "build", "-o", o.bin, "./cmd/tollgate")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/tollgate: %w", err)
		}
	}
	if o.redis {
		url, stop, err := startRedis()
		if err != nil {
			return err
		}
		defer stop()
		o.args = append(o.args, "--redis-url", url)
	}

	results := make([]result, o.n)
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	began := time.Now()
	for range o.parallel {
		wg.Go(func() {
			for i := range next {
				results[i] = launch(o, i)
				mu.Lock()
				done++
				if done%100 == 0 {
					fmt.Fprintf(os.Stderr, "launch: %d/%d in %v\n", done, o.n, time.Since(began).Round(time.Second))
				}
				mu.Unlock()
			}
		})
	}
	for i := range o.n {
		next <- i
	}
	close(next)
	wg.Wait()
	return report(os.Stdout, o, results, time.Since(began))
}

// result is one launch: the times from exec, and what went wrong.
type result struct {
	listen, grpc, ready, stop time.Duration
	err                       error
	stderr                    []byte
}

// launch runs one `tollgate serve` on loopback ports the kernel picks
// (127.0.0.1:0, read back from its "serving" line, so that parallel
// launches never race for a port), waits for it to answer, and stops it
// with SIGTERM.
func launch(o options, i int) (r result) {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	args := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, o.args...)
	cmd := exec.Command(o.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr lockedBuffer
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(&stderr, pw)
	cmd.Stdout = &stderr
	addrs := make(chan [2]string, 1)
	go scanServing(pr, addrs)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		r.err = fmt.Errorf("launch %d: start: %w", i, err)
		return r
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		exited <- err
	}()
	defer func() {
		t := time.Now()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			r.stop = time.Since(t)
			if err != nil && r.err == nil {
				r.err = fmt.Errorf("launch %d: exit after SIGTERM: %w", i, err)
			}
		case <-time.After(o.timeout):
			_ = cmd.Process.Kill()
			<-exited //nolint:errcheck // killed on the timeout above: its exit error says only that
			r.stop = time.Since(t)
			if r.err == nil {
				r.err = fmt.Errorf("launch %d: still running %v after SIGTERM; killed", i, o.timeout)
			}
		}
		if r.err != nil || r.ready > o.slow {
			r.stderr = stderr.Bytes()
		}
	}()

	var grpcAddr, adminAddr string
	select {
	case a := <-addrs:
		r.listen = time.Since(start)
		grpcAddr, adminAddr = a[0], a[1]
	case err := <-exited:
		exited <- err
		r.err = fmt.Errorf("launch %d: exited before serving: %v", i, err)
		return r
	case <-ctx.Done():
		r.err = fmt.Errorf("launch %d: no \"serving\" line within %v", i, o.timeout)
		return r
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.err = fmt.Errorf("launch %d: grpc client: %w", i, err)
		return r
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	// Any health answer will do, NOT_SERVING included: it says the gRPC
	// server accepts and serves calls.
	if r.grpc, err = poll(ctx, start, func(ctx context.Context) error {
		_, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}); err != nil {
		r.err = fmt.Errorf("launch %d: gRPC: %w", i, err)
		return r
	}
	url := "http://" + adminAddr + "/readyz"
	if r.ready, err = poll(ctx, start, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}); err != nil {
		r.err = fmt.Errorf("launch %d: /readyz: %w", i, err)
	}
	return r
}

// poll calls try, each call bounded to 250ms, every 5ms until it
// succeeds or ctx ends, and returns the time since start it succeeded.
func poll(ctx context.Context, start time.Time, try func(context.Context) error) (time.Duration, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		err := try(tctx)
		cancel()
		if err == nil {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// scanServing reads tollgate's JSON log and sends the addresses of its
// "serving" line; it drains r to its end.
func scanServing(r io.Reader, addrs chan<- [2]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		if sent || !bytes.Contains(sc.Bytes(), []byte(`"serving"`)) {
			continue
		}
		var line struct {
			Msg   string `json:"msg"`
			GRPC  string `json:"grpc_addr"`
			Admin string `json:"admin_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
			addrs <- [2]string{line.GRPC, line.Admin}
			sent = true
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

// lockedBuffer is a bytes.Buffer two writers may share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.buf.Bytes())
}

// startRedis runs redis-server on a free loopback port, without
// persistence, and returns its URL.
func startRedis() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return "redis://" + addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// report prints the distribution of each time, and every slow or failed
// launch with its stderr; it fails when any launch was.
func report(w io.Writer, o options, rs []result, took time.Duration) error {
	var listen, grpcT, ready, stop []time.Duration
	var bad []int
	for i, r := range rs {
		if r.err != nil || r.ready > o.slow {
			bad = append(bad, i)
		}
		if r.err != nil {
			continue
		}
		listen, grpcT, ready, stop = append(listen, r.listen), append(grpcT, r.grpc), append(ready, r.ready), append(stop, r.stop)
	}
	store := "memory"
	if o.redis {
		store = "redis"
	}
	fmt.Fprintf(w, "%d launches (%d at once, store %s) in %v; %d ok\n", o.n, o.parallel, store, took.Round(time.Second), len(ready))
	fmt.Fprintf(w, "%-22s %9s %9s %9s %9s\n", "from exec to", "min", "p50", "p99", "max")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{
		{"port bound (serving)", listen}, {"first gRPC answer", grpcT}, {"/readyz 200", ready}, {"exit after SIGTERM", stop},
	} {
		fmt.Fprintf(w, "%-22s %9s %9s %9s %9s\n", row.name, quantile(row.ds, 0), quantile(row.ds, 0.5), quantile(row.ds, 0.99), quantile(row.ds, 1))
	}
	if len(ready) > 0 {
		slowest := slices.MaxFunc(rs, func(a, b result) int { return int(a.ready - b.ready) })
		fmt.Fprintf(w, "slowest start to /readyz 200: %v\n", slowest.ready.Round(time.Millisecond))
	}
	for _, i := range bad {
		r := rs[i]
		fmt.Fprintf(w, "\n== launch %d: port %v, gRPC %v, ready %v, err %v\n%s", i, r.listen, r.grpc, r.ready, r.err, r.stderr)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d launches failed or took over %v to /readyz", len(bad), o.n, o.slow)
	}
	return nil
}

func quantile(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(ds))
	return s[int(q*float64(len(s)-1))].Round(time.Millisecond).String()
}
