package authn

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// settle is how long the directory must be quiet before a reload: an
	// editor's save or a Secret's swap is a burst of events.
	settle = 150 * time.Millisecond
	// maxWait bounds the delay when events never stop (a busy directory).
	maxWait = time.Second
)

// Watch calls onChange with the result of Load each time the keys file at
// path changes, until ctx is done. It returns nil when ctx ends, and an
// error only if it cannot start watching.
//
// onChange runs on Watch's goroutine, one call at a time. It gets either
// the new keys or the error (usually a config.Errors) that loading them
// gave; on an error the caller should keep the keys it has. Once its
// watch is in place Watch loads the keys once and calls onChange, so a
// change made between the caller's own Load and the start of Watch is
// never missed; after that it calls onChange only when the file's bytes
// change.
//
// Watch watches the file's directory rather than the file, so it survives
// what replaces a file instead of writing it: an editor's rename, and the
// swap of the ..data symlink of a Kubernetes Secret or ConfigMap volume,
// where keys.yaml is a symlink to ..data/keys.yaml. If the directory is
// removed, later changes go unseen until Watch is started again.
//
// It is config.Watch for one file; config.Watch reads a directory of rule
// files and cannot be pointed at a keys file.
func Watch(ctx context.Context, path string, onChange func(*Keys, error)) error {
	return watch(ctx, path, onChange, watchHooks{})
}

// watchHooks let tests wait for Watch's own steps instead of sleeping.
type watchHooks struct {
	// ready runs once the watch is in place.
	ready func()
	// reloaded runs after each reload, saying whether onChange was called.
	reloaded func(changed bool)
}

func watch(ctx context.Context, path string, onChange func(*Keys, error), h watchHooks) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("watch keys %q: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch keys %q: %w", path, err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(filepath.Clean(path))); err != nil {
		return fmt.Errorf("watch keys %q: %w", path, err)
	}
	// No real fingerprint is all zeros, so the first reload, scheduled
	// below, reports the keys as they are now.
	var last [sha256.Size]byte
	if h.ready != nil {
		h.ready()
	}

	timer := time.NewTimer(time.Hour)
	timer.Stop() // since Go 1.23 a stopped timer delivers nothing stale
	defer timer.Stop()
	var fire <-chan time.Time // nil while no reload is pending
	var first time.Time       // the first event of the pending burst
	schedule := func() {
		now := time.Now()
		if fire == nil {
			first = now
		}
		timer.Reset(max(0, min(settle, maxWait-now.Sub(first))))
		fire = timer.C
	}
	schedule()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			schedule()
		case _, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// Most likely an overflow: events were lost, so look again.
			schedule()
		case <-fire:
			fire = nil
			data, err := readCapped(path)
			sum := fingerprint(data, err)
			changed := sum != last
			if changed {
				last = sum
				var k *Keys
				if err == nil {
					k, err = Parse(path, data)
				} else {
					err = fmt.Errorf("load keys %q: %w", path, err)
				}
				onChange(k, err)
			}
			if h.reloaded != nil {
				h.reloaded(changed)
			}
		}
	}
}

// fingerprint identifies what a read saw: the bytes, or the error.
func fingerprint(data []byte, err error) [sha256.Size]byte {
	if err != nil {
		return sha256.Sum256([]byte("error\x00" + err.Error()))
	}
	return sha256.Sum256(append([]byte("data\x00"), data...))
}
