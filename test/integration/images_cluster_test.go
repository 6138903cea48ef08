package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/imagecache"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestNodePullsImageFromControlPlane: a joined node reads the control
// plane's registry on the cluster's server name with its certificate and
// caches an image by digest; without a node certificate, or to push (it is
// not labelled builder=true), it is refused, and the public name does not serve the registry at all.
func TestNodePullsImageFromControlPlane(t *testing.T) {
	const domain = "cubicle.test"
	s, roots := startTLSServer(t, domain)

	// An image in the control plane's store, through the admin API.
	var lb bytes.Buffer
	tw := tar.NewWriter(&lb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/node-pull", Mode: 0o644, Size: 5})
	tw.Write([]byte("hello"))
	tw.Close()
	layerBytes := lb.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("it/node-pull:v1")
	var tb bytes.Buffer
	if err := tarball.Write(tag, img, &tb); err != nil {
		t.Fatal(err)
	}
	if code, _, b := s.raw("POST", "/images?ref=it/node-pull:v1", tb.String()); code/100 != 2 {
		t.Fatalf("import: %d %s", code, b)
	}
	code, _, b := s.raw("GET", "/images", nil)
	var entries []struct{ Ref, Digest string }
	if code != 200 || json.Unmarshal(b, &entries) != nil {
		t.Fatalf("list images: %d %s", code, b)
	}
	ref := imagecache.Ref{Repository: "it/node-pull"}
	for _, e := range entries {
		if strings.HasPrefix(e.Ref, "it/node-pull:") {
			ref.Digest = e.Digest
		}
	}
	if ref.Digest == "" {
		t.Fatalf("imported image not listed: %s", b)
	}

	// Join a node.
	tok, pin := joinToken(t, s)
	dir := t.TempDir()
	if out, err := exec.Command(filepath.Join(binDir, "cubicle"), "node", "join", "--control-plane", "https://"+s.listenOn,
		"--token", tok, "--ca-pin", pin, "--node-id", "node-img", "--data-dir", dir, "--address", "127.0.0.1").CombinedOutput(); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, nodejoin.CertFile), filepath.Join(dir, nodejoin.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(dir, nodejoin.CAFile))
	ca, err := clusterpki.ParseCertPEM(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	clusterRoots := x509.NewCertPool()
	clusterRoots.AddCert(ca)
	anon := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: clusterRoots, ServerName: clusterpki.JoinServerName}
	nodeTLS := anon.Clone()
	nodeTLS.Certificates = []tls.Certificate{pair}

	cache, err := imagecache.New(imagecache.Config{Registry: s.listenOn, TLS: nodeTLS, Dir: filepath.Join(t.TempDir(), "cache")})
	if err != nil {
		t.Fatal(err)
	}
	root, err := cache.Rootfs(context.Background(), ref)
	if err != nil {
		t.Fatalf("node pull: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "etc/node-pull")); err != nil || string(got) != "hello" {
		t.Fatalf("pulled rootfs: %q %v", got, err)
	}

	// No node certificate: refused.
	anonCache, err := imagecache.New(imagecache.Config{Registry: s.listenOn, TLS: anon, Dir: filepath.Join(t.TempDir(), "anon")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonCache.Rootfs(context.Background(), ref); !errors.Is(err, imagecache.ErrPull) {
		t.Fatalf("pull without a node certificate: %v", err)
	}
	status := func(cfg *tls.Config, method, path string) (int, http.Header) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: cfg}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(method, "https://"+s.listenOn+path, strings.NewReader("{}"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	if c, _ := status(anon, "GET", "/v2/"); c != 401 {
		t.Fatalf("/v2/ without a node certificate: %d, want 401", c)
	}
	// Only a node labelled builder=true pushes (with a build's credentials).
	if c, _ := status(nodeTLS, "POST", "/v2/it/node-pull/blobs/uploads/"); c != 403 {
		t.Fatalf("a node's push: %d, want 403", c)
	}
	// The public name is the API, not the registry.
	pub := &tls.Config{RootCAs: roots, ServerName: "api." + domain}
	if c, h := status(pub, "GET", "/v2/it/node-pull/manifests/"+ref.Digest); c == 200 || h.Get("Docker-Distribution-API-Version") != "" {
		t.Fatalf("the registry answered on the public name: %d", c)
	}
}
