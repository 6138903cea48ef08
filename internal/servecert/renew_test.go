package servecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"path/filepath"
	"testing"
	"time"
)

// writeLeaf puts a leaf for *.domain valid until notAfter, signed by the
// given issuer, where SelfSigned keeps its own.
func writeLeaf(t *testing.T, dir, domain string, notAfter time.Time, issuer *x509.Certificate, issuerKey *ecdsa.PrivateKey) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "*." + domain},
		DNSNames:     []string{"*." + domain, domain},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if issuer == nil { // self-signed: not from the local CA
		issuer, issuerKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, issuerKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), der, key); err != nil {
		t.Fatal(err)
	}
	return der
}

func TestLeafIsRenewedNearExpiryAndWhenNotFromTheCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	_, caPath, err := SelfSigned(dir, "cubicle.test")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := tls.LoadX509KeyPair(caPath, filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(ca.Certificate[0])
	caKey := ca.PrivateKey.(*ecdsa.PrivateKey)

	for _, tc := range []struct {
		name     string
		notAfter time.Time
		issuer   *x509.Certificate
		renewed  bool
	}{
		{"ten days left", time.Now().Add(10 * 24 * time.Hour), caCert, true},
		{"expired", time.Now().Add(-time.Minute), caCert, true},
		{"issued by another key", time.Now().Add(200 * 24 * time.Hour), nil, true},
		{"200 days left, from the CA", time.Now().Add(200 * 24 * time.Hour), caCert, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := writeLeaf(t, dir, "cubicle.test", tc.notAfter, tc.issuer, caKey)
			c, gotCA, err := SelfSigned(dir, "cubicle.test")
			if err != nil {
				t.Fatal(err)
			}
			if gotCA != caPath {
				t.Fatalf("CA moved: %s", gotCA)
			}
			kept := string(c.Certificate[0]) == string(old)
			if kept == tc.renewed {
				t.Fatalf("renewed=%v, want %v", !kept, tc.renewed)
			}
			leaf, _ := x509.ParseCertificate(c.Certificate[0])
			if err := leaf.CheckSignatureFrom(caCert); err != nil {
				t.Fatalf("leaf not from the local CA: %v", err)
			}
			if tc.renewed && time.Until(leaf.NotAfter) < leafValidity-2*time.Hour {
				t.Fatalf("renewed leaf ends %v", leaf.NotAfter)
			}
		})
	}
}
