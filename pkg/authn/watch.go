package authn

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

// Watch calls onChange with the result of reading the keys file at path
// with ParseEach each time it changes, until ctx is done. It returns nil
// when ctx ends, and an error only if it cannot start watching.
//
// onChange runs on Watch's goroutine, one call at a time. It gets either
// the new keys, which leave out the entries with problems (see
// Keys.Skipped and Keys.Problems), or the error that reading the file or
// parsing it at all gave (usually a config.Errors); on an error the caller
// should keep the keys it has. Once its
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
// It is config.WatchFiles over one file, as config.Watch is over rules.
func Watch(ctx context.Context, path string, onChange func(*Keys, error)) error {
	return watch(ctx, path, onChange, config.WatchHooks{})
}

func watch(ctx context.Context, path string, onChange func(*Keys, error), h config.WatchHooks) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("watch keys %q: %w", path, err)
	}
	load := func() (*Keys, [32]byte, []string, error) {
		data, err := config.ReadCapped(path)
		if err != nil {
			return nil, sha256.Sum256([]byte("error\x00" + err.Error())), nil, fmt.Errorf("load keys %q: %w", path, err)
		}
		k, err := ParseEach(path, data)
		return k, sha256.Sum256(append([]byte("data\x00"), data...)), nil, err
	}
	dir := filepath.Dir(filepath.Clean(path))
	if err := config.WatchFilesWithHooks(ctx, []string{dir}, load, onChange, h); err != nil {
		return fmt.Errorf("watch keys %q: %w", path, err)
	}
	return nil
}
