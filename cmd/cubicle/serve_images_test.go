package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
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

// The registry's node view refuses a forgotten node's certificate (401)
// while another node's still reads, and serves the node again once it has
// re-joined with a new certificate.
func TestNodeRegistryRefusesForgottenNode(t *testing.T) {
	ctx := context.Background()
	st, ca, _ := nodeTestControlPlane(t)
	imgs, err := image.Open(filepath.Join(t.TempDir(), "oci"))
	if err != nil {
		t.Fatal(err)
	}
	join := &nodejoin.Service{Store: st, CA: ca}
	h := nodeRegistry(http.NotFoundHandler(), join, st, image.NewRegistry(imgs))
	srv := httptest.NewUnstartedServer(h)
	cp, err := ca.IssueControlPlane(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cp}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: roots}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	get := func(cert tls.Certificate) int {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: clusterpki.JoinServerName, Certificates: []tls.Certificate{cert}}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(srv.URL + "/v2/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	n7, n8 := signedPair(t, ca, "n7"), signedPair(t, ca, "n8")
	if code := get(n7); code != http.StatusOK {
		t.Fatalf("node n7 before the forget: %d", code)
	}
	if err := st.RegisterNode(ctx, &store.Node{ID: "n7"}); err != nil {
		t.Fatal(err)
	}
	if err := st.ForgetNode(ctx, "n7"); err != nil {
		t.Fatal(err)
	}
	if code := get(n7); code != http.StatusUnauthorized {
		t.Fatalf("forgotten node n7: %d, want 401", code)
	}
	if code := get(n8); code != http.StatusOK {
		t.Fatalf("node n8 after n7's forget: %d", code)
	}
	// Re-joined: the certificate a join signs now is served.
	tok, _, err := nodejoin.Create(ctx, st, time.Hour, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	out, err := join.Join(ctx, nodejoin.Request{Token: tok, NodeID: "n7", CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	fresh, err := tls.X509KeyPair([]byte(out.Certificate), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	if code := get(fresh); code != http.StatusOK {
		t.Fatalf("re-joined node n7: %d", code)
	}
}
