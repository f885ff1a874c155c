package config

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// settle is how long the directories must be quiet before a reload:
	// an editor's save or a ConfigMap's swap is a burst of events.
	settle = 150 * time.Millisecond
	// maxWait bounds the delay when events never stop (a busy directory).
	maxWait = time.Second
)

// WatchFiles watches the directories a load reads from and calls onChange
// with load's result whenever the bytes it read change (debounced: 150ms
// quiet, at most 1s), and once right after the watches are in place, so a
// change made between the caller's own load and the start of WatchFiles is
// never missed. It returns nil when ctx ends, and an error only if it
// cannot start.
//
// load returns the value, a fingerprint of everything it read (errors
// included), and the directories to watch
// besides dirs, so that a settings file can add the directory of a keys
// file it names. Those are watched on a best-effort basis: one that cannot
// be watched is tried again after the next load. When a load adds a
// watch, it is repeated once the events settle, since what it read may
// predate the watch. Every directory in dirs must be watchable.
//
// onChange runs on WatchFiles' goroutine, one call at a time, and only
// when the fingerprint differs from the last one reported: a touch, an
// editor's swap file or an unrelated file in a watched directory does not
// call it. On an error the caller should keep what it has.
//
// Watching directories rather than files survives what replaces a file
// instead of writing it: an editor's rename-and-replace, and the atomic
// swap of a Kubernetes volume's ..data symlink, which happens in the
// directory that holds the file's symlink. If a watched directory is
// removed, changes in it go unseen until WatchFiles is started again.
func WatchFiles[T any](ctx context.Context, dirs []string, load func() (T, [32]byte, []string, error), onChange func(T, error)) error {
	return WatchFilesWithHooks(ctx, dirs, load, onChange, WatchHooks{})
}

// WatchHooks let tests wait for WatchFiles' steps instead of sleeping. The
// zero value does nothing.
type WatchHooks struct {
	// Ready runs once the watches are in place, before the first onChange.
	Ready func()
	// Reloaded runs after each load, saying whether onChange was called.
	Reloaded func(changed bool)
}

// WatchFilesWithHooks is WatchFiles calling h's hooks; it is for tests.
func WatchFilesWithHooks[T any](ctx context.Context, dirs []string, load func() (T, [32]byte, []string, error), onChange func(T, error), h WatchHooks) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch files: %w", err)
	}
	defer w.Close() //nolint:errcheck // closing the watcher on return; its error has no one to tell
	watched := map[string]bool{}
	for _, d := range dirs {
		d = filepath.Clean(d)
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watch directory %q: %w", d, err)
		}
		watched[d] = true
	}
	// reload loads and watches the directories load names. It reports
	// whether it added a watch, in which case the load must be repeated.
	reload := func() (v T, sum [32]byte, added bool, err error) {
		v, sum, more, err := load()
		for _, d := range more {
			d = filepath.Clean(d)
			if !watched[d] && w.Add(d) == nil {
				watched[d] = true
				added = true
			}
		}
		return v, sum, added, err
	}

	// The first report must come from a load made after every directory
	// it read from was watched; should load keep naming new directories,
	// the loop below catches up after the first report.
	v, last, again, err := reload()
	for i := 0; again && i < 3; i++ {
		v, last, again, err = reload()
	}
	if h.Ready != nil {
		h.Ready()
	}
	onChange(v, err)
	if h.Reloaded != nil {
		h.Reloaded(true)
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
	if again {
		schedule()
	}
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
			v, sum, added, err := reload()
			if added {
				schedule()
			}
			changed := sum != last
			if changed {
				last = sum
				onChange(v, err)
			}
			if h.Reloaded != nil {
				h.Reloaded(changed)
			}
		}
	}
}
