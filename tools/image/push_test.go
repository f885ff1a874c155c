package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestPush pushes a multi-arch archive to an in-process registry that
// wants a password, as ghcr.io does, and reads it back by its name.
func TestPush(t *testing.T) {
	t.Parallel()
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/tollgate-dev/tollgate:9.8.7"
	archive := multiArch(t, ref)
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}

	if _, _, err := pushArchive(archive, registryAuth(env(map[string]string{"IMAGE_REGISTRY_USER": "ci", "IMAGE_REGISTRY_PASSWORD": "wrong"}))); err == nil {
		t.Fatal("push with a wrong password succeeded")
	}
	got, digest, err := pushArchive(archive, registryAuth(env(map[string]string{"IMAGE_REGISTRY_USER": "ci", "IMAGE_REGISTRY_PASSWORD": "s3cret"})))
	if err != nil {
		t.Fatal(err)
	}
	if got != ref {
		t.Errorf("pushed to %q, want the recorded %q", got, ref)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(r, remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil || d.String() != digest {
		t.Errorf("the registry's %s has digest %v (%v), want the archive's %s", ref, d, err, digest)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, desc := range m.Manifests {
		platforms = append(platforms, desc.Platform.String())
	}
	if strings.Join(platforms, " ") != "linux/amd64 linux/arm64" {
		t.Errorf("platforms %q, want linux/amd64 linux/arm64", platforms)
	}
}

// TestPushNeedsAName refuses an archive built without -ref: it would
// have nowhere to go.
func TestPushNeedsAName(t *testing.T) {
	t.Parallel()
	if _, _, err := pushArchive(multiArch(t, "")); err == nil || !strings.Contains(err.Error(), "recorded name") {
		t.Errorf("push of an unnamed archive = %v, want a name error", err)
	}
}
