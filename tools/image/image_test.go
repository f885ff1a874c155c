package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImage builds an image of a stand-in binary and reads it back: the
// config the chart and Kubernetes rely on, and the binary in its layer.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tollgate")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	if err := build(options{binary: bin, ca: ca, version: "9.8.7", arch: "arm64", out: out, ref: "example.com/tollgate:9.8.7"}); err != nil {
		t.Fatal(err)
	}
	if err := checkArchive(out, "9.8.7"); err != nil {
		t.Fatal(err)
	}
	if err := checkArchive(out, "1.0.0"); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("check of another version = %v, want a version problem", err)
	}
}

// TestImageTarball checks the image `make image` wrote (IMAGE_TAR, with
// IMAGE_VERSION); skipped without it.
func TestImageTarball(t *testing.T) {
	path, version := os.Getenv("IMAGE_TAR"), os.Getenv("IMAGE_VERSION")
	if path == "" {
		t.Skip("IMAGE_TAR is not set: `make image` sets it")
	}
	if err := checkArchive(path, version); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
