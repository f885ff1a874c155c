package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rulesYAML is a small valid rule file whose limit tells versions apart.
func rulesYAML(domain string, perSecond int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: %d}\n", domain, perSecond)
}

func writeFile(tb testing.TB, path, data string) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// publishConfigMap lays out dir as kubelet does for a ConfigMap volume,
// or swaps in new files atomically as kubelet does on an update: write a
// new hidden timestamped directory, point ..data_tmp at it, rename
// ..data_tmp over ..data, add the per-file symlinks through ..data
// (rules.yaml -> ..data/rules.yaml), remove the old directory.
func publishConfigMap(tb testing.TB, dir string, files map[string]string) {
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

func TestLoadDirectory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give func(tb testing.TB, dir string)
		want string // the domains' sources, or the error
	}{
		{
			name: "ConfigMap volume",
			give: func(tb testing.TB, dir string) {
				publishConfigMap(tb, dir, map[string]string{"edge.yaml": rulesYAML("edge", 1), "api.yml": rulesYAML("api", 1)})
			},
			want: "$DIR/api.yml $DIR/edge.yaml",
		},
		{
			name: "other files, hidden files and subdirectories are skipped",
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, "edge.YAML"), rulesYAML("edge", 1))
				writeFile(tb, filepath.Join(dir, "README.md"), "not rules")
				writeFile(tb, filepath.Join(dir, ".edge.yaml.swp"), "not rules")
				writeFile(tb, filepath.Join(dir, ".hidden.yaml"), "not: rules")
				writeFile(tb, filepath.Join(dir, "nested", "api.yaml"), rulesYAML("api", 1))
				if err := os.Mkdir(filepath.Join(dir, "dir.yaml"), 0o755); err != nil {
					tb.Fatal(err)
				}
			},
			want: "$DIR/edge.YAML",
		},
		{
			name: "problems from every file",
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, "a.yaml"), "domain: a\nalgorithm: nope\n")
				writeFile(tb, filepath.Join(dir, "b.yaml"), "domain: b\ndescriptors: 1\n")
			},
			want: `$DIR/a.yaml:2: algorithm: "nope" is not one of sliding_window|fixed_window|token_bucket
$DIR/b.yaml:2: descriptors: want a list of descriptors, got 1`,
		},
		{
			name: "no rule file",
			give: func(tb testing.TB, dir string) {
				writeFile(tb, filepath.Join(dir, "notes.txt"), "")
			},
			want: `load rules "$DIR": no *.yaml or *.yml file in the directory`,
		},
		{
			name: "dangling symlink",
			give: func(tb testing.TB, dir string) {
				if err := os.Symlink("..data/gone.yaml", filepath.Join(dir, "gone.yaml")); err != nil {
					tb.Fatal(err)
				}
			},
			want: `load rules "$DIR": stat $DIR/gone.yaml: no such file or directory`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			tt.give(t, dir)
			rs, err := Load(dir)
			var got string
			if err != nil {
				got = err.Error()
			} else {
				var srcs []string
				for _, d := range rs.Domains() {
					srcs = append(srcs, d.Source)
				}
				got = strings.Join(srcs, " ")
			}
			if got = strings.ReplaceAll(got, dir, "$DIR"); got != tt.want {
				t.Errorf("Load = %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	t.Parallel()
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load error = %v, want one wrapping fs.ErrNotExist", err)
	}
}

// TestLoadLargeFile checks that Load stops reading at the cap.
func TestLoadLargeFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "big.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil { // sparse: 64 MiB of zero bytes
		t.Fatal(err)
	}
	f.Close()
	_, err = Load(path)
	want := path + ": file is larger than 4 MiB, the most a rule file may hold"
	if err == nil || err.Error() != want {
		t.Errorf("Load error = %v, want %s", err, want)
	}
}
