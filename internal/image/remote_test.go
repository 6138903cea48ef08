package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/snapstore/snapstoretest"
)

// openShared opens a store in a fresh directory on the shared bucket, as
// a replica's serve --image-store does.
func openShared(t *testing.T, remote Remote) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "oci"))
	must(t, err)
	s.SetRemote(remote)
	return s
}

// blobsOf is every blob an image reaches: manifest, config, layers.
func blobsOf(t *testing.T, s *Store, ref string) []v1.Hash {
	t.Helper()
	d, err := s.Resolve(ref)
	must(t, err)
	img, err := s.Get(ref)
	must(t, err)
	m, err := img.Manifest()
	must(t, err)
	out := []v1.Hash{d.Digest, m.Config.Digest}
	for _, l := range m.Layers {
		out = append(out, l.Digest)
	}
	return out
}

func objectBytes(t *testing.T, remote *snapstore.Store, key string) ([]byte, error) {
	t.Helper()
	rc, err := remote.GetObject(context.Background(), key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// An import on one replica is in the shared store before it returns, and
// another replica (a fresh directory) resolves the tag, serves its blobs
// to nodes and unpacks it, reading each blob through once and verifying
// it; after its directory is wiped it reads them through again.
func TestRemoteWriteThroughReadThrough(t *testing.T) {
	remote, _ := snapstoretest.New(t)
	a := openShared(t, remote)
	must(t, a.ImportRootfs("cubicle/tpl:bld1", makeTree(t)))
	blobs := blobsOf(t, a, "cubicle/tpl:bld1")
	for _, h := range blobs {
		got, err := objectBytes(t, remote, blobKey(h))
		if err != nil {
			t.Fatalf("blob %s not written through: %v", h, err)
		}
		local, err := os.ReadFile(a.blobPath(h))
		must(t, err)
		if !bytes.Equal(got, local) {
			t.Fatalf("blob %s differs in the shared store", h)
		}
	}
	if _, err := objectBytes(t, remote, tagKey("cubicle/tpl:bld1")); err != nil {
		t.Fatalf("tag not written through: %v", err)
	}

	// Replica B never saw the import.
	bDir := filepath.Join(t.TempDir(), "oci")
	b, err := Open(bDir)
	must(t, err)
	b.SetRemote(remote)
	d, err := b.Resolve("cubicle/tpl:bld1")
	if err != nil || d.Digest != blobs[0] {
		t.Fatalf("resolve through the shared store: %+v %v", d, err)
	}
	// A node pulls the manifest and a layer by digest from B's registry.
	srv := httptest.NewServer(NewRegistry(b))
	t.Cleanup(srv.Close)
	for p, h := range map[string]v1.Hash{"/v2/cubicle/tpl/manifests/" + blobs[0].String(): blobs[0], "/v2/cubicle/tpl/blobs/" + blobs[2].String(): blobs[2]} {
		resp, err := http.Get(srv.URL + p)
		must(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want, _ := os.ReadFile(a.blobPath(h))
		if resp.StatusCode != http.StatusOK || !bytes.Equal(body, want) {
			t.Fatalf("GET %s on replica B: %d (%d bytes)", p, resp.StatusCode, len(body))
		}
	}
	dest := filepath.Join(t.TempDir(), "rootfs")
	must(t, b.Unpack("cubicle/tpl:bld1", dest))
	if got, err := os.ReadFile(filepath.Join(dest, "etc", "hostname")); err != nil || string(got) != "cubicle\n" {
		t.Fatalf("unpacked on replica B: %q %v", got, err)
	}
	// The manifest and the layers (an unpack reads no config) are cached.
	for _, h := range append([]v1.Hash{blobs[0]}, blobs[2:]...) {
		if _, err := os.Stat(b.blobPath(h)); err != nil {
			t.Fatalf("blob %s not cached on replica B: %v", h, err)
		}
	}

	// B restarts with an empty data dir: everything reads through again.
	must(t, os.RemoveAll(bDir))
	b, err = Open(bDir)
	must(t, err)
	b.SetRemote(remote)
	dest2 := filepath.Join(t.TempDir(), "rootfs")
	must(t, b.Unpack("cubicle/tpl:bld1", dest2))
	if _, err := os.Stat(filepath.Join(dest2, "bin", "tool")); err != nil {
		t.Fatalf("unpacked after a wipe: %v", err)
	}

	// Without the shared store, B's wiped directory knows nothing: the
	// read-through is what made it work.
	c, err := Open(filepath.Join(t.TempDir(), "oci"))
	must(t, err)
	if _, err := c.Resolve("cubicle/tpl:bld1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a store without the remote resolved the tag: %v", err)
	}
}

// An object replaced in the bucket is refused by its digest: nothing of
// it is kept locally, an unpack fails with ErrDigestMismatch, and the
// registry does not serve it to a node.
func TestRemoteReplacedObjectRefused(t *testing.T) {
	remote, _ := snapstoretest.New(t)
	a := openShared(t, remote)
	must(t, a.ImportRootfs("cubicle/tpl:bld1", makeTree(t)))
	blobs := blobsOf(t, a, "cubicle/tpl:bld1")
	layer := blobs[2]
	evil := []byte("not the layer")
	must(t, remote.PutObject(context.Background(), blobKey(layer), bytes.NewReader(evil), int64(len(evil))))

	b := openShared(t, remote)
	err := b.Unpack("cubicle/tpl:bld1", filepath.Join(t.TempDir(), "rootfs"))
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("unpack of a replaced layer: %v, want ErrDigestMismatch", err)
	}
	if _, err := os.Stat(b.blobPath(layer)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a replaced layer was kept locally: %v", err)
	}
	srv := httptest.NewServer(NewRegistry(b))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/v2/cubicle/tpl/blobs/" + layer.String())
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("the registry served a replaced layer")
	}
	// The replica that wrote it still has the true bytes locally.
	must(t, a.Unpack("cubicle/tpl:bld1", filepath.Join(t.TempDir(), "rootfs")))
}

// A store that held images before it had a remote pushes every blob a tag
// reaches when it tags again (a replica moving onto --image-store); a
// delete drops the tag for every replica and leaves the blobs.
func TestRemoteTagPushesTreeAndDeleteKeepsBlobs(t *testing.T) {
	remote, _ := snapstoretest.New(t)
	dir := filepath.Join(t.TempDir(), "oci")
	a, err := Open(dir)
	must(t, err)
	must(t, a.ImportRootfs("cubicle/old:1", makeTree(t)))
	blobs := blobsOf(t, a, "cubicle/old:1")
	a.SetRemote(remote)
	img, err := a.Get("cubicle/old:1")
	must(t, err)
	must(t, a.Put("cubicle/old:2", img))
	for _, h := range blobs {
		if _, err := objectBytes(t, remote, blobKey(h)); err != nil {
			t.Fatalf("blob %s not pushed with the tag: %v", h, err)
		}
	}
	b := openShared(t, remote)
	must(t, b.Unpack("cubicle/old:2", filepath.Join(t.TempDir(), "rootfs")))

	must(t, b.Delete("cubicle/old:2"))
	if _, err := objectBytes(t, remote, tagKey("cubicle/old:2")); !errors.Is(err, snapstore.ErrObjectNotFound) {
		t.Fatalf("tag left in the shared store: %v", err)
	}
	c := openShared(t, remote)
	if _, err := c.Resolve("cubicle/old:2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a deleted tag resolves on another replica: %v", err)
	}
	for _, h := range blobs {
		if _, err := objectBytes(t, remote, blobKey(h)); err != nil {
			t.Fatalf("delete removed shared blob %s: %v", h, err)
		}
	}
	if err := c.Delete("cubicle/never:1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of an unknown tag: %v", err)
	}
}

// A build's credentials granted on one replica open the registry of
// another that shares the remote (a builder node's push may land there),
// until revoked; the remote keeps only the password's hash.
func TestRemoteBuildGrantAcrossReplicas(t *testing.T) {
	remote, _ := snapstoretest.New(t)
	a, b := NewRegistry(openShared(t, remote)), NewRegistry(openShared(t, remote))
	a.RequireBasicAuth("cubicle", "a-secret")
	b.RequireBasicAuth("cubicle", "b-secret")
	user, pass, revoke, err := a.GrantBuild("cubicle/tpl", "b1", "cubicle/parent")
	must(t, err)
	try := func(r *Registry, u, p string) int {
		return tryUpload(r, "cubicle/tpl", u, p)
	}
	// So do the repositories whose tags it may resolve.
	for repo, denied := range map[string]bool{"cubicle/other": true, "cubicle/parent": false, "cubicle/tpl": false} {
		req := httptest.NewRequest(http.MethodGet, "/v2/"+repo+"/manifests/latest", nil)
		req.SetBasicAuth(user, pass)
		rec := httptest.NewRecorder()
		b.ServeHTTP(rec, req)
		if (rec.Code == http.StatusForbidden) != denied {
			t.Fatalf("grant of replica A resolving a tag of %s on replica B: %d", repo, rec.Code)
		}
	}
	// The grant's scope travels with it: on replica B too it writes only
	// the build's own repository.
	if c := tryUpload(b, "cubicle/other", user, pass); c != http.StatusForbidden {
		t.Fatalf("grant of replica A writing another repository on replica B: %d", c)
	}
	if c := try(b, user, pass); c != http.StatusAccepted {
		t.Fatalf("grant of replica A on replica B: %d", c)
	}
	if c := try(b, user, pass+"x"); c != http.StatusUnauthorized {
		t.Fatalf("wrong password on replica B: %d", c)
	}
	raw, err := objectBytes(t, remote, grantKey(user))
	must(t, err)
	if bytes.Contains(raw, []byte(pass)) {
		t.Fatal("the remote holds the build's password")
	}
	revoke()
	if c := try(b, user, pass); c != http.StatusUnauthorized {
		t.Fatalf("revoked grant on replica B: %d", c)
	}
	if c := try(a, user, pass); c != http.StatusUnauthorized {
		t.Fatalf("revoked grant on replica A: %d", c)
	}
}

// tryUpload starts a blob upload to repo on r as u:p and returns the status.
func tryUpload(r *Registry, repo, u, p string) int {
	req := httptest.NewRequest(http.MethodPost, "/v2/"+repo+"/blobs/uploads/", nil)
	req.SetBasicAuth(u, p)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	return rec.Code
}

// A push's POST and its PUT may reach different replicas behind a
// balancer: with a shared store, a PUT carrying the whole blob finishes an
// upload this replica did not begin, and only if the body hashes to the
// digest. Without one, an unknown upload is still 404.
func TestRemoteUploadBegunOnAnotherReplica(t *testing.T) {
	remote, _ := snapstoretest.New(t)
	a, b := NewRegistry(openShared(t, remote)), NewRegistry(openShared(t, remote))
	do := func(r *Registry, method, path string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		return rec
	}
	post := do(a, http.MethodPost, "/v2/cubicle/tpl/blobs/uploads/", nil)
	if post.Code != http.StatusAccepted {
		t.Fatalf("POST on replica A: %d", post.Code)
	}
	loc := post.Header().Get("Location")
	blob := []byte("a layer pushed through the balancer")
	sum := sha256.Sum256(blob)
	dgst := "sha256:" + hex.EncodeToString(sum[:])
	if rec := do(b, http.MethodPut, loc+"?digest="+dgst, []byte("the wrong bytes")); rec.Code != http.StatusBadRequest {
		t.Fatalf("PUT of bytes that do not hash to the digest on replica B: %d", rec.Code)
	}
	if rec := do(b, http.MethodPut, loc+"?digest="+dgst, blob); rec.Code != http.StatusCreated {
		t.Fatalf("PUT on replica B of an upload begun on A: %d %s", rec.Code, rec.Body)
	}
	h, _ := v1.NewHash(dgst)
	if got, err := objectBytes(t, remote, blobKey(h)); err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("blob not in the shared store: %v", err)
	}
	if rec := do(a, http.MethodGet, "/v2/cubicle/tpl/blobs/"+dgst, nil); rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), blob) {
		t.Fatalf("the blob through replica A: %d", rec.Code)
	}
	ls, err := Open(filepath.Join(t.TempDir(), "oci"))
	must(t, err)
	local := NewRegistry(ls)
	if rec := do(local, http.MethodPut, loc+"?digest="+dgst, blob); rec.Code != http.StatusNotFound {
		t.Fatalf("unknown upload without a shared store: %d", rec.Code)
	}
}
