package config

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// These tests use the real filesystem and its notifications, which take
// real time; every wait is bounded by waitFor.
const waitFor = 5 * time.Second

type change struct {
	rules *limit.RuleSet
	err   error
}

// watcher runs watch on path and exposes what it reports.
type watcher struct {
	changes  chan change
	reloaded chan bool
}

// startWatch runs watch until the test ends, returning once the watch is
// in place so the test's changes cannot race its setup.
func startWatch(tb testing.TB, path string) *watcher {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{changes: make(chan change, 16), reloaded: make(chan bool, 64)}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- watch(ctx, path, func(rs *limit.RuleSet, err error) {
			select {
			case w.changes <- change{rs, err}:
			case <-ctx.Done():
			}
		}, WatchHooks{
			Ready: func() { close(ready) },
			Reloaded: func(changed bool) {
				select {
				case w.reloaded <- changed:
				default:
				}
			},
		})
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("Watch returned %v after cancel, want nil", err)
			}
		case <-time.After(waitFor):
			tb.Errorf("Watch did not return within %v of cancel", waitFor)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		tb.Fatalf("Watch: %v", err)
	case <-time.After(waitFor):
		tb.Fatalf("Watch not ready within %v", waitFor)
	}
	// Watch reports the rules once as it starts, so that a change made
	// before its watches were in place is not missed.
	select {
	case c := <-w.changes:
		if c.err == nil && c.rules == nil {
			tb.Fatalf("initial onChange got neither rules nor an error")
		}
	case <-time.After(waitFor):
		tb.Fatalf("no initial onChange within %v", waitFor)
	}
	select {
	case changed := <-w.reloaded:
		if !changed {
			tb.Fatalf("initial reload did not call onChange")
		}
	case <-time.After(waitFor):
		tb.Fatalf("no initial reload within %v", waitFor)
	}
	return w
}

// next waits for the next onChange call and summarizes it.
func (w *watcher) next(tb testing.TB, dir string) string {
	tb.Helper()
	select {
	case c := <-w.changes:
		if c.err != nil {
			return strings.ReplaceAll(c.err.Error(), dir, "$DIR")
		}
		var parts []string
		for _, d := range c.rules.Domains() {
			parts = append(parts, fmt.Sprintf("%s: %s", d.Name, ruleString(d.Match([]limit.Entry{{Key: "user", Value: "u"}}))))
		}
		return strings.Join(parts, "; ")
	case <-time.After(waitFor):
		tb.Fatalf("no onChange within %v", waitFor)
		return ""
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// setup lays out the first rules in dir and returns the path to watch.
		setup func(tb testing.TB, dir string) string
		// give changes the rules.
		give func(tb testing.TB, dir string)
		want string
	}{
		{
			name: "ConfigMap ..data swap",
			setup: func(tb testing.TB, dir string) string {
				publishConfigMap(tb, dir, map[string]string{"rules.yaml": rulesYAML("edge", 1)})
				return dir
			},
			give: func(tb testing.TB, dir string) {
				publishConfigMap(tb, dir, map[string]string{"rules.yaml": rulesYAML("edge", 2)})
			},
			want: "edge: requests 2/1s sliding_window buckets=20",
		},
		{
			name: "ConfigMap swap to invalid rules",
			setup: func(tb testing.TB, dir string) string {
				publishConfigMap(tb, dir, map[string]string{"rules.yaml": rulesYAML("edge", 1)})
				return dir
			},
			give: func(tb testing.TB, dir string) {
				publishConfigMap(tb, dir, map[string]string{"rules.yaml": strings.Replace(rulesYAML("edge", 1), "second", "dya", 1)})
			},
			want: `$DIR/rules.yaml:4: descriptors[0].rate_limit.unit: "dya" is not one of second|minute|hour|day|week|month|year`,
		},
		{
			name: "ConfigMap file watched through its symlink",
			setup: func(tb testing.TB, dir string) string {
				publishConfigMap(tb, dir, map[string]string{"rules.yaml": rulesYAML("edge", 1)})
				return filepath.Join(dir, "rules.yaml")
			},
			give: func(tb testing.TB, dir string) {
				publishConfigMap(tb, dir, map[string]string{"rules.yaml": rulesYAML("edge", 3)})
			},
			want: "edge: requests 3/1s sliding_window buckets=20",
		},
		{
			name: "file edited in place",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "rules.yaml"), rulesYAML("edge", 1))
				return filepath.Join(dir, "rules.yaml")
			},
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, "rules.yaml"), rulesYAML("edge", 4))
			},
			want: "edge: requests 4/1s sliding_window buckets=20",
		},
		{
			name: "file renamed over",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "rules.yaml"), rulesYAML("edge", 1))
				return filepath.Join(dir, "rules.yaml")
			},
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, ".rules.yaml.tmp"), rulesYAML("edge", 5))
				if err := os.Rename(filepath.Join(dir, ".rules.yaml.tmp"), filepath.Join(dir, "rules.yaml")); err != nil {
					tb.Fatal(err)
				}
			},
			want: "edge: requests 5/1s sliding_window buckets=20",
		},
		{
			name: "file added to a directory",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "edge.yaml"), rulesYAML("edge", 1))
				return dir
			},
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, "api.yaml"), rulesYAML("api", 6))
			},
			want: "api: requests 6/1s sliding_window buckets=20; edge: requests 1/1s sliding_window buckets=20",
		},
		{
			name: "file removed",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "edge.yaml"), rulesYAML("edge", 1))
				return dir
			},
			give: func(tb testing.TB, dir string) {
				if err := os.Remove(filepath.Join(dir, "edge.yaml")); err != nil {
					tb.Fatal(err)
				}
			},
			want: `load rules "$DIR": no *.yaml or *.yml file in the directory`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			w := startWatch(t, tt.setup(t, dir))
			tt.give(t, dir)
			if got := w.next(t, dir); got != tt.want {
				t.Errorf("onChange got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestWatchUnchanged checks that events which leave the rules' bytes
// alone do not call onChange: the first call after them is the real edit.
func TestWatchUnchanged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, rulesYAML("edge", 1))
	w := startWatch(t, dir)

	writeFile(t, path, rulesYAML("edge", 1))                 // same bytes
	writeFile(t, filepath.Join(dir, ".rules.yaml.swp"), "x") // an editor's swap file
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case changed := <-w.reloaded:
		if changed {
			t.Fatalf("reload after unchanged bytes called onChange")
		}
	case <-time.After(waitFor):
		t.Fatalf("no reload within %v", waitFor)
	}

	writeFile(t, path, rulesYAML("edge", 7))
	if got, want := w.next(t, dir), "edge: requests 7/1s sliding_window buckets=20"; got != want {
		t.Errorf("onChange got %s, want %s", got, want)
	}
}

func TestWatchMissingPath(t *testing.T) {
	t.Parallel()
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "nope"), func(*limit.RuleSet, error) {})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Watch error = %v, want one wrapping fs.ErrNotExist", err)
	}
}

// TestWatchFilesNamedDir checks that a directory load names is watched
// before Ready, as those in dirs are: a change made from Ready on, in
// either directory, is reported after the first onChange.
func TestWatchFilesNamedDir(t *testing.T) {
	t.Parallel()
	main, other := t.TempDir(), t.TempDir()
	settings, keys := filepath.Join(main, "settings"), filepath.Join(other, "keys")
	writeFile(t, settings, keys)
	writeFile(t, keys, "1")
	load := func() (string, [32]byte, []string, error) {
		name, err := os.ReadFile(settings)
		if err != nil {
			return "", sha256.Sum256([]byte(err.Error())), nil, err
		}
		data, err := os.ReadFile(string(name))
		return string(data), sha256.Sum256(data), []string{filepath.Dir(string(name))}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		done <- WatchFilesWithHooks(ctx, []string{main}, load, func(v string, err error) {
			if err != nil {
				v = err.Error()
			}
			changes <- v
		}, WatchHooks{Ready: func() {
			if err := os.WriteFile(keys, []byte("2"), 0o644); err != nil {
				t.Error(err)
			}
		}})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchFiles returned %v after cancel, want nil", err)
		}
	}()
	for _, want := range []string{"1", "2"} {
		select {
		case got := <-changes:
			if got != want {
				t.Fatalf("onChange got %q, want %q", got, want)
			}
		case <-time.After(waitFor):
			t.Fatalf("no onChange %q within %v", want, waitFor)
		}
	}
}

func TestWatchFilesMissingDir(t *testing.T) {
	t.Parallel()
	load := func() (int, [32]byte, []string, error) { return 0, [32]byte{1}, nil, nil }
	err := WatchFiles(context.Background(), []string{filepath.Join(t.TempDir(), "nope")}, load, func(int, error) {})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WatchFiles error = %v, want one wrapping fs.ErrNotExist", err)
	}
}
