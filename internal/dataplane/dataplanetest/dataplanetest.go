// Package dataplanetest gives tests and benchmarks real cluster
// identities (a cluster CA in a throwaway SQLite store, the control
// plane's certificate, nodes' certificates issued from CSRs as a join
// does) and a data-plane server on loopback.
package dataplanetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// PKI is a cluster CA with the control plane's certificate, and the store
// that holds them (and the nodes' revocations: forget a node there).
type PKI struct {
	CA           *clusterpki.CA
	ControlPlane tls.Certificate
	Store        *sqlite.Store
}

// NewPKI makes a cluster CA the way a control plane does on first start.
func NewPKI(tb testing.TB) *PKI {
	tb.Helper()
	st, err := sqlite.Open(filepath.Join(tb.TempDir(), "pki.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	sec, err := secret.New(st, bytes.Repeat([]byte{7}, secret.KeySize))
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := clusterpki.LoadOrCreateCA(context.Background(), st, sec)
	if err != nil {
		tb.Fatal(err)
	}
	cp, err := ca.IssueControlPlane(time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	return &PKI{CA: ca, ControlPlane: *cp, Store: st}
}

// Node issues node id's certificate: the key is made here, only the CSR
// goes to the CA.
func (p *PKI) Node(tb testing.TB, id string) tls.Certificate {
	tb.Helper()
	return p.NodeAfter(tb, id, time.Time{})
}

// NodeAfter is Node for an ID forgotten at revokedAt (its re-join): the
// certificate starts no earlier than that.
func (p *PKI) NodeAfter(tb testing.TB, id string, revokedAt time.Time) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: id}}, key)
	if err != nil {
		tb.Fatal(err)
	}
	certPEM, err := p.CA.SignNodeAfter(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), id, []string{"127.0.0.1"}, time.Now(), revokedAt)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	c, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Client is a data-plane client with the control plane's identity,
// reading the revocations from Store with no cache.
func (p *PKI) Client(tb testing.TB) *dataplane.Client {
	tb.Helper()
	c, err := dataplane.NewClient(p.ControlPlane, p.CA.Cert, p.Store)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Serve runs node id's data-plane server on a loopback port with cfg
// (Cert and CA are filled in) and returns its address; the server is
// closed, and Serve's result checked, at cleanup.
func (p *PKI) Serve(tb testing.TB, id string, cfg dataplane.ServerConfig) (addr string, srv *dataplane.Server) {
	tb.Helper()
	return p.ServeAfter(tb, id, time.Time{}, cfg)
}

// ServeAfter is Serve with a certificate from NodeAfter.
func (p *PKI) ServeAfter(tb testing.TB, id string, revokedAt time.Time, cfg dataplane.ServerConfig) (addr string, srv *dataplane.Server) {
	tb.Helper()
	cfg.Cert, cfg.CA = p.NodeAfter(tb, id, revokedAt), p.CA.Cert
	srv, err := dataplane.NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, dataplane.ErrServerClosed) {
			tb.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), srv
}
