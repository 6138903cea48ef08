package clusterpki_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func key32(b byte) []byte { return bytes.Repeat([]byte{b}, secret.KeySize) }

func openStore(t *testing.T) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newCA(t *testing.T) *clusterpki.CA {
	t.Helper()
	st := openStore(t)
	sec, err := secret.New(st, key32(1))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := clusterpki.LoadOrCreateCA(context.Background(), st, sec)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func csr(t *testing.T, key any, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n"}}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// nodeCert issues node id's certificate the way a join does: the key is
// made here (the node) and only the CSR goes to the CA.
func nodeCert(t *testing.T, ca *clusterpki.CA, id string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignNode(csr(t, key, nil), id, []string{"127.0.0.1", "node-a.example"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	c, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func cpCert(t *testing.T, ca *clusterpki.CA) tls.Certificate {
	t.Helper()
	c, err := ca.IssueControlPlane(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return *c
}

// handshake runs a real TLS handshake over loopback and one byte of
// application data (in TLS 1.3 a client learns of a refused certificate
// only when it reads). It returns the client's and the server's errors.
func handshake(t *testing.T, client, server *tls.Config) (cerr, serr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		if serr = tc.Handshake(); serr == nil {
			_, serr = tc.Write([]byte{1})
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, client)
	if cerr = tc.Handshake(); cerr == nil {
		_, cerr = tc.Read(make([]byte, 1))
	}
	wg.Wait()
	return cerr, serr
}

func TestMutualTLSIdentities(t *testing.T) {
	ca := newCA(t)
	other := newCA(t) // another cluster's CA
	nodeA, nodeB := nodeCert(t, ca, "node-a"), nodeCert(t, ca, "node-b")
	cp := cpCert(t, ca)

	t.Run("the control plane reaches the node it dialled", func(t *testing.T) {
		cerr, serr := handshake(t, clusterpki.ControlPlaneClientConfig(cp, ca.Cert, "node-a"), clusterpki.NodeServerConfig(nodeA, ca.Cert))
		if cerr != nil || serr != nil {
			t.Fatalf("client %v, server %v", cerr, serr)
		}
	})
	t.Run("a node certificate presented as the control plane is refused", func(t *testing.T) {
		_, serr := handshake(t, clusterpki.ControlPlaneClientConfig(nodeB, ca.Cert, "node-a"), clusterpki.NodeServerConfig(nodeA, ca.Cert))
		if !errors.Is(serr, clusterpki.ErrIdentity) {
			t.Fatalf("node A accepted node B as its control plane: %v", serr)
		}
	})
	t.Run("a control plane from another CA is refused", func(t *testing.T) {
		_, serr := handshake(t, clusterpki.ControlPlaneClientConfig(cpCert(t, other), ca.Cert, "node-a"), clusterpki.NodeServerConfig(nodeA, ca.Cert))
		if serr == nil {
			t.Fatal("node accepted a control plane from another CA")
		}
	})
	t.Run("a node from another CA is refused", func(t *testing.T) {
		cerr, _ := handshake(t, clusterpki.ControlPlaneClientConfig(cp, ca.Cert, "node-a"), clusterpki.NodeServerConfig(nodeCert(t, other, "node-a"), ca.Cert))
		if !errors.Is(cerr, clusterpki.ErrIdentity) {
			t.Fatalf("control plane accepted node-a from another CA: %v", cerr)
		}
	})
	t.Run("dialling node A but reaching node B is refused", func(t *testing.T) {
		cerr, _ := handshake(t, clusterpki.ControlPlaneClientConfig(cp, ca.Cert, "node-a"), clusterpki.NodeServerConfig(nodeB, ca.Cert))
		if !errors.Is(cerr, clusterpki.ErrIdentity) || !strings.Contains(cerr.Error(), "cubicle://node/node-b") {
			t.Fatalf("want node-b refused by identity, got %v", cerr)
		}
	})
	t.Run("a client without a certificate is refused", func(t *testing.T) {
		cfg := clusterpki.ControlPlaneClientConfig(cp, ca.Cert, "node-a")
		cfg.Certificates = nil
		if _, serr := handshake(t, cfg, clusterpki.NodeServerConfig(nodeA, ca.Cert)); serr == nil {
			t.Fatal("node accepted a client without a certificate")
		}
	})
}

func TestJoinPin(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	server := &tls.Config{Certificates: []tls.Certificate{cpCert(t, ca)}}
	good, err := clusterpki.JoinClientConfig(strings.ToUpper(clusterpki.Pin(ca.Cert)))
	if err != nil {
		t.Fatal(err)
	}
	if cerr, serr := handshake(t, good, server); cerr != nil || serr != nil {
		t.Fatalf("right pin: client %v, server %v", cerr, serr)
	}
	wrong, _ := clusterpki.JoinClientConfig(clusterpki.Pin(other.Cert))
	if cerr, _ := handshake(t, wrong, server); !errors.Is(cerr, clusterpki.ErrPinMismatch) {
		t.Fatalf("wrong pin: want ErrPinMismatch, got %v", cerr)
	}
	// The pinned CA in the chain is not enough: the leaf must be the
	// control plane's (a node certificate from the same CA is refused).
	nodeServer := &tls.Config{Certificates: []tls.Certificate{withCA(nodeCert(t, ca, "node-a"), ca)}}
	if cerr, _ := handshake(t, good, nodeServer); !errors.Is(cerr, clusterpki.ErrIdentity) {
		t.Fatalf("node posing as the control plane: want ErrIdentity, got %v", cerr)
	}
	for _, bad := range []string{"", "sha256:", "sha1:00", "sha256:" + strings.Repeat("g", 64), "sha256:abcd"} {
		if _, err := clusterpki.JoinClientConfig(bad); err == nil {
			t.Errorf("pin %q accepted", bad)
		}
	}
}

func withCA(c tls.Certificate, ca *clusterpki.CA) tls.Certificate {
	c.Certificate = append(c.Certificate, ca.Cert.Raw)
	return c
}

func TestSignNode(t *testing.T) {
	ca := newCA(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	certPEM, err := ca.SignNode(csr(t, key, nil), "node-1", []string{"10.0.0.7", "n1.example.com"}, now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := clusterpki.ParseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "cubicle://node/node-1" || len(c.IPAddresses) != 1 || !c.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) ||
		len(c.DNSNames) != 1 || c.DNSNames[0] != "n1.example.com" {
		t.Fatalf("SANs: %v %v %v", c.URIs, c.IPAddresses, c.DNSNames)
	}
	if !c.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) || c.IsCA {
		t.Fatal("certificate is not for the CSR's key, or is a CA")
	}
	if d := c.NotAfter.Sub(now); d > clusterpki.LeafValidity || d < clusterpki.LeafValidity-time.Minute {
		t.Fatalf("validity %v, want %v", d, clusterpki.LeafValidity)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: rootsOf(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatal(err)
	}

	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	evil, _ := url.Parse("cubicle://control-plane")
	for name, tc := range map[string]struct {
		csr  []byte
		id   string
		addr []string
		want error
	}{
		"RSA key":               {csr(t, rsaKey, nil), "n", nil, clusterpki.ErrInvalidCSR},
		"P-384 key":             {csr(t, p384, nil), "n", nil, clusterpki.ErrInvalidCSR},
		"CSR asking for a URI":  {csr(t, key, &x509.CertificateRequest{URIs: []*url.URL{evil}}), "n", nil, clusterpki.ErrInvalidCSR},
		"CSR asking for DNS":    {csr(t, key, &x509.CertificateRequest{DNSNames: []string{"x"}}), "n", nil, clusterpki.ErrInvalidCSR},
		"not PEM":               {[]byte("hello"), "n", nil, clusterpki.ErrInvalidCSR},
		"tampered CSR":          {tamper(csr(t, key, nil)), "n", nil, clusterpki.ErrInvalidCSR},
		"node ID with a slash":  {csr(t, key, nil), "a/../control-plane", nil, clusterpki.ErrInvalidNodeID},
		"upper-case node ID":    {csr(t, key, nil), "Node", nil, clusterpki.ErrInvalidNodeID},
		"empty node ID":         {csr(t, key, nil), "", nil, clusterpki.ErrInvalidNodeID},
		"address with a space":  {csr(t, key, nil), "n", []string{"a b"}, clusterpki.ErrInvalidAddress},
		"address that is a URL": {csr(t, key, nil), "n", []string{"https://x"}, clusterpki.ErrInvalidAddress},
	} {
		if _, err := ca.SignNode(tc.csr, tc.id, tc.addr, now); !errors.Is(err, tc.want) {
			t.Errorf("%s: want %v, got %v", name, tc.want, err)
		}
	}
}

func tamper(p []byte) []byte {
	b, _ := pem.Decode(p)
	b.Bytes[len(b.Bytes)-5] ^= 0xff
	return pem.EncodeToMemory(b)
}

func rootsOf(ca *clusterpki.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// TestCAMadeOnceAndSealed: replicas racing on one store get one CA; its
// key is sealed (not in the row in clear), and a replica with another
// secrets key cannot open it.
func TestCAMadeOnceAndSealed(t *testing.T) {
	st := openStore(t)
	sec, _ := secret.New(st, key32(7))
	const n = 6
	cas := make([]*clusterpki.CA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cas[i], errs[i] = clusterpki.LoadOrCreateCA(context.Background(), st, sec)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !cas[i].Cert.Equal(cas[0].Cert) {
			t.Fatal("two replicas got different CAs")
		}
	}
	// What one replica signs, another verifies.
	if _, err := cas[1].IssueControlPlane(time.Now()); err != nil {
		t.Fatal(err)
	}
	row, err := st.ClusterCA(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(row.KeySealed, []byte("PRIVATE KEY")) {
		t.Fatal("the CA key is stored in clear")
	}
	wrong, _ := secret.New(st, key32(8))
	if _, err := clusterpki.LoadOrCreateCA(context.Background(), st, wrong); !errors.Is(err, secret.ErrWrongKey) {
		t.Fatalf("another secrets key: want secret.ErrWrongKey, got %v", err)
	}
}

// TestRenewNode: a node renews with the certificate it holds, keeping its
// ID; the control plane's certificate, another CA's, and an expired one
// renew nothing.
func TestRenewNode(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	now := time.Now()
	old := nodeCert(t, ca, "node-7")
	revs := openStore(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certPEM, err := ca.RenewNode(context.Background(), old.Leaf, csr(t, key, nil), []string{"10.0.0.8"}, now, revs)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := clusterpki.ParseCertPEM(certPEM)
	if c.URIs[0].String() != "cubicle://node/node-7" || !c.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatalf("renewed %v", c.URIs)
	}
	for name, tc := range map[string]struct {
		peer *x509.Certificate
		at   time.Time
	}{
		"the control plane's certificate": {cpCert(t, ca).Leaf, now},
		"another CA's node":               {nodeCert(t, other, "node-7").Leaf, now},
		"an expired certificate":          {old.Leaf, old.Leaf.NotAfter.Add(time.Second)},
	} {
		if _, err := ca.RenewNode(context.Background(), tc.peer, csr(t, key, nil), nil, tc.at, revs); !errors.Is(err, clusterpki.ErrIdentity) {
			t.Errorf("%s: want ErrIdentity, got %v", name, err)
		}
	}
}

// TestRevokedNode: after a forget, the node's certificate neither
// authenticates nor renews (ErrRevoked, naming the node), even one signed
// within the forget's second; one signed by a join after the forget starts
// no earlier than it and is accepted, even when the join comes within the
// same second; a second forget revokes that one too.
func TestRevokedNode(t *testing.T) {
	ctx := context.Background()
	ca, st := newCA(t), openStore(t)
	old := nodeCert(t, ca, "node-7")
	if id, err := ca.AuthenticateNode(ctx, old.Leaf, time.Now(), st); err != nil || id != "node-7" {
		t.Fatalf("before the forget: %q, %v", id, err)
	}
	if err := st.RegisterNode(ctx, &store.Node{ID: "node-7"}); err != nil {
		t.Fatal(err)
	}
	if err := st.ForgetNode(ctx, "node-7"); err != nil {
		t.Fatal(err)
	}
	revoked, err := st.NodeRevokedAt(ctx, "node-7")
	if err != nil || revoked.IsZero() {
		t.Fatalf("NodeRevokedAt = %v, %v", revoked, err)
	}
	now := time.Now()
	_, err = ca.AuthenticateNode(ctx, old.Leaf, now, st)
	var rev *clusterpki.RevokedError
	if !errors.As(err, &rev) || !errors.Is(err, clusterpki.ErrRevoked) || rev.Node != "node-7" || !rev.At.Equal(revoked) {
		t.Fatalf("forgotten node's certificate: want *RevokedError, got %v", err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if _, err := ca.RenewNode(ctx, old.Leaf, csr(t, key, nil), nil, now, st); !errors.Is(err, clusterpki.ErrRevoked) {
		t.Fatalf("renewal of a forgotten node: want ErrRevoked, got %v", err)
	}
	// A certificate signed in the forget's second without the floor (as
	// any before the forget was) is refused too.
	sameSecond := nodeCertAt(t, ca, "node-7", revoked.Add(999*time.Millisecond))
	if _, err := ca.AuthenticateNode(ctx, sameSecond, now, st); !errors.Is(err, clusterpki.ErrRevoked) {
		t.Fatalf("certificate signed in the forget's second: want ErrRevoked, got %v", err)
	}
	// Another node is not affected.
	if _, err := ca.AuthenticateNode(ctx, nodeCert(t, ca, "node-8").Leaf, now, st); err != nil {
		t.Fatalf("another node: %v", err)
	}
	// A re-join signed within the forget's second starts at it, not a
	// minute before, and is valid at once.
	certPEM, err := ca.SignNodeAfter(csr(t, key, nil), "node-7", []string{"10.0.0.8"}, revoked.Add(300*time.Millisecond), revoked)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := clusterpki.ParseCertPEM(certPEM)
	if !fresh.NotBefore.Equal(revoked) {
		t.Fatalf("re-join certificate starts %v, want the forget's second %v", fresh.NotBefore, revoked)
	}
	if _, err := ca.AuthenticateNode(ctx, fresh, fresh.NotBefore, st); err != nil {
		t.Fatalf("re-joined certificate: %v", err)
	}
	// Its renewal starts no earlier than it.
	renewedPEM, err := ca.RenewNode(ctx, fresh, csr(t, key, nil), nil, fresh.NotBefore, st)
	if err != nil {
		t.Fatal(err)
	}
	if renewed, _ := clusterpki.ParseCertPEM(renewedPEM); renewed.NotBefore.Before(fresh.NotBefore) {
		t.Fatalf("renewed certificate starts %v, before the one renewed (%v)", renewed.NotBefore, fresh.NotBefore)
	}
	// A second forget, even within the same second, revokes the re-joined
	// certificate.
	if err := st.RegisterNode(ctx, &store.Node{ID: "node-7"}); err != nil {
		t.Fatal(err)
	}
	if err := st.ForgetNode(ctx, "node-7"); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.AuthenticateNode(ctx, fresh, time.Now().Add(2*time.Second), st); !errors.Is(err, clusterpki.ErrRevoked) {
		t.Fatalf("re-joined certificate after a second forget: want ErrRevoked, got %v", err)
	}
	// Without a join state to check, nothing authenticates.
	if _, err := ca.AuthenticateNode(ctx, fresh, fresh.NotBefore, nil); err == nil {
		t.Fatal("nil Revocations accepted a certificate")
	}
}

// nodeCertAt is node id's certificate signed by ca at now.
func nodeCertAt(t *testing.T, ca *clusterpki.CA, id string, now time.Time) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certPEM, err := ca.SignNode(csr(t, key, nil), id, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := clusterpki.ParseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
