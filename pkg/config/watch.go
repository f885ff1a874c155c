package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

const (
	// settle is how long the files must be quiet before a reload: an
	// editor's save or a ConfigMap swap is a burst of events.
	settle = 150 * time.Millisecond
	// maxWait bounds the delay when events never stop (a busy directory).
	maxWait = time.Second
)

// Watch calls onChange with the result of Load each time the rules under
// path change, until ctx is done. It returns nil when ctx ends, and an
// error only if it cannot start watching.
//
// onChange runs on Watch's goroutine, one call at a time. It gets either
// the new rules or the error (usually an Errors) that loading them gave;
// on an error the caller should keep serving the rules it has. Once its
// watches are in place Watch loads the rules once and calls onChange, so
// a change made between the caller's own Load and the start of Watch is
// never missed; after that it calls onChange only when the files' bytes
// change (not for a touch, an editor's swap file, or an unrelated key of
// a ConfigMap).
//
// Watch watches directories rather than files, so it survives what
// replaces a file instead of writing it: an editor's rename-and-replace,
// and the atomic swap of a ConfigMap's ..data symlink, which happens in
// the directory that holds the rules.yaml symlink. For a directory path it
// also watches the parent, so a path that is itself a swapped symlink is
// covered. If a watched directory is removed, later changes go unseen
// until Watch is started again.
func Watch(ctx context.Context, path string, onChange func(*limit.RuleSet, error)) error {
	return watch(ctx, path, onChange, watchHooks{})
}

// watchHooks let tests wait for Watch's own steps instead of sleeping.
type watchHooks struct {
	// ready runs once the watches are in place and the baseline is read.
	ready func()
	// reloaded runs after each reload, saying whether onChange was called.
	reloaded func(changed bool)
}

func watch(ctx context.Context, path string, onChange func(*limit.RuleSet, error), h watchHooks) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("watch rules %q: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch rules %q: %w", path, err)
	}
	defer w.Close()
	parent := filepath.Dir(filepath.Clean(path))
	if fi.IsDir() {
		if err := w.Add(path); err != nil {
			return fmt.Errorf("watch rules %q: %w", path, err)
		}
		// Best effort: it only matters when path is a symlink that is swapped.
		_ = w.Add(parent)
	} else if err := w.Add(parent); err != nil {
		return fmt.Errorf("watch rules %q: %w", path, err)
	}

	// No real fingerprint is all zeros, so the first reload, scheduled
	// below, reports the rules as they are now.
	var last [32]byte
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
			files, err := readRules(path)
			sum := fingerprint(files, err)
			changed := sum != last
			if changed {
				last = sum
				var rs *limit.RuleSet
				if err == nil {
					rs, err = compile(files)
				}
				onChange(rs, err)
			}
			if h.reloaded != nil {
				h.reloaded(changed)
			}
		}
	}
}
