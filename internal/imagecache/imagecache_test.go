package imagecache_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/builtinimage"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/imagecache"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc/nodegrpctest"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// TestMain removes the agent binary localnode builds.
func TestMain(m *testing.M) { localnode.Main(m) }

// cluster is a control plane's registry served to nodes the way serve
// does: TLS with the control plane's certificate, client certificates
// requested and checked by the cluster CA (image.ForNodes).
type cluster struct {
	pki      *pkitest.PKI
	ca       *clusterpki.CA
	store    *image.Store
	addr     string
	requests atomic.Int64
	// tamper, when set, rewrites what the registry answers.
	tamper atomic.Pointer[func(path string, body []byte) []byte]
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	pki := pkitest.New(t)
	st, ca := pki.Store, pki.CA
	imgs, err := image.Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{pki: pki, ca: ca, store: imgs}
	reg := image.NewRegistry(imgs)
	// BuildKit's password guards the loopback view; nodes never hold it.
	reg.RequireBasicAuth("cubicle", "buildkit-only")
	nodes := image.ForNodes(reg, func(r *http.Request) (string, error) { return ca.RequestNode(r, time.Now(), st) })
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.requests.Add(1)
		if f := c.tamper.Load(); f != nil {
			rec := &recorder{header: http.Header{}, code: 200}
			nodes.ServeHTTP(rec, r)
			body := (*f)(r.URL.Path, rec.body.Bytes())
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.Header().Del("Content-Length")
			w.WriteHeader(rec.code)
			w.Write(body)
			return
		}
		nodes.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pki.ControlPlane}, ClientAuth: tls.RequestClientCert,
	}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	c.addr = ln.Addr().String()
	return c
}

type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(c int)           { r.code = c }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

// nodeTLS is node id's client configuration: a key made here, a
// certificate from the CA, the CA as roots, the control plane's name.
func (c *cluster) nodeTLS(t *testing.T, id string) *tls.Config {
	t.Helper()
	cert := c.pki.Node(t, id)
	cfg := c.anonTLS()
	cfg.Certificates = []tls.Certificate{cert}
	return cfg
}

// anonTLS trusts the control plane but presents no certificate.
func (c *cluster) anonTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: c.pki.Roots(), ServerName: clusterpki.JoinServerName}
}

// push stores a two-layer image (the second replaces a file of the first
// and whites out another) and returns its reference by digest.
func (c *cluster) push(t *testing.T, repo string) (imagecache.Ref, v1.Image) {
	t.Helper()
	l1 := layer(t, map[string]string{"etc/hello": "one", "etc/gone": "x", "bin/tool": "#!/bin/sh\n"})
	l2 := layer(t, map[string]string{"etc/hello": "two", "etc/.wh.gone": ""})
	img, err := mutate.AppendLayers(empty.Image, l1, l2)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.store.Put(repo+":build-1", img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return imagecache.Ref{Repository: repo, Digest: d.String()}, img
}

func layer(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, dir := range []string{"etc/", "bin/"} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755})
	}
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newCache(t *testing.T, c *cluster, cfg *tls.Config) (*imagecache.Cache, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cache")
	cache, err := imagecache.New(imagecache.Config{Registry: c.addr, TLS: cfg, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return cache, dir
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A node pulls a template's image by digest with its certificate, unpacks
// it (whiteouts applied), lists it as cached, and a second use makes no
// request at all.
func TestPullUnpackAndCacheHit(t *testing.T) {
	testenv.RequireRoot(t, "unpacking keeps owners and chroots")
	c := newCluster(t)
	ref, _ := c.push(t, "templates/tpl-a")
	cache, _ := newCache(t, c, c.nodeTLS(t, "node-a"))
	ctx := context.Background()

	if got, err := cache.Cached(); err != nil || len(got) != 0 {
		t.Fatalf("empty cache lists %v, %v", got, err)
	}
	root, err := cache.Rootfs(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "etc/hello")); got != "two" {
		t.Fatalf("etc/hello = %q, want the upper layer's", got)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("whited-out etc/gone: %v", err)
	}
	if got, err := cache.Cached(); err != nil || len(got) != 1 || got[0] != ref {
		t.Fatalf("Cached = %v, %v; want [%v]", got, err, ref)
	}

	before := c.requests.Load()
	again, err := cache.Rootfs(ctx, ref)
	if err != nil || again != root {
		t.Fatalf("second Rootfs = %q, %v; want %q", again, err, root)
	}
	if n := c.requests.Load() - before; n != 0 {
		t.Fatalf("a cache hit made %d registry requests", n)
	}
	// A restarted node (a new Cache over the same directory) still has it.
	cache2, err := imagecache.New(imagecache.Config{Registry: c.addr, TLS: c.nodeTLS(t, "node-a"), Dir: filepath.Dir(filepath.Dir(root))})
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := cache2.Rootfs(ctx, ref); err != nil || r2 != root || c.requests.Load() != before {
		t.Fatalf("after restart: %q, %v, %d requests", r2, err, c.requests.Load()-before)
	}

	if err := cache.Remove(ref); err != nil {
		t.Fatal(err)
	}
	if got, _ := cache.Cached(); len(got) != 0 {
		t.Fatalf("after Remove: %v", got)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("rootfs left after Remove: %v", err)
	}
}

// What the registry sends must be what the digest names: a changed blob or
// a manifest other than the one asked for is refused, and nothing of the
// pull is kept.
func TestDigestMismatchRefused(t *testing.T) {
	testenv.RequireRoot(t, "unpacking keeps owners and chroots")
	c := newCluster(t)
	ref, img := c.push(t, "templates/tpl-b")
	cache, dir := newCache(t, c, c.nodeTLS(t, "node-b"))
	ctx := context.Background()
	layers, _ := img.Layers()
	blob, _ := layers[0].Digest()

	cases := map[string]func(path string, body []byte) []byte{
		"blob": func(path string, body []byte) []byte {
			if strings.HasSuffix(path, "/blobs/"+blob.String()) && len(body) > 0 {
				body = bytes.Clone(body)
				body[len(body)/2] ^= 0xff
			}
			return body
		},
		"blob-truncated": func(path string, body []byte) []byte {
			if strings.HasSuffix(path, "/blobs/"+blob.String()) {
				return body[:len(body)-1]
			}
			return body
		},
		"manifest": func(path string, body []byte) []byte {
			if strings.Contains(path, "/manifests/") {
				return append(bytes.Clone(body), ' ')
			}
			return body
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			c.tamper.Store(&f)
			defer c.tamper.Store(nil)
			_, err := cache.Rootfs(ctx, ref)
			if !errors.Is(err, imagecache.ErrDigestMismatch) {
				t.Fatalf("tampered %s: %v, want ErrDigestMismatch", name, err)
			}
			if got, _ := cache.Cached(); len(got) != 0 {
				t.Fatalf("a refused image is cached: %v", got)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("a refused pull left %d entries in the cache dir", len(ents))
			}
		})
	}
	// Untampered, the same pull succeeds.
	if _, err := cache.Rootfs(ctx, ref); err != nil {
		t.Fatal(err)
	}
}

// The registry answers nodes only: read-only, by digest; a client without a
// node certificate (none, or the control plane's own) gets 401.
func TestRegistryForNodesOnly(t *testing.T) {
	c := newCluster(t)
	ref, img := c.push(t, "templates/tpl-d")
	layers, _ := img.Layers()
	blob, _ := layers[0].Digest()
	cp, err := c.ca.IssueControlPlane(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cpTLS := c.anonTLS()
	cpTLS.Certificates = []tls.Certificate{*cp}
	do := func(cfg *tls.Config, method, path string, body string) int {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: cfg}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(method, "https://"+c.addr+path, strings.NewReader(body))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	node := c.nodeTLS(t, "node-d")
	manifest := "/v2/" + ref.Repository + "/manifests/" + ref.Digest
	for _, tc := range []struct {
		name         string
		cfg          *tls.Config
		method, path string
		want         int
	}{
		{"no certificate", c.anonTLS(), "GET", manifest, 401},
		{"no certificate, ping", c.anonTLS(), "GET", "/v2/", 401},
		{"control plane certificate", cpTLS, "GET", manifest, 401},
		{"node: ping", node, "GET", "/v2/", 200},
		{"node: manifest by digest", node, "GET", manifest, 200},
		{"node: blob", node, "GET", "/v2/" + ref.Repository + "/blobs/" + blob.String(), 200},
		{"node: manifest by tag", node, "GET", "/v2/" + ref.Repository + "/manifests/build-1", 403},
		{"node: tags list", node, "GET", "/v2/" + ref.Repository + "/tags/list", 403},
		{"node: catalog", node, "GET", "/v2/_catalog", 403},
		{"node: start upload", node, "POST", "/v2/" + ref.Repository + "/blobs/uploads/", 405},
		{"node: put manifest", node, "PUT", "/v2/" + ref.Repository + "/manifests/evil", 405},
		{"node: delete manifest", node, "DELETE", manifest, 405},
	} {
		if got := do(tc.cfg, tc.method, tc.path, "{}"); got != tc.want {
			t.Errorf("%s: %s %s = %d, want %d", tc.name, tc.method, tc.path, got, tc.want)
		}
	}
	// The cache without a node certificate cannot pull.
	cache, _ := newCache(t, c, c.anonTLS())
	if _, err := cache.Rootfs(context.Background(), ref); !errors.Is(err, imagecache.ErrPull) {
		t.Fatalf("pull without a node certificate: %v, want ErrPull", err)
	}
	// Nothing was pushed: the store holds the one image.
	if ents, err := c.store.List(); err != nil || len(ents) != 1 {
		t.Fatalf("store after refused pushes: %v, %v", ents, err)
	}
}

// Bad references are refused before any request.
func TestInvalidRef(t *testing.T) {
	c := newCluster(t)
	cache, _ := newCache(t, c, c.nodeTLS(t, "node-e"))
	for _, r := range []imagecache.Ref{
		{Repository: "templates/x", Digest: "latest"},
		{Repository: "templates/x", Digest: "sha256:abc"},
		{Repository: "../etc", Digest: "sha256:" + strings.Repeat("a", 64)},
		{Repository: "", Digest: "sha256:" + strings.Repeat("a", 64)},
	} {
		if _, err := cache.Rootfs(context.Background(), r); !errors.Is(err, imagecache.ErrInvalidRef) {
			t.Errorf("%v: %v, want ErrInvalidRef", r, err)
		}
	}
	if n := c.requests.Load(); n != 0 {
		t.Fatalf("invalid refs made %d requests", n)
	}
}

// A node that does not share the control plane's files (a real Local with
// the cache as its image source, behind the gRPC client) prefetches a
// template's image from the registry, reports it cached, and boots a
// sandbox from the reference with no further request.
func TestNodeBootsPulledImage(t *testing.T) {
	testenv.RequireRoot(t, "runc, netns, unpacking")
	c := newCluster(t)
	if err := c.store.ImportRootfs("cubicle/mini:b1", filepath.Join(localnode.ImagesDir(), "mini", "rootfs")); err != nil {
		t.Fatal(err)
	}
	desc, err := c.store.Resolve("cubicle/mini:b1")
	if err != nil {
		t.Fatal(err)
	}
	im := node.Image{Name: "cubicle/mini", Digest: desc.Digest.String()}
	cache, _ := newCache(t, c, c.nodeTLS(t, "node-f"))
	l, _ := localnode.NewWith(t, &imagecache.Source{Cache: cache, ImagesDir: localnode.ImagesDir()})
	n := nodegrpctest.Pipe(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if err := n.PullImage(ctx, im); err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	info, err := n.Info(ctx)
	if err != nil || !info.Abilities.PullsImages || len(info.Images) != 1 || info.Images[0] != im {
		t.Fatalf("Info after the pull: images %v pulls %v, %v", info.Images, info.Abilities.PullsImages, err)
	}
	before := c.requests.Load()
	req := node.CreateRequest{ID: "pulled" + localnode.RandHex(t, 6), Image: im, EnvdToken: localnode.RandHex(t, 8), DefaultUser: "user",
		CPUCount: 1, MemoryMB: 256, DiskSizeMB: 256, Policy: network.Policy{}}
	if _, err := n.Create(ctx, req); err != nil {
		t.Fatalf("create from the pulled image: %v", err)
	}
	defer n.Delete(context.Background(), req.ID)
	code, err := n.Run(ctx, req.ID, req.EnvdToken, "user", "test -x /bin/bash && id -un | grep -qx user")
	if err != nil || code != 0 {
		t.Fatalf("run in the sandbox: %d %v", code, err)
	}
	if got := c.requests.Load() - before; got != 0 {
		t.Fatalf("a create from a cached image made %d registry requests", got)
	}
	if err := n.Delete(ctx, req.ID); err != nil {
		t.Fatal(err)
	}
	// An image the registry does not have: the create fails, leaving nothing.
	bad := req
	bad.ID, bad.Image.Digest = "missing"+localnode.RandHex(t, 6), "sha256:"+strings.Repeat("0", 64)
	if _, err := n.Create(ctx, bad); !errors.Is(err, imagecache.ErrPull) {
		t.Fatalf("create from an unknown digest: %v, want imagecache.ErrPull", err)
	}
	if sbs, err := n.List(ctx); err != nil || len(sbs) != 0 {
		t.Fatalf("left after a failed pull: %v %v", sbs, err)
	}
}

// The node's source takes its join's control-plane URL: https only, port
// 443 by default, the cache in its own dir and nothing in the images dir.
func TestNewSource(t *testing.T) {
	dir, cacheDir := t.TempDir(), filepath.Join(t.TempDir(), "image-cache")
	cfg := &tls.Config{}
	for url, ok := range map[string]bool{
		"https://cp.example:7443": true, "https://cp.example": true, "https://[::1]:8443/": true,
		"http://cp.example": false, "cp.example:443": false, "https://cp.example/api": false, "https://": false,
	} {
		s, err := imagecache.NewSource(url, cfg, dir, cacheDir)
		if (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", url, err, ok)
		}
		if err == nil && s.ImagesDir != dir {
			t.Errorf("%q: images dir %q", url, s.ImagesDir)
		}
	}
	if fi, err := os.Stat(cacheDir); err != nil || !fi.IsDir() {
		t.Fatalf("cache dir: %v", err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("images dir holds %v (%v), want nothing", ents, err)
	}
}

// A registry that never answers fails the pull once PullTimeout passes,
// rather than holding every create of the image; nothing is kept.
func TestStalledRegistryFailsThePull(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	dir := filepath.Join(t.TempDir(), "cache")
	cache, err := imagecache.New(imagecache.Config{Registry: ln.Addr().String(), TLS: &tls.Config{}, Dir: dir, PullTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ref := imagecache.Ref{Repository: "cubicle/x", Digest: "sha256:" + strings.Repeat("1", 64)}
	if _, err := cache.Rootfs(context.Background(), ref); !errors.Is(err, imagecache.ErrPull) {
		t.Fatalf("stalled registry: %v, want ErrPull", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a failed pull left %d entries", len(ents))
	}
}

// snapshotTree describes every entry under root: type, mode, owner,
// content or link target.
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fi.Sys().(*syscall.Stat_t)
		d := fmt.Sprintf("%v %d:%d", fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			d += " -> " + l
		case fi.Mode().IsRegular():
			d += " " + readFile(t, p)
		}
		if rel != "." {
			out[rel] = d
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A built-in published by the control plane (builtin/<name>@digest): a
// node whose images dir lacks it pulls it and gets the source's tree; a
// node that holds it boots from its own directory and pulls nothing; a
// built-in by name alone that the node lacks is an error that says it is
// neither on the node nor published.
func TestSourceBuiltins(t *testing.T) {
	testenv.RequireRoot(t, "unpacking keeps owners and chroots")
	c := newCluster(t)
	src := t.TempDir()
	root := filepath.Join(src, "mini", "rootfs")
	for p, body := range map[string]string{"etc/hostname": "mini\n", "bin/busybox": "#!elf", "usr/share/x/y": "deep"} {
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("busybox", filepath.Join(root, "bin/sh"))
	os.Chown(filepath.Join(root, "etc/hostname"), 1000, 1001)
	// A file capability (base's ping has cap_net_raw): VFS_CAP_REVISION_2,
	// effective, permitted CAP_NET_RAW (13).
	capNetRaw := []byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := unix.Setxattr(filepath.Join(root, "bin/busybox"), "security.capability", capNetRaw, 0); err != nil {
		t.Fatal(err)
	}
	im, _, err := builtinimage.Publish(c.store, src, "mini")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	cache, _ := newCache(t, c, c.nodeTLS(t, "node-a"))
	empty := &imagecache.Source{Cache: cache, ImagesDir: t.TempDir()}
	if _, err := empty.Layers(ctx, node.Image{Name: "mini"}); !errors.Is(err, imagecache.ErrUnknownImage) ||
		!strings.Contains(err.Error(), "not in this node's images dir") || !strings.Contains(err.Error(), "has not published it") {
		t.Fatalf("a built-in by name on a node without it: %v", err)
	}
	layers, err := empty.Layers(ctx, im)
	if err != nil {
		t.Fatalf("pull %v: %v", im, err)
	}
	if len(layers) != 1 {
		t.Fatalf("layers %v", layers)
	}
	want, got := snapshotTree(t, root), snapshotTree(t, layers[0])
	if len(want) != len(got) {
		t.Fatalf("pulled tree has %d entries, source %d:\n%v\n%v", len(got), len(want), got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: pulled %q, source %q", k, got[k], v)
		}
	}
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(filepath.Join(layers[0], "bin/busybox"), "security.capability", buf); err != nil || !bytes.Equal(buf[:n], capNetRaw) {
		t.Fatalf("the pulled file's capability: %x %v, want %x", buf[:max(n, 0)], err, capNetRaw)
	}
	if cached, _ := empty.Cached(ctx); len(cached) != 1 || cached[0] != im {
		t.Fatalf("Cached = %v, want [%v]", cached, im)
	}

	before := c.requests.Load()
	cache2, _ := newCache(t, c, c.nodeTLS(t, "node-b"))
	local := &imagecache.Source{Cache: cache2, ImagesDir: src}
	layers, err = local.Layers(ctx, im)
	if err != nil || !slices.Equal(layers, template.ImageLayers(src, "mini")) {
		t.Fatalf("a node holding mini: %v %v", layers, err)
	}
	if n := c.requests.Load() - before; n != 0 {
		t.Fatalf("a node holding the built-in made %d registry requests", n)
	}
	if cached, _ := local.Cached(ctx); len(cached) != 0 {
		t.Fatalf("a node holding the built-in cached %v", cached)
	}
}

// The code interpreter published as two layers (base's, then its own)
// unpacks on a node without it as base's tree with its own on top, the
// overlay upper dir's whiteout and opaque directory applied.
func TestSourcePullsTwoLayerBuiltin(t *testing.T) {
	testenv.RequireRoot(t, "unpacking keeps owners and chroots")
	c := newCluster(t)
	src := t.TempDir()
	write := func(name string, files map[string]string) {
		for p, body := range files {
			full := filepath.Join(src, name, "rootfs", p)
			os.MkdirAll(filepath.Dir(full), 0o755)
			if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(template.BaseTemplate, map[string]string{"etc/hostname": "base\n", "usr/bin/python3": "py", "etc/gone": "g", "opt/old": "o"})
	write(template.CodeInterpreterTemplate, map[string]string{"etc/hostname": "ci\n", "usr/local/bin/jupyter": "j", "opt/new": "n"})
	// An overlay upper dir's whiteout and opaque directory.
	upper := filepath.Join(src, template.CodeInterpreterTemplate, "rootfs")
	if err := unix.Mknod(filepath.Join(upper, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "opt"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	im, _, err := builtinimage.Publish(c.store, src, template.CodeInterpreterTemplate)
	if err != nil {
		t.Fatal(err)
	}
	cache, _ := newCache(t, c, c.nodeTLS(t, "node-a"))
	s := &imagecache.Source{Cache: cache, ImagesDir: t.TempDir()}
	layers, err := s.Layers(context.Background(), im)
	if err != nil || len(layers) != 1 {
		t.Fatalf("pull %v: %v %v", im, layers, err)
	}
	for p, want := range map[string]string{"etc/hostname": "ci\n", "usr/bin/python3": "py", "usr/local/bin/jupyter": "j", "opt/new": "n"} {
		if got := readFile(t, filepath.Join(layers[0], p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"etc/gone", "opt/old"} {
		if _, err := os.Lstat(filepath.Join(layers[0], p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, hidden by the upper layer, is in the pulled tree: %v", p, err)
		}
	}
}
