package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// root is the repository's top, from tools/image.
const root = "../.."

// chartImage is the image the chart pulls by default, read as Helm
// reads it: image.repository and appVersion.
func chartImage(t testing.TB) (repo, version string) {
	t.Helper()
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `yaml:"repository"`
			Tag        string `yaml:"tag"`
		} `yaml:"image"`
	}
	readYAML(t, filepath.Join(root, "charts/tollgate/Chart.yaml"), &chart)
	readYAML(t, filepath.Join(root, "charts/tollgate/values.yaml"), &values)
	if values.Image.Tag != "" {
		t.Errorf("values.yaml image.tag %q: the default tag must be appVersion, which the release pushes", values.Image.Tag)
	}
	if chart.AppVersion == "" || values.Image.Repository == "" {
		t.Fatalf("appVersion %q, image.repository %q: want both", chart.AppVersion, values.Image.Repository)
	}
	return values.Image.Repository, chart.AppVersion
}

func readYAML(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// makeTarget runs make in the repository's top and returns its output.
func makeTarget(t testing.TB, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	cmd := exec.Command("make", append([]string{"-s", "-C", root}, args...)...)
	// Not the flags of a make that runs this test (-n, -k, a jobserver).
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestReleaseSource checks that the image's name and tag have one
// source, the chart: the Makefile's reading of it (which `make image`,
// `make image-push` and the release workflow use) agrees with a YAML
// parser's, the workflow names no image or version of its own, and a
// tag that is not v<appVersion> stops the release.
func TestReleaseSource(t *testing.T) {
	t.Parallel()
	repo, version := chartImage(t)
	got, err := makeTarget(t, "image-ref")
	if err != nil || got != repo+":"+version {
		t.Errorf("make image-ref = %q (%v), want the chart's %s:%s", got, err, repo, version)
	}
	if out, err := makeTarget(t, "release-check", "TAG=v"+version); err != nil {
		t.Errorf("make release-check TAG=v%s: %v\n%s", version, err, out)
	}
	for _, tag := range []string{version, "v" + version + ".1", ""} {
		if out, err := makeTarget(t, "release-check", "TAG="+tag); err == nil {
			t.Errorf("make release-check TAG=%s passed (%s), want a refusal", tag, out)
		}
	}

	path := filepath.Join(root, ".github/workflows/release.yml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{repo, version, "ghcr.io"} {
		if strings.Contains(string(raw), s) {
			t.Errorf("%s names %q: the image's name and tag come from the chart, through make", path, s)
		}
	}
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Permissions map[string]string `yaml:"permissions"`
		Jobs        map[string]struct {
			Steps []struct {
				Uses string `yaml:"uses"`
				Run  string `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	readYAML(t, path, &wf)
	if !slices.Equal(wf.On.Push.Tags, []string{"v*"}) {
		t.Errorf("on.push.tags %q, want [v*]", wf.On.Push.Tags)
	}
	if want := map[string]string{"contents": "read", "packages": "write"}; len(wf.Permissions) != len(want) ||
		wf.Permissions["contents"] != "read" || wf.Permissions["packages"] != "write" {
		t.Errorf("permissions %v, want %v", wf.Permissions, want)
	}
	var runs []string
	pinned := regexp.MustCompile(`^[\w.-]+/[\w.-]+@[0-9a-f]{40}$`)
	for _, j := range wf.Jobs {
		for _, s := range j.Steps {
			if s.Uses != "" && !pinned.MatchString(s.Uses) {
				t.Errorf("uses: %s is not pinned to a commit", s.Uses)
			}
			if s.Run != "" {
				runs = append(runs, strings.TrimSpace(s.Run))
			}
		}
	}
	// The tag is checked before anything is pushed.
	if want := []string{`make release-check TAG="$GITHUB_REF_NAME"`, `make image-push IMAGE_ARCH="amd64 arm64"`}; !slices.Equal(runs, want) {
		t.Errorf("the workflow runs %q, want %q", runs, want)
	}
}

// TestDockerfileHealthcheck checks that the Dockerfile's HEALTHCHECK is
// the one tools/image writes into the image's config.
func TestDockerfileHealthcheck(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^HEALTHCHECK --interval=(\S+) --timeout=(\S+) --start-period=(\S+) --retries=(\d+) CMD (\[.*\])$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("Dockerfile: no HEALTHCHECK --interval= --timeout= --start-period= --retries= CMD [...]")
	}
	h := healthcheck
	want := []string{h.Interval.String(), h.Timeout.String(), h.StartPeriod.String(), strconv.Itoa(h.Retries), `["` + strings.Join(h.Test[1:], `", "`) + `"]`}
	for i, w := range want {
		got := m[i+1]
		if d, err := time.ParseDuration(got); err == nil && i < 3 {
			got = d.String()
		}
		if got != w {
			t.Errorf("Dockerfile HEALTHCHECK field %d = %q, want %q as in the image's config", i, got, w)
		}
	}
}
