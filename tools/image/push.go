package main

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// pushArchive sends the oci-archive at path, an image or an image index,
// to the name its layout records (`make image` records the chart's), so
// what is pushed is what was built and checked under that name. It
// returns the name and the pushed manifest's digest.
func pushArchive(path string, opts ...remote.Option) (string, string, error) {
	dir, err := os.MkdirTemp("", "tollgate-image-push")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(dir)
	if err := untar(path, dir); err != nil {
		return "", "", err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return "", "", fmt.Errorf("%s: not an OCI image layout: %w", path, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return "", "", err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return "", "", err
	}
	if len(im.Manifests) != 1 {
		return "", "", fmt.Errorf("%s: %d manifests in the layout, want 1", path, len(im.Manifests))
	}
	desc := im.Manifests[0]
	ref, err := name.ParseReference(desc.Annotations[refName], name.StrictValidation)
	if err != nil {
		return "", "", fmt.Errorf("%s: the recorded name %q: %w", path, desc.Annotations[refName], err)
	}
	if desc.MediaType.IsIndex() {
		ii, err := idx.ImageIndex(desc.Digest)
		if err != nil {
			return "", "", err
		}
		err = remote.WriteIndex(ref, ii, opts...)
		return ref.String(), desc.Digest.String(), err
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		return "", "", err
	}
	err = remote.Write(ref, img, opts...)
	return ref.String(), desc.Digest.String(), err
}

// registryAuth is IMAGE_REGISTRY_USER and IMAGE_REGISTRY_PASSWORD when
// the password is set (the release workflow's GITHUB_TOKEN), else what
// `docker login` or `skopeo login` stored.
func registryAuth(lookup func(string) (string, bool)) remote.Option {
	if pw, ok := lookup("IMAGE_REGISTRY_PASSWORD"); ok && pw != "" {
		user, _ := lookup("IMAGE_REGISTRY_USER")
		return remote.WithAuth(&authn.Basic{Username: user, Password: pw})
	}
	return remote.WithAuthFromKeychain(authn.DefaultKeychain)
}
