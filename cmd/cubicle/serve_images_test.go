package main

import (
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// A template's store reference becomes what a node asks the registry for:
// the repository and the manifest digest of the very image stored, with or
// without the registry host BuildKit pushed through.
func TestImageDigestOfStoredTemplate(t *testing.T) {
	imgs, err := image.Open(filepath.Join(t.TempDir(), "oci"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := random.Layer(64, "application/vnd.oci.image.layer.v1.tar+gzip")
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := imgs.Put("cubicle/tpl:b1", img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	ts := &templateStack{images: imgs}
	want := node.Image{Name: "cubicle/tpl", Digest: d.String()}
	for _, ref := range []string{"cubicle/tpl:b1", "127.0.0.1:5000/cubicle/tpl:b1"} {
		if got, err := ts.imageDigest(ref); err != nil || got != want {
			t.Fatalf("%s: %+v %v, want %+v", ref, got, err, want)
		}
	}
	if _, err := ts.imageDigest("cubicle/tpl:gone"); err == nil {
		t.Fatal("an image the store lacks resolved")
	}
}
