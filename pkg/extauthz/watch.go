package extauthz

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
)

// Watch calls onChange with the result of LoadSettings each time the authz
// config at path, or the keys file it names, changes, until ctx is done.
// It returns nil when ctx ends, and an error only if it cannot start
// watching.
//
// It is config.WatchFiles over both files at once, as config.Watch and
// authn.Watch are over theirs, so a config that names another keys file
// and the keys it names are loaded together: onChange runs on Watch's
// goroutine, one call at a time; once its watches are in place Watch
// loads both files and calls onChange, so a change made since the
// caller's own load is never missed; after that it calls onChange only
// when the bytes of either file change. On an error the caller should
// keep the settings it has.
//
// Unlike LoadSettings, Watch reads the keys file with authn.ParseEach: a
// keys file with bad entries gives settings whose keys leave those
// entries out (Keys.Skipped, Keys.Problems) and apply the rest, so a key
// the new file removes stops working even when another entry is bad. Only
// a keys file that cannot be used at all is an error. It watches the files' directories, so an
// editor's rename and a Kubernetes volume's ..data symlink swap are seen;
// the keys file's directory is watched from the first load that names it.
func Watch(ctx context.Context, path string, onChange func(*Settings, error)) error {
	return watch(ctx, path, onChange, config.WatchHooks{})
}

func watch(ctx context.Context, path string, onChange func(*Settings, error), h config.WatchHooks) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("watch authz config %q: %w", path, err)
	}
	load := func() (*Settings, [32]byte, []string, error) {
		s, sum, keysFile, err := loadFiles(path, authn.ParseEach)
		var dirs []string
		if keysFile != "" {
			dirs = []string{filepath.Dir(keysFile)}
		}
		return s, sum, dirs, err
	}
	dir := filepath.Dir(filepath.Clean(path))
	if err := config.WatchFilesWithHooks(ctx, []string{dir}, load, onChange, h); err != nil {
		return fmt.Errorf("watch authz config %q: %w", path, err)
	}
	return nil
}

// load is LoadSettings that also fingerprints what it read: both files'
// bytes, or the errors reading them gave.
func load(path string) (*Settings, [sha256.Size]byte, error) {
	s, sum, _, err := loadFiles(path, authn.Parse)
	return s, sum, err
}

// loadFiles is load that also returns the keys file the settings name, if
// they parse, even when loading the keys fails. parseKeys is authn.Parse
// or authn.ParseEach.
func loadFiles(path string, parseKeys func(name string, data []byte) (*authn.Keys, error)) (_ *Settings, _ [sha256.Size]byte, keysFile string, _ error) {
	h := sha256.New()
	sum := func() (out [sha256.Size]byte) {
		h.Sum(out[:0])
		return out
	}
	// write adds one read to the fingerprint, length first, so no two
	// different reads hash the same bytes.
	write := func(data []byte, err error) {
		if err != nil {
			io.WriteString(h, "error\x00"+err.Error()+"\x00")
			return
		}
		io.WriteString(h, strconv.Itoa(len(data))+":")
		h.Write(data)
	}
	data, err := config.ReadCapped(path)
	write(data, err)
	if err != nil {
		return nil, sum(), "", fmt.Errorf("load authz config %q: %w", path, err)
	}
	s, err := ParseSettings(path, data)
	if err != nil {
		return nil, sum(), "", err
	}
	if s.KeysFile == "" {
		return s, sum(), "", nil
	}
	keys, err := config.ReadCapped(s.KeysFile)
	write(keys, err)
	if err != nil {
		return nil, sum(), s.KeysFile, fmt.Errorf("load keys %q: %w", s.KeysFile, err)
	}
	if s.Keys, err = parseKeys(s.KeysFile, keys); err != nil {
		return nil, sum(), s.KeysFile, err
	}
	return s, sum(), s.KeysFile, nil
}
