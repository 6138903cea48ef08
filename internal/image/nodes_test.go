package image

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// storeWithRandomImage opens a store in a temp dir holding one random
// image under each of names, and returns it, the image and its digest.
func storeWithRandomImage(t *testing.T, names ...string) (*Store, v1.Image, v1.Hash) {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if err := s.Put(name, img); err != nil {
			t.Fatal(err)
		}
	}
	dgst, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return s, img, dgst
}

// The node view refuses, before routing, everything the registry would
// route as a listing: a tags list whose repository has a "blobs"
// component (so the path also contains "/blobs/") is refused like any
// other, manifests are by digest only, and a request without a node
// identity is 401 whatever it asks.
func TestForNodesRefusesListings(t *testing.T) {
	s, img, dgst := storeWithRandomImage(t, "cubicle/blobs/x:v1")
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

// ForCluster: a builder node with a build's credentials (or the
// registry's own) pushes and reads by name, until the build's are revoked; without them it is challenged (401); a node that is not a
// builder is refused a push (403) and refused with the credentials too
// (403); reads by digest stay open to both.
func TestForClusterBuilders(t *testing.T) {
	s, _, dgst := storeWithRandomImage(t, "cubicle/tpl:v1")
	reg := NewRegistry(s)
	reg.RequireBasicAuth("cubicle", "build-secret")
	h := ForCluster(reg, func(r *http.Request) (string, error) { return r.Header.Get("X-Node"), nil },
		func(_ *http.Request, id string) (bool, error) { return id == "builder-1", nil })
	do := func(nodeID, method, path, user, pass string) (int, http.Header) {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("X-Node", nodeID)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Header()
	}
	upload := "/v2/cubicle/tpl/blobs/uploads/"
	byTag := "/v2/cubicle/tpl/manifests/v1"
	byDigest := "/v2/cubicle/tpl/manifests/" + dgst.String()
	bu, bp, revoke, err := reg.GrantBuild("cubicle/tpl", "v2")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		node, method, path, user, pass string
		want                           int
	}{
		{"builder-1", http.MethodPost, upload, bu, bp, http.StatusAccepted},
		{"builder-1", http.MethodPost, upload, bu, "build-secret", http.StatusUnauthorized},
		{"node-2", http.MethodPost, upload, bu, bp, http.StatusForbidden},
		{"builder-1", http.MethodPost, upload, "cubicle", "build-secret", http.StatusAccepted},
		{"builder-1", http.MethodGet, byTag, "cubicle", "build-secret", http.StatusOK},
		{"builder-1", http.MethodPost, upload, "", "", http.StatusUnauthorized},
		{"builder-1", http.MethodGet, byTag, "", "", http.StatusUnauthorized},
		{"builder-1", http.MethodPost, upload, "cubicle", "guess", http.StatusUnauthorized},
		{"builder-1", http.MethodGet, byDigest, "", "", http.StatusOK},
		{"node-2", http.MethodPost, upload, "", "", http.StatusForbidden},
		{"node-2", http.MethodPost, upload, "cubicle", "build-secret", http.StatusForbidden},
		{"node-2", http.MethodGet, byTag, "cubicle", "build-secret", http.StatusForbidden},
		{"node-2", http.MethodGet, byTag, "", "", http.StatusForbidden},
		{"node-2", http.MethodGet, byDigest, "", "", http.StatusOK},
	} {
		code, hdr := do(c.node, c.method, c.path, c.user, c.pass)
		if code != c.want {
			t.Errorf("%s %s %s (user %q): %d, want %d", c.node, c.method, c.path, c.user, code, c.want)
		}
		if code == http.StatusUnauthorized && c.user == "" && hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("%s %s %s: 401 without a challenge", c.node, c.method, c.path)
		}
	}
	// A build's credentials end with the build.
	revoke()
	if code, _ := do("builder-1", http.MethodPost, upload, bu, bp); code != http.StatusUnauthorized {
		t.Fatalf("a push with a revoked build's credentials: %d, want 401", code)
	}
}

// A build's credentials write only the build's own image: a builder node
// that keeps them while its build runs cannot retag, overwrite or delete
// another template's image (which sandboxes of another team boot by
// that tag), nor its own template's other builds, nor resolve another
// template's tags; it still reads what its FROM lines name, and anything
// by digest.
func TestGrantBuildScope(t *testing.T) {
	s, victim, vd := storeWithRandomImage(t, "cubicle/victim:b1", "cubicle/mine:old")
	raw, err := victim.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	mt, _ := victim.MediaType()
	reg := NewRegistry(s)
	reg.RequireBasicAuth("cubicle", "registry-secret")
	h := ForCluster(reg, func(*http.Request) (string, error) { return "builder-1", nil },
		func(*http.Request, string) (bool, error) { return true, nil })
	if err := s.Put("cubicle/parent:b7", victim); err != nil {
		t.Fatal(err)
	}
	bu, bp, revoke, err := reg.GrantBuild("cubicle/mine", "b2", "cubicle/parent")
	if err != nil {
		t.Fatal(err)
	}
	defer revoke()
	do := func(method, path string, body []byte) int {
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", string(mt))
		req.SetBasicAuth(bu, bp)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, c := range []struct {
		method, path string
		body         []byte
		want         int
	}{
		{http.MethodPut, "/v2/cubicle/victim/manifests/b1", raw, http.StatusForbidden},
		{http.MethodDelete, "/v2/cubicle/victim/manifests/b1", nil, http.StatusForbidden},
		{http.MethodPost, "/v2/cubicle/victim/blobs/uploads/", nil, http.StatusForbidden},
		{http.MethodPut, "/v2/cubicle/mine/manifests/old", raw, http.StatusForbidden},
		{http.MethodDelete, "/v2/cubicle/mine/manifests/b2", nil, http.StatusForbidden},
		{http.MethodGet, "/v2/cubicle/victim/manifests/b1", nil, http.StatusForbidden},
		{http.MethodHead, "/v2/cubicle/victim/manifests/b1", nil, http.StatusForbidden},
		{http.MethodGet, "/v2/cubicle/victim/tags/list", nil, http.StatusForbidden},
		{http.MethodGet, "/v2/cubicle/victim/manifests/" + vd.String(), nil, http.StatusOK},
		{http.MethodGet, "/v2/cubicle/parent/manifests/b7", nil, http.StatusOK},
		{http.MethodGet, "/v2/cubicle/parent/tags/list", nil, http.StatusOK},
		{http.MethodGet, "/v2/cubicle/mine/manifests/old", nil, http.StatusOK},
		{http.MethodPost, "/v2/cubicle/mine/blobs/uploads/", nil, http.StatusAccepted},
		{http.MethodPut, "/v2/cubicle/mine/manifests/" + vd.String(), raw, http.StatusCreated},
		{http.MethodPut, "/v2/cubicle/mine/manifests/b2", raw, http.StatusCreated},
	} {
		if got := do(c.method, c.path, c.body); got != c.want {
			t.Errorf("%s %s with a build's credentials: %d, want %d", c.method, c.path, got, c.want)
		}
	}
	if d, err := s.Resolve("cubicle/victim:b1"); err != nil || d.Digest != vd {
		t.Fatalf("the other template's image after the builder's requests: %v %v", d.Digest, err)
	}
}
