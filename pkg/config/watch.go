package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tollgate-dev/tollgate/pkg/limit"
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
// Watch is WatchFiles over the rules: it watches directories rather than
// files, so it survives what replaces a file instead of writing it: an
// editor's rename-and-replace, and the atomic swap of a ConfigMap's ..data
// symlink, which happens in the directory that holds the rules.yaml
// symlink. For a directory path it also watches the parent, so a path that
// is itself a swapped symlink is covered. If a watched directory is
// removed, later changes go unseen until Watch is started again.
func Watch(ctx context.Context, path string, onChange func(*limit.RuleSet, error)) error {
	return watch(ctx, path, onChange, WatchHooks{})
}

func watch(ctx context.Context, path string, onChange func(*limit.RuleSet, error), h WatchHooks) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("watch rules %q: %w", path, err)
	}
	parent := filepath.Dir(filepath.Clean(path))
	dirs, more := []string{parent}, []string(nil)
	if fi.IsDir() {
		// The parent is best effort: it only matters when path is a
		// symlink that is swapped.
		dirs, more = []string{path}, []string{parent}
	}
	load := func() (*limit.RuleSet, [32]byte, []string, error) {
		files, err := readRules(path)
		sum := fingerprint(files, err)
		var rs *limit.RuleSet
		if err == nil {
			rs, err = compile(files)
		}
		return rs, sum, more, err
	}
	if err := WatchFilesWithHooks(ctx, dirs, load, onChange, h); err != nil {
		return fmt.Errorf("watch rules %q: %w", path, err)
	}
	return nil
}
