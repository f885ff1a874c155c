// Command image writes Tollgate's container image as an OCI image layout
// in a tar file (an oci-archive), without a container engine: one layer
// holding a static tollgate binary and the CA bundle, run as a non-root
// user, for each architecture it is given (two or more make an image
// index). `make image` builds the binaries and runs it; `image -push`
// sends the archive to the name it records, as the release workflow
// does; `skopeo copy oci-archive:bin/tollgate-image.tar docker://REPO:TAG`
// or `podman load` take it from there too.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed parts; check.go reads them back.
const (
	binPath   = "/tollgate"
	caPath    = "/etc/ssl/certs/ca-certificates.crt"
	user      = "65532:65532" // distroless's nonroot
	source    = "https://github.com/tollgate-dev/tollgate"
	grpcPort  = "8081/tcp" // --grpc-addr
	adminPort = "8080/tcp" // --admin-addr: /healthz, /readyz, /metrics
	refName   = "org.opencontainers.image.ref.name"
)

// healthcheck is the Dockerfile's HEALTHCHECK: `tollgate health` GETs
// /readyz on the admin port (TOLLGATE_ADMIN_ADDR, as serve reads it).
// Docker runs it; Kubernetes ignores it for the chart's probes.
var healthcheck = v1.HealthConfig{
	Test:        []string{"CMD", binPath, "health"},
	Interval:    10 * time.Second,
	Timeout:     3 * time.Second,
	StartPeriod: 10 * time.Second,
	Retries:     3,
}

type options struct {
	binaries              []binary
	ca, version, out, ref string
}

// binary is a static linux tollgate for one GOARCH.
type binary struct{ arch, path string }

// binaryFlags collect -binary ARCH=PATH, in order.
type binaryFlags []binary

func (b *binaryFlags) String() string { return fmt.Sprint(*b) }

func (b *binaryFlags) Set(v string) error {
	arch, path, ok := strings.Cut(v, "=")
	if !ok || arch == "" || path == "" {
		return fmt.Errorf("%q: want ARCH=PATH, such as amd64=bin/image/linux-amd64/tollgate", v)
	}
	if slices.ContainsFunc(*b, func(x binary) bool { return x.arch == arch }) {
		return fmt.Errorf("%q: a second binary for %s", v, arch)
	}
	*b = append(*b, binary{arch: arch, path: path})
	return nil
}

func main() {
	var o options
	var push string
	flag.Var((*binaryFlags)(&o.binaries), "binary", "ARCH=PATH: the static linux tollgate for a GOARCH; repeat it for a multi-arch image index")
	flag.StringVar(&o.ca, "ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle for rediss:// and the like; empty ships none")
	flag.StringVar(&o.version, "version", "", "the image's version label (the chart's appVersion)")
	flag.StringVar(&o.ref, "ref", "", "the image's name, REPO:TAG, recorded in the layout's index")
	flag.StringVar(&o.out, "out", "bin/tollgate-image.tar", "where the oci-archive goes")
	flag.StringVar(&push, "push", "", "instead of building, push this oci-archive to the name it records (credentials: IMAGE_REGISTRY_USER and IMAGE_REGISTRY_PASSWORD, else the docker config)")
	flag.Parse()
	if push != "" {
		ref, digest, err := pushArchive(push, registryAuth(os.LookupEnv))
		if err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
		fmt.Printf("image: pushed %s (%s)\n", ref, digest)
		return
	}
	if err := build(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("image: wrote %s (%s, linux/%s)\n", o.out, o.ref, strings.Join(archs(o.binaries), ","))
}

func archs(bs []binary) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.arch
	}
	return out
}

// build writes the image o describes: an image for one binary, an image
// index of one image per architecture for more.
func build(o options) error {
	if len(o.binaries) == 0 || o.version == "" {
		return errors.New("-binary and -version are required")
	}
	var ca []byte
	if o.ca != "" {
		var err error
		if ca, err = os.ReadFile(o.ca); err != nil {
			return fmt.Errorf("-ca: %w", err)
		}
	}
	var adds []mutate.IndexAddendum
	for _, b := range o.binaries {
		bin, err := os.ReadFile(b.path)
		if err != nil {
			return err
		}
		files := []file{{path: binPath, mode: 0o755, data: bin}}
		if ca != nil {
			files = append(files, file{path: caPath, mode: 0o644, data: ca})
		}
		img, err := image(files, o.version, b.arch)
		if err != nil {
			return err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: b.arch}}})
	}
	if len(adds) == 1 {
		return writeArchive(adds[0].Add, o.ref, o.out)
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return writeArchive(idx, o.ref, o.out)
}

type file struct {
	path string
	mode int64
	data []byte
}

// epoch is every file's and the image's time: the same inputs give the
// same image.
var epoch = time.Unix(0, 0).UTC()

// image is one layer of files on an empty base, with the config.
func image(files []file, version, arch string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		// Parent directories first, as a tar for a root file system has them.
		for d := filepath.Dir(f.path); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range sortedDirs(dirs) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.path[1:], Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: epoch}
	cf.Config = v1.Config{
		Entrypoint:   []string{binPath},
		Cmd:          []string{"serve"},
		User:         user,
		WorkingDir:   "/",
		ExposedPorts: map[string]struct{}{grpcPort: {}, adminPort: {}},
		Healthcheck:  healthcheck.DeepCopy(),
		Env:          []string{"SSL_CERT_FILE=" + caPath},
		Labels: map[string]string{
			"org.opencontainers.image.source":  source,
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.title":   "tollgate",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// sortedDirs are m's paths in order: a parent sorts before its children.
func sortedDirs(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// writeArchive writes img (a v1.Image or v1.ImageIndex) as an OCI image
// layout, tarred, to out.
func writeArchive(img mutate.Appendable, ref, out string) error {
	dir, err := os.MkdirTemp("", "tollgate-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{refName: ref}))
	}
	switch img := img.(type) {
	case v1.ImageIndex:
		err = p.AppendIndex(img, opts...)
	case v1.Image:
		err = p.AppendImage(img, opts...)
	default:
		err = fmt.Errorf("cannot write a %T", img)
	}
	if err != nil {
		return err
	}
	return tarDir(dir, out)
}

// tarDir writes dir's files, relative to it, into the tar file out.
func tarDir(dir, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname = filepath.ToSlash(rel), epoch, 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err2 := tw.Close(); err == nil {
		err = err2
	}
	if err2 := f.Close(); err == nil {
		err = err2
	}
	return err
}
