package extauthz

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

// The watch tests use the real filesystem and its notifications, which
// take real time; every wait is bounded by waitFor.
const waitFor = 5 * time.Second

type change struct {
	s   *Settings
	err error
}

// startWatch runs watch on path until the test ends and returns what it
// reports, once the watches are in place and the first load is reported.
func startWatch(t *testing.T, path string) (<-chan change, change) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan change, 16)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- watch(ctx, path, func(s *Settings, err error) {
			select {
			case changes <- change{s, err}:
			case <-ctx.Done():
			}
		}, config.WatchHooks{Ready: func() { close(ready) }})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch returned %v after cancel, want nil", err)
			}
		case <-time.After(waitFor):
			t.Errorf("Watch did not return within %v of cancel", waitFor)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Watch: %v", err)
	case <-time.After(waitFor):
		t.Fatalf("Watch not ready within %v", waitFor)
	}
	return changes, next(t, changes)
}

func next(t *testing.T, changes <-chan change) change {
	t.Helper()
	select {
	case c := <-changes:
		return c
	case <-time.After(waitFor):
		t.Fatalf("no reload within %v", waitFor)
		return change{}
	}
}

// replace writes a file the way editors and Kubernetes do: a new file
// renamed over the old one.
func replace(t *testing.T, path, data string) {
	t.Helper()
	writeFile(t, path+".tmp", data)
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func TestWatchReloadsSettingsAndKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "authz.yaml")
	keysDir := filepath.Join(dir, "secret")
	if err := os.Mkdir(keysDir, 0o700); err != nil {
		t.Fatal(err)
	}
	keysPath := filepath.Join(keysDir, "keys.yaml")
	settings := strings.Replace(testSettings, "keys_file: keys.yaml", "keys_file: secret/keys.yaml", 1)
	writeFile(t, path, settings)
	writeFile(t, keysPath, testKeys)

	changes, first := startWatch(t, path)
	if first.err != nil || first.s.Keys.Len() != 3 {
		t.Fatalf("first load: %+v", first)
	}

	// A new key in the keys file, which lives in another directory.
	const newKey = "sk-newly-added-0123456789"
	replace(t, keysPath, testKeys+"  - {key: \""+newKey+"\", tenant: fresh}\n")
	c := next(t, changes)
	if c.err != nil {
		t.Fatalf("reload after a keys change: %v", c.err)
	}
	if id, ok := c.s.Keys.Lookup(newKey); !ok || id.Tenant != "fresh" {
		t.Errorf("the new key is not loaded: %+v %v", id, ok)
	}

	// A keys file with a bad entry applies the rest: the new key, removed,
	// stops working, and the bad entry is left out with its line.
	replace(t, keysPath, testKeys+"  - {key: short, tenant: fresh}\n")
	c = next(t, changes)
	if c.err != nil {
		t.Fatalf("reload of keys with a bad entry: %v", c.err)
	}
	if _, ok := c.s.Keys.Lookup(newKey); ok {
		t.Errorf("the removed key still works after a reload with a bad entry")
	}
	if _, ok := c.s.Keys.Lookup(keyAcme); !ok || c.s.Keys.Skipped() != 1 ||
		c.s.Keys.Problems() == nil || c.s.Keys.Problems().Error() != keysPath+":9: keys[4].key: is shorter than 16 bytes, too easy to guess" {
		t.Errorf("reload of keys with a bad entry: %v, problems %v", c.s.Keys, c.s.Keys.Problems())
	}
	// At start the same file is refused: a bad entry stops the start.
	if _, err := LoadSettings(path); err == nil {
		t.Errorf("LoadSettings accepts keys with a bad entry")
	}

	// A bad settings file is an error: the caller keeps what it has.
	replace(t, path, "domain: ai\nbogus: 1\n")
	c = next(t, changes)
	if c.err == nil || c.s != nil || !strings.Contains(c.err.Error(), "bogus: unknown key") {
		t.Errorf("reload of a bad config: %+v", c)
	}

	// A bad keys file is an error too, naming the keys file.
	replace(t, path, settings)
	if c := next(t, changes); c.err != nil {
		t.Fatalf("reload of the fixed config: %v", c.err)
	}
	replace(t, keysPath, "keys: {}\n")
	c = next(t, changes)
	if c.err == nil || !strings.Contains(c.err.Error(), keysPath) {
		t.Errorf("reload of bad keys: %+v", c)
	}
}

func TestWatchMissingFile(t *testing.T) {
	t.Parallel()
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "none.yaml"), func(*Settings, error) {})
	if err == nil || !strings.Contains(err.Error(), "watch authz config") {
		t.Errorf("Watch of a missing file = %v", err)
	}
}
