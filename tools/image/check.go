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

// checkArchive reads the oci-archive at path as a registry would and
// checks what Kubernetes and the chart rely on: one linux image whose
// entrypoint runs tollgate serve as a non-root user, exposing the gRPC
// and admin ports, labelled with its source and version, with the
// binary executable in its layer.
func checkArchive(path, version string) error {
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
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
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
	if got := c.Labels["org.opencontainers.image.source"]; got != source {
		add("label org.opencontainers.image.source %q, want %q", got, source)
	}
	if got := c.Labels["org.opencontainers.image.version"]; got != version {
		add("label org.opencontainers.image.version %q, want %q", got, version)
	}
	if err := checkBinary(img); err != nil {
		add("%v", err)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
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
