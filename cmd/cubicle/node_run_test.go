package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodeclient"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// TestNodeCertRenewal: the node agent renews through a real control
// plane's POST /nodes/renew once a third of its certificate's life is
// left: a new key, both files replaced, the holder (what the listener and
// the client present) switched; before that, nothing happens.
func TestNodeCertRenewal(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sx, _ := secret.New(st, bytes.Repeat([]byte{7}, secret.KeySize))
	ca, err := clusterpki.LoadOrCreateCA(ctx, st, sx)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(api.New(api.Config{Join: &nodejoin.Service{Store: st, CA: ca},
		Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}, nil, st))
	cp, _ := ca.IssueControlPlane(time.Now())
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cp}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: roots}
	srv.StartTLS()
	defer srv.Close()

	// A joined node's files.
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	certPEM, err := ca.SignNode(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}), "n1", []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(filepath.Join(dir, nodejoin.KeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	os.WriteFile(filepath.Join(dir, nodejoin.CertFile), certPEM, 0o600)
	old, err := loadNodeCert(dir, ca.Cert, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadNodeCert(dir, ca.Cert, "n2"); err == nil {
		t.Fatal("node n1's certificate loaded as n2's")
	}
	certs := &certHolder{c: old}
	client, err := nodeclient.NewClient(srv.URL, ca.Cert, func() (*tls.Certificate, error) { return certs.get(), nil })
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	a := &nodeAgent{cp: client, certs: certs, ca: ca.Cert, id: "n1", dataDir: dir, log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}

	life := old.Leaf.NotAfter.Sub(old.Leaf.NotBefore)
	if err := a.renewIfDue(ctx, old.Leaf.NotBefore.Add(life/2)); err != nil || certs.get() != old {
		t.Fatalf("renewed at half its life: %v", err)
	}
	if err := a.renewIfDue(ctx, old.Leaf.NotAfter.Add(-life/4)); err != nil {
		t.Fatal(err)
	}
	now := certs.get()
	if now == old || now.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 {
		t.Fatal("holder still has the old certificate")
	}
	if id, err := ca.NodeID(now.Leaf, time.Now()); err != nil || id != "n1" || !now.Leaf.IPAddresses[0].Equal(old.Leaf.IPAddresses[0]) {
		t.Fatalf("renewed certificate: %q %v %v", id, err, now.Leaf.IPAddresses)
	}
	onDisk, err := loadNodeCert(dir, ca.Cert, "n1")
	if err != nil {
		t.Fatalf("files after renewal: %v", err)
	}
	if onDisk.Leaf.SerialNumber.Cmp(now.Leaf.SerialNumber) != 0 || onDisk.PrivateKey.(*ecdsa.PrivateKey).Equal(key) {
		t.Fatal("the files are not the renewed certificate with a new key")
	}
	// The client presents the new certificate (a heartbeat of an
	// unregistered node reaches the handler: 404, not 401).
	if err := client.Heartbeat(ctx, nodeclient.Status{Address: "127.0.0.1:7443", DataAddress: "127.0.0.1:7444", Runtime: "runc"}); !errors.Is(err, nodeclient.ErrNotRegistered) {
		t.Fatalf("heartbeat with the renewed certificate: %v", err)
	}
}

// TestNodeRunNotJoined: without a join identity node run says what to do.
func TestNodeRunNotJoined(t *testing.T) {
	_, err := loadNodeIdentity(t.TempDir())
	if !errors.Is(err, errNotJoined) {
		t.Fatalf("got %v, want errNotJoined", err)
	}
	if want := "run `cubicle node join` first"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Fatalf("%v does not say %q", err, want)
	}
}
