package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// want is what checkArchive expects of an archive.
type want struct {
	version string   // the version label
	ref     string   // the recorded name (Optional: unchecked when empty)
	archs   []string // one image for each, in this order; one makes a plain image
}

// checkArchive reads the oci-archive at path as a registry would and
// checks what Kubernetes, Docker and the chart rely on: one linux image
// for each architecture (an image index for more than one) whose
// entrypoint runs tollgate serve as a non-root user, exposing the gRPC
// and admin ports, with tollgate health as its healthcheck, labelled
// with its source and version, with the binary executable in its layer.
func checkArchive(path string, w want) error {
	dir, err := os.MkdirTemp("", "tollgate-image-check")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(path, dir); err != nil {
		return err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return fmt.Errorf("not an OCI image layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(im.Manifests) != 1 {
		return fmt.Errorf("%d manifests in the index, want 1", len(im.Manifests))
	}
	top := im.Manifests[0]
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if got := top.Annotations[refName]; w.ref != "" && got != w.ref {
		add("name %q, want %q", got, w.ref)
	}
	// The images, with the architecture each is for.
	type platformImage struct {
		arch string
		img  v1.Image
	}
	var imgs []platformImage
	if top.MediaType.IsIndex() {
		ii, err := idx.ImageIndex(top.Digest)
		if err != nil {
			return err
		}
		m, err := ii.IndexManifest()
		if err != nil {
			return err
		}
		for _, d := range m.Manifests {
			if d.Platform == nil || d.Platform.OS != "linux" {
				add("manifest %s: platform %v, want linux/...", d.Digest, d.Platform)
				continue
			}
			img, err := ii.Image(d.Digest)
			if err != nil {
				return err
			}
			imgs = append(imgs, platformImage{d.Platform.Architecture, img})
		}
	} else {
		img, err := idx.Image(top.Digest)
		if err != nil {
			return err
		}
		imgs = append(imgs, platformImage{"", img})
	}
	if len(imgs) != len(w.archs) {
		add("%d images, want one for each of %q", len(imgs), w.archs)
	}
	for i, pi := range imgs {
		cf, err := pi.img.ConfigFile()
		if err != nil {
			return err
		}
		if pi.arch != "" && cf.Architecture != pi.arch {
			add("the %s image's config says %s", pi.arch, cf.Architecture)
		}
		if i < len(w.archs) && cf.Architecture != w.archs[i] {
			add("image %d is for %s, want %s", i, cf.Architecture, w.archs[i])
		}
		for _, p := range checkImage(pi.img, cf, w.version) {
			add("%s: %s", cf.Architecture, p)
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// checkImage returns what is wrong with one image and its config.
func checkImage(img v1.Image, cf *v1.ConfigFile, version string) []string {
	c := cf.Config
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if cf.OS != "linux" {
		add("os %q, want linux", cf.OS)
	}
	if !slices.Equal(c.Entrypoint, []string{binPath}) || !slices.Equal(c.Cmd, []string{"serve"}) {
		add("entrypoint %q cmd %q, want [%s] [serve]", c.Entrypoint, c.Cmd, binPath)
	}
	if c.User == "" || c.User == "0" || strings.HasPrefix(c.User, "0:") || c.User == "root" {
		add("user %q, want a non-root uid", c.User)
	}
	for _, p := range []string{grpcPort, adminPort} {
		if _, ok := c.ExposedPorts[p]; !ok {
			add("port %s not exposed (%v)", p, c.ExposedPorts)
		}
	}
	if len(c.ExposedPorts) != 2 {
		add("%d ports exposed, want only %s and %s", len(c.ExposedPorts), grpcPort, adminPort)
	}
	if h := c.Healthcheck; h == nil || !slices.Equal(h.Test, healthcheck.Test) || h.Timeout <= 0 || h.Interval <= 0 {
		add("healthcheck %+v, want %q with an interval and a timeout", h, healthcheck.Test)
	}
	if got := c.Labels["org.opencontainers.image.source"]; got != source {
		add("label org.opencontainers.image.source %q, want %q", got, source)
	}
	if got := c.Labels["org.opencontainers.image.version"]; got != version {
		add("label org.opencontainers.image.version %q, want %q", got, version)
	}
	if err := checkBinary(img); err != nil {
		add("%v", err)
	}
	return problems
}

// checkBinary finds the tollgate binary in img's layers, executable.
func checkBinary(img v1.Image) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return err
			}
			if "/"+strings.TrimPrefix(h.Name, "./") == binPath {
				rc.Close()
				if h.Mode&0o111 == 0 || h.Size == 0 {
					return fmt.Errorf("%s mode %o size %d, want an executable", binPath, h.Mode, h.Size)
				}
				return nil
			}
		}
		rc.Close()
	}
	return fmt.Errorf("no %s in the image's layers", binPath)
}

// untar extracts the tar file at path into dir (regular files and
// directories only; no name may leave dir).
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("%s: %q leaves the archive", path, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			out, err := os.Create(name)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if err2 := out.Close(); err == nil {
				err = err2
			}
			if err != nil {
				return err
			}
		}
	}
}
