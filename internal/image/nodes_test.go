package image

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
)

// The node view refuses, before routing, everything the registry would
// route as a listing: a tags list whose repository has a "blobs"
// component (so the path also contains "/blobs/") is refused like any
// other, manifests are by digest only, and a request without a node
// identity is 401 whatever it asks.
func TestForNodesRefusesListings(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("cubicle/blobs/x:v1", img); err != nil {
		t.Fatal(err)
	}
	dgst, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	blob, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(s)
	node := ForNodes(reg, func(*http.Request) (string, error) { return "n1", nil })
	stranger := ForNodes(reg, func(*http.Request) (string, error) { return "", errors.New("no certificate") })
	get := func(h http.Handler, method, path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code
	}
	for _, c := range []struct {
		h      http.Handler
		method string
		path   string
		want   int
	}{
		{node, http.MethodGet, "/v2/cubicle/blobs/x/tags/list", http.StatusForbidden},
		{node, http.MethodGet, "/v2/cubicle/blobs/x/manifests/v1", http.StatusForbidden},
		{node, http.MethodGet, "/v2/_catalog", http.StatusForbidden},
		{node, http.MethodPost, "/v2/cubicle/blobs/x/blobs/uploads/", http.StatusMethodNotAllowed},
		{node, http.MethodGet, "/v2/cubicle/blobs/x/manifests/" + dgst.String(), http.StatusOK},
		{node, http.MethodGet, "/v2/cubicle/blobs/x/blobs/" + blob.String(), http.StatusOK},
		{stranger, http.MethodGet, "/v2/cubicle/blobs/x/manifests/" + dgst.String(), http.StatusUnauthorized},
	} {
		if got := get(c.h, c.method, c.path); got != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got, c.want)
		}
	}
}
