package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/nodeclient"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// TestNodeCertRenewal: the node agent renews through a real control
// plane's POST /nodes/renew once a third of its certificate's life is
// left: a new key, both files replaced, the holder (what the listener and
// the client present) switched; before that, nothing happens.
func TestNodeCertRenewal(t *testing.T) {
	ctx := context.Background()
	_, ca, url := nodeTestControlPlane(t)
	// A joined node's files.
	dir := t.TempDir()
	certPEM, keyPEM := pkitest.IssueNode(t, ca, "n1", "127.0.0.1")
	os.WriteFile(filepath.Join(dir, nodejoin.KeyFile), keyPEM, 0o600)
	os.WriteFile(filepath.Join(dir, nodejoin.CertFile), certPEM, 0o600)
	old, err := loadNodeCert(dir, ca.Cert, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadNodeCert(dir, ca.Cert, "n2"); err == nil {
		t.Fatal("node n1's certificate loaded as n2's")
	}
	certs := &certHolder{c: old}
	client, err := nodeclient.NewClient(url, ca.Cert, func() (*tls.Certificate, error) { return certs.get(), nil })
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
	if onDisk.Leaf.SerialNumber.Cmp(now.Leaf.SerialNumber) != 0 || onDisk.PrivateKey.(*ecdsa.PrivateKey).Equal(old.PrivateKey) {
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

// nodeTestControlPlane is a control plane's API (real SQLite, cluster CA,
// TLS asking for a client certificate as serve does) at the returned URL.
func nodeTestControlPlane(t *testing.T) (store.Store, *clusterpki.CA, string) {
	t.Helper()
	pki := pkitest.New(t)
	st, ca := pki.Store, pki.CA
	srv := httptest.NewUnstartedServer(api.New(api.Config{Join: &nodejoin.Service{Store: st, CA: ca},
		Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}, nil, st))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.ControlPlane}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pki.Roots()}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return st, ca, srv.URL
}

// TestNodeAgentReregisters: the agent registers, heartbeats, and when the
// control plane answers a heartbeat with 404 (it has no row for the node,
// e.g. a store restored from an older backup) it registers again at once.
// A forgotten node is refused (401) and does not come back.
func TestNodeAgentReregisters(t *testing.T) {
	ctx := context.Background()
	st, ca, url := nodeTestControlPlane(t)
	cert := pkitest.NodeCert(t, ca, "n3")
	client, err := nodeclient.NewClient(url, ca.Cert, func() (*tls.Certificate, error) { return &cert, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	a := &nodeAgent{cp: client, id: "n3", log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}
	status := nodeclient.Status{Address: "127.0.0.1:7443", DataAddress: "127.0.0.1:7444", Runtime: "runc"}
	registered := false
	if err := a.beat(ctx, status, &registered); err != nil || !registered {
		t.Fatalf("first beat: %v, registered %v", err, registered)
	}
	first, err := st.GetNode(ctx, "n3")
	if err != nil {
		t.Fatal(err)
	}
	status.DataAddress = "127.0.0.1:7445"
	if err := a.beat(ctx, status, &registered); err != nil {
		t.Fatal(err)
	}
	if row, _ := st.GetNode(ctx, "n3"); row.DataAddress != "127.0.0.1:7445" || !row.RegisteredAt.Equal(first.RegisteredAt) {
		t.Fatalf("heartbeat did not update the row: %+v", row)
	}
	// The control plane lost the row without a forget: 404, register again.
	if err := a.beat(ctx, status, &registered); err != nil {
		t.Fatal(err)
	}
	a2 := &nodeAgent{cp: client, id: "n4", log: a.log}
	cert4 := signedPair(t, ca, "n4")
	client4, err := nodeclient.NewClient(url, ca.Cert, func() (*tls.Certificate, error) { return &cert4, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer client4.CloseIdleConnections()
	a2.cp = client4
	believes := true // registered before the control plane lost its row
	if err := a2.beat(ctx, status, &believes); err != nil || !believes {
		t.Fatalf("beat with no row: %v", err)
	}
	if row, err := st.GetNode(ctx, "n4"); err != nil || row.Address != "127.0.0.1:7443" {
		t.Fatalf("not registered again after a 404: %+v %v", row, err)
	}
	// Forgotten: the certificate is revoked; the beat fails with 401 and
	// the row stays gone.
	if err := st.ForgetNode(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	var ne *nodeclient.Error
	if err := a.beat(ctx, status, &registered); !errors.As(err, &ne) || ne.Status != 401 {
		t.Fatalf("beat after forget: %v, want 401", err)
	}
	if _, err := st.GetNode(ctx, "n3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("forgotten node registered again: %v", err)
	}
}

// signedPair is a key and a certificate for node id from ca.
func signedPair(t *testing.T, ca *clusterpki.CA, id string) tls.Certificate {
	t.Helper()
	return pkitest.NodeCert(t, ca, id)
}

func TestAdvertiseHost(t *testing.T) {
	leaf := &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.7")}, DNSNames: []string{"n.example"}}
	for _, c := range []struct {
		flag string
		leaf *x509.Certificate
		want string
		ok   bool
	}{
		{"", leaf, "10.0.0.7", true},
		{"", &x509.Certificate{DNSNames: []string{"n.example"}}, "n.example", true},
		{"", &x509.Certificate{}, "", false},
		{"node.example", leaf, "node.example", true},
		{"fd00::7", leaf, "fd00::7", true},
		{"10.0.0.8:7443", leaf, "", false},
	} {
		got, err := advertiseHost(c.flag, c.leaf)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("advertiseHost(%q) = %q, %v", c.flag, got, err)
		}
	}
}
