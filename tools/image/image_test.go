package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
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
	o := options{binaries: []binary{{"arm64", bin}}, ca: ca, version: "9.8.7", out: out, ref: "example.com/tollgate:9.8.7"}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	w := want{version: "9.8.7", ref: "example.com/tollgate:9.8.7", archs: []string{"arm64"}}
	if err := checkArchive(out, w); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		give    want
		wantErr string
	}{
		{name: "another version", give: want{version: "1.0.0", ref: w.ref, archs: w.archs}, wantErr: "version"},
		{name: "another name", give: want{version: w.version, ref: "example.com/other:9.8.7", archs: w.archs}, wantErr: "name"},
		{name: "another arch", give: want{version: w.version, archs: []string{"amd64"}}, wantErr: "want amd64"},
		{name: "two archs", give: want{version: w.version, archs: []string{"arm64", "amd64"}}, wantErr: "1 images"},
	} {
		if err := checkArchive(out, tt.give); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("check of %s = %v, want a problem with %q", tt.name, err, tt.wantErr)
		}
	}
	// The same inputs give the same archive, byte for byte (main.go's
	// epoch times), built a second later: tar keeps whole seconds, so a
	// build that stamped the clock would differ.
	time.Sleep(1100 * time.Millisecond)
	again := filepath.Join(dir, "again.tar")
	o.out = again
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	a, errA := os.ReadFile(out)
	b, errB := os.ReadFile(again)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Errorf("two builds of the same inputs differ (%d and %d bytes; %v, %v)", len(a), len(b), errA, errB)
	}
}

// TestImageIndex builds a multi-arch image, as the release workflow
// does: an image index of one image per architecture, under one name.
func TestImageIndex(t *testing.T) {
	t.Parallel()
	out := multiArch(t, "example.com/tollgate:9.8.7")
	if err := checkArchive(out, want{version: "9.8.7", ref: "example.com/tollgate:9.8.7", archs: []string{"amd64", "arm64"}}); err != nil {
		t.Fatal(err)
	}
	if err := checkArchive(out, want{version: "9.8.7", archs: []string{"amd64"}}); err == nil {
		t.Error("an index of two images passed as one image")
	}
}

// TestBinaryFlags covers -binary ARCH=PATH.
func TestBinaryFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    []string
		want    []binary
		wantErr string
	}{
		{name: "two", give: []string{"amd64=a", "arm64=b"}, want: []binary{{"amd64", "a"}, {"arm64", "b"}}},
		{name: "no arch", give: []string{"bin/tollgate"}, wantErr: "want ARCH=PATH"},
		{name: "no path", give: []string{"amd64="}, wantErr: "want ARCH=PATH"},
		{name: "an arch twice", give: []string{"amd64=a", "amd64=b"}, wantErr: "a second binary for amd64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b binaryFlags
			var err error
			for _, v := range tt.give {
				if err = b.Set(v); err != nil {
					break
				}
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Set(%q) = %v, want %q", tt.give, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(b, tt.want) {
				t.Errorf("Set(%q) = %v, %v; want %v", tt.give, b, err, tt.want)
			}
		})
	}
}

// multiArch writes a two-arch image of stand-in binaries named ref and
// returns its path.
func multiArch(t testing.TB, ref string) string {
	t.Helper()
	dir := t.TempDir()
	var bins []binary
	for _, arch := range []string{"amd64", "arm64"} {
		p := filepath.Join(dir, arch)
		if err := os.WriteFile(p, []byte("#!/bin/true "+arch+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		bins = append(bins, binary{arch, p})
	}
	out := filepath.Join(dir, "image.tar")
	if err := build(options{binaries: bins, version: "9.8.7", out: out, ref: ref}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImageTarball checks the image `make image` wrote: IMAGE_TAR, with
// IMAGE_VERSION, IMAGE_REF and IMAGE_ARCH (space-separated) as the chart
// and the Makefile say; skipped without it.
func TestImageTarball(t *testing.T) {
	path := os.Getenv("IMAGE_TAR")
	if path == "" {
		t.Skip("IMAGE_TAR is not set: `make image` sets it")
	}
	w := want{version: os.Getenv("IMAGE_VERSION"), ref: os.Getenv("IMAGE_REF"), archs: strings.Fields(os.Getenv("IMAGE_ARCH"))}
	if err := checkArchive(path, w); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
