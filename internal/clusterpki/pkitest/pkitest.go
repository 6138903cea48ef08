// Package pkitest gives tests and benchmarks a real cluster PKI: a cluster
// CA made the way a control plane makes it on first start (in a throwaway
// SQLite store, sealed by a secrets service), the control plane's
// certificate, and node certificates issued from CSRs as a join does.
package pkitest

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
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// PKI is a cluster CA, the store that holds it and the control plane's
// certificate.
type PKI struct {
	Store        *sqlite.Store
	Secrets      *secret.Secrets
	CA           *clusterpki.CA
	ControlPlane tls.Certificate
}

// New makes a cluster CA in a SQLite store under tb's temp dir (closed at
// clean-up) and issues the control plane's certificate.
func New(tb testing.TB) *PKI {
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
	return &PKI{Store: st, Secrets: sec, CA: ca, ControlPlane: *cp}
}

// Node issues node id's certificate for hosts (127.0.0.1 when none).
func (p *PKI) Node(tb testing.TB, id string, hosts ...string) tls.Certificate {
	tb.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	return NodeCert(tb, p.CA, id, hosts...)
}

// IssueNode has ca sign node id's certificate for hosts as a join does:
// the key is made here, only the CSR goes to the CA. It returns both in
// PEM, as a joined node keeps them on disk.
func IssueNode(tb testing.TB, ca *clusterpki.CA, id string, hosts ...string) (certPEM, keyPEM []byte) {
	tb.Helper()
	return IssueNodeAfter(tb, ca, id, time.Time{}, hosts...)
}

// IssueNodeAfter is IssueNode for an ID forgotten at revokedAt (its
// re-join): the certificate starts no earlier than that.
func IssueNodeAfter(tb testing.TB, ca *clusterpki.CA, id string, revokedAt time.Time, hosts ...string) (certPEM, keyPEM []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: id}}, key)
	if err != nil {
		tb.Fatal(err)
	}
	certPEM, err = ca.SignNodeAfter(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), id, hosts, time.Now(), revokedAt)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// NodeCert is IssueNode's certificate as a TLS key pair.
func NodeCert(tb testing.TB, ca *clusterpki.CA, id string, hosts ...string) tls.Certificate {
	tb.Helper()
	c, err := tls.X509KeyPair(IssueNode(tb, ca, id, hosts...))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// NodeCertAfter is IssueNodeAfter's certificate as a TLS key pair.
func NodeCertAfter(tb testing.TB, ca *clusterpki.CA, id string, revokedAt time.Time, hosts ...string) tls.Certificate {
	tb.Helper()
	c, err := tls.X509KeyPair(IssueNodeAfter(tb, ca, id, revokedAt, hosts...))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Roots is a pool holding only the cluster CA.
func (p *PKI) Roots() *x509.CertPool {
	roots := x509.NewCertPool()
	roots.AddCert(p.CA.Cert)
	return roots
}
