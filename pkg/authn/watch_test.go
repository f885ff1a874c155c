package authn

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

// These tests use the real filesystem and its notifications, which take
// real time; every wait is bounded by waitFor.
const waitFor = 5 * time.Second

type change struct {
	keys *Keys
	err  error
}

type watcher struct {
	changes  chan change
	reloaded chan bool
}

// startWatch runs watch on path until the test ends, returning once the
// watch is in place and its initial report is in.
func startWatch(tb testing.TB, path string) *watcher {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{changes: make(chan change, 16), reloaded: make(chan bool, 64)}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- watch(ctx, path, func(k *Keys, err error) {
			select {
			case w.changes <- change{k, err}:
			case <-ctx.Done():
			}
		}, config.WatchHooks{
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
	if c := w.next(tb, filepath.Dir(path)); c == "" {
		tb.Fatalf("initial onChange got neither keys nor an error")
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

// next waits for the next onChange call and summarizes it: the error, or
// the tenant each test key belongs to.
func (w *watcher) next(tb testing.TB, dir string) string {
	tb.Helper()
	select {
	case c := <-w.changes:
		if c.err != nil {
			noSecret(tb, "reload error", c.err.Error())
			return strings.ReplaceAll(c.err.Error(), dir, "$DIR")
		}
		var parts []string
		for _, k := range testKeys {
			if id, ok := c.keys.Lookup(k); ok {
				parts = append(parts, id.Tenant)
			}
		}
		got := fmt.Sprintf("%d keys: %s", c.keys.Len(), strings.Join(parts, ","))
		if err := c.keys.Problems(); err != nil {
			noSecret(tb, "reload problems", err.Error())
			got += fmt.Sprintf("; skipped %d: %s", c.keys.Skipped(), strings.ReplaceAll(err.Error(), dir, "$DIR"))
		}
		return got
	case <-time.After(waitFor):
		tb.Fatalf("no onChange within %v", waitFor)
		return ""
	}
}

func keysYAML(tenant string, keys ...string) string {
	var b strings.Builder
	b.WriteString("keys:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  - {key: %s, tenant: %s}\n", k, tenant)
	}
	return b.String()
}

// publishSecret lays files out as a Kubernetes Secret volume does, and
// swaps them in the same way: the ..data symlink is replaced atomically.
func publishSecret(tb testing.TB, dir string, files map[string]string) {
	tb.Helper()
	old, _ := os.Readlink(filepath.Join(dir, "..data")) // "" the first time
	ts, err := os.MkdirTemp(dir, "..2026_01_02_03_04_05.")
	if err != nil {
		tb.Fatal(err)
	}
	for name, data := range files {
		writeFile(tb, filepath.Join(ts, name), data)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		tb.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			tb.Fatal(err)
		}
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// setup lays out the first keys in dir and returns the path to watch.
		setup func(tb testing.TB, dir string) string
		// give changes the keys.
		give func(tb testing.TB, dir string)
		want string
	}{
		{
			name: "Secret ..data swap",
			setup: func(tb testing.TB, dir string) string {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("acme", keyAcme)})
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("beta", keyAcme, keyBeta)})
			},
			want: "2 keys: beta,beta",
		},
		{
			name: "Secret swap to a key listed twice",
			setup: func(tb testing.TB, dir string) string {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("acme", keyAcme, keyBeta)})
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("acme", keyAcme, keyBeta, keyAcme)})
			},
			want: "1 keys: acme; skipped 2: $DIR/keys.yaml:4: keys[2]: the same key as keys[0] at line 2; a key may be listed once",
		},
		{
			name: "Secret swap revokes a key beside a bad entry",
			setup: func(tb testing.TB, dir string) string {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("acme", keyAcme, keyCI)})
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("acme", keyAcme) + "  - {key: short, tenant: beta}\n"})
			},
			want: "1 keys: acme; skipped 1: $DIR/keys.yaml:3: keys[1].key: is shorter than 16 bytes, too easy to guess",
		},
		{
			name: "Secret swap to a file that is not YAML",
			setup: func(tb testing.TB, dir string) string {
				publishSecret(tb, dir, map[string]string{"keys.yaml": keysYAML("acme", keyAcme)})
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				publishSecret(tb, dir, map[string]string{"keys.yaml": "keys: [\n"})
			},
			want: "$DIR/keys.yaml:1: invalid YAML: did not find expected node content",
		},
		{
			name: "file edited in place",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "keys.yaml"), keysYAML("acme", keyAcme))
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, "keys.yaml"), keysYAML("acme", keyAcme, keyCI))
			},
			want: "2 keys: acme,acme",
		},
		{
			name: "file renamed over",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "keys.yaml"), keysYAML("acme", keyAcme))
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, ".keys.yaml.tmp"), keysYAML("beta", keyBeta))
				if err := os.Rename(filepath.Join(dir, ".keys.yaml.tmp"), filepath.Join(dir, "keys.yaml")); err != nil {
					tb.Fatal(err)
				}
			},
			want: "1 keys: beta",
		},
		{
			name: "file removed",
			setup: func(tb testing.TB, dir string) string {
				writeFile(tb, filepath.Join(dir, "keys.yaml"), keysYAML("acme", keyAcme))
				return filepath.Join(dir, "keys.yaml")
			},
			give: func(tb testing.TB, dir string) {
				if err := os.Remove(filepath.Join(dir, "keys.yaml")); err != nil {
					tb.Fatal(err)
				}
			},
			want: `load keys "$DIR/keys.yaml": open $DIR/keys.yaml: no such file or directory`,
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

// TestWatchUnchanged checks that events which leave the file's bytes alone
// do not call onChange: the first call after them is the real edit.
func TestWatchUnchanged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.yaml")
	writeFile(t, path, keysYAML("acme", keyAcme))
	w := startWatch(t, path)

	writeFile(t, path, keysYAML("acme", keyAcme))            // same bytes
	writeFile(t, filepath.Join(dir, "tls.crt"), "unrelated") // another key of the Secret
	if err := os.Chmod(path, 0o400); err != nil {
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

	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, keysYAML("beta", keyAcme))
	if got, want := w.next(t, dir), "1 keys: beta"; got != want {
		t.Errorf("onChange got %s, want %s", got, want)
	}
}

func TestWatchMissingPath(t *testing.T) {
	t.Parallel()
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "nope.yaml"), func(*Keys, error) {})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Watch error = %v, want one wrapping fs.ErrNotExist", err)
	}
}
