package extauthz

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/tollgate-dev/tollgate/pkg/authn"
)

const (
	// settle is how long the files must be quiet before a reload: an
	// editor's save or a Secret's swap is a burst of events.
	settle = 150 * time.Millisecond
	// maxWait bounds the delay when events never stop (a busy directory).
	maxWait = time.Second
)

// Watch calls onChange with the result of LoadSettings each time the authz
// config at path, or the keys file it names, changes, until ctx is done.
// It returns nil when ctx ends, and an error only if it cannot start
// watching.
//
// It is the same mechanism as config.Watch and authn.Watch, over both
// files at once, so a config that names another keys file and the keys
// it names are loaded together: onChange runs on Watch's goroutine, one
// call at a time; once its watches are in place Watch loads both files
// and calls onChange, so a change made since the caller's own load is
// never missed; after that it calls onChange only when the bytes of
// either file change. On an error the caller should keep the settings it
// has. It watches the files' directories, so an editor's rename and a
// Kubernetes volume's ..data symlink swap are seen.
func Watch(ctx context.Context, path string, onChange func(*Settings, error)) error {
	return watch(ctx, path, onChange, watchHooks{})
}

// watchHooks let tests wait for Watch's own steps instead of sleeping.
type watchHooks struct {
	// ready runs once the watches are in place.
	ready func()
	// reloaded runs after each reload, saying whether onChange was called.
	reloaded func(changed bool)
}

func watch(ctx context.Context, path string, onChange func(*Settings, error), h watchHooks) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("watch authz config %q: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch authz config %q: %w", path, err)
	}
	defer w.Close()
	watched := map[string]bool{}
	add := func(file string) error {
		dir := filepath.Dir(filepath.Clean(file))
		if watched[dir] {
			return nil
		}
		if err := w.Add(dir); err != nil {
			return err
		}
		watched[dir] = true
		return nil
	}
	if err := add(path); err != nil {
		return fmt.Errorf("watch authz config %q: %w", path, err)
	}
	if s, err := ParseSettings(path, mustRead(path)); err == nil && s.KeysFile != "" {
		// Best effort: a keys file that cannot be watched yet is added
		// once a reload reads it.
		_ = add(s.KeysFile)
	}
	// No real fingerprint is all zeros, so the first reload, scheduled
	// below, reports the settings as they are now.
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
			s, sum, err := load(path)
			changed := sum != last
			if changed {
				last = sum
				if s != nil && s.KeysFile != "" {
					_ = add(s.KeysFile)
				}
				onChange(s, err)
			}
			if h.reloaded != nil {
				h.reloaded(changed)
			}
		}
	}
}

func mustRead(path string) []byte {
	data, _ := readCapped(path)
	return data
}

// load is LoadSettings that also fingerprints what it read: both files'
// bytes, or the errors reading them gave.
func load(path string) (*Settings, [sha256.Size]byte, error) {
	h := sha256.New()
	data, err := readCapped(path)
	write(h, data, err)
	if err != nil {
		return nil, sum(h), fmt.Errorf("load authz config %q: %w", path, err)
	}
	s, err := ParseSettings(path, data)
	if err != nil {
		return nil, sum(h), err
	}
	if s.KeysFile == "" {
		return s, sum(h), nil
	}
	keys, err := readCapped(s.KeysFile)
	write(h, keys, err)
	if err != nil {
		return nil, sum(h), fmt.Errorf("load keys %q: %w", s.KeysFile, err)
	}
	if s.Keys, err = authn.Parse(s.KeysFile, keys); err != nil {
		return nil, sum(h), err
	}
	return s, sum(h), nil
}

// write adds one read to a fingerprint, length first, so no two
// different reads hash the same bytes.
func write(h io.Writer, data []byte, err error) {
	if err != nil {
		io.WriteString(h, "error\x00"+err.Error()+"\x00")
		return
	}
	io.WriteString(h, strconv.Itoa(len(data))+":")
	h.Write(data)
}

func sum(h interface{ Sum([]byte) []byte }) [sha256.Size]byte {
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}
