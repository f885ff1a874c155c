package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	// The same inputs give the same archive, byte for byte (main.go's
	// epoch times), built a second later: tar keeps whole seconds, so a
	// build that stamped the clock would differ.
	time.Sleep(1100 * time.Millisecond)
	again := filepath.Join(dir, "again.tar")
	if err := build(options{binary: bin, ca: ca, version: "9.8.7", arch: "arm64", out: again, ref: "example.com/tollgate:9.8.7"}); err != nil {
		t.Fatal(err)
	}
	a, errA := os.ReadFile(out)
	b, errB := os.ReadFile(again)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Errorf("two builds of the same inputs differ (%d and %d bytes; %v, %v)", len(a), len(b), errA, errB)
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
