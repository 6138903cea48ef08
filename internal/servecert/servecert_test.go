package servecert

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSelfSignedIsMadeOnceAndCoversTheDomain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	c1, ca1, err := SelfSigned(dir, "cubicle.test")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca-key.pem", "server-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", f, err, st.Mode())
		}
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v", st.Mode())
	}
	caPEM, _ := os.ReadFile(ca1)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	leaf, _ := x509.ParseCertificate(c1.Certificate[0])
	for _, h := range append(Hosts("cubicle.test"), "cubicle.test", "3000-abc.cubicle.test") {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots}); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
	// A restart reuses both.
	c2, ca2, err := SelfSigned(dir, "cubicle.test")
	if err != nil || ca2 != ca1 || string(c2.Certificate[0]) != string(c1.Certificate[0]) {
		t.Fatalf("second start made a new certificate (%v)", err)
	}
	// Another domain: same CA, a new leaf for it.
	c3, _, err := SelfSigned(dir, "other.test")
	if err != nil {
		t.Fatal(err)
	}
	leaf3, _ := x509.ParseCertificate(c3.Certificate[0])
	if _, err := leaf3.Verify(x509.VerifyOptions{DNSName: "api.other.test", Roots: roots}); err != nil {
		t.Fatalf("new leaf from the same CA: %v", err)
	}
	// Load checks coverage.
	if _, err := Load(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), "cubicle.test"); !errors.Is(err, ErrNotCovered) {
		t.Fatalf("a certificate for other.test loaded for cubicle.test: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), "other.test"); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(filepath.Join(dir, "server.pem"), filepath.Join(dir, "ca-key.pem"), "other.test"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("mismatched key: %v", err)
	}
}
