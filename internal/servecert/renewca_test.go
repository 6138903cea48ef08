package servecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// writeOldCA puts a CA that expires at notAfter where LoadOrCreateCA keeps
// its own, and returns it.
func writeOldCA(t *testing.T, dir string, notAfter time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "Cubicle egress CA test", Organization: []string{"Cubicle"}},
		NotBefore: time.Now().Add(-24 * time.Hour), NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writePair(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"), der, key); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func pemFile(t *testing.T, certs ...[]byte) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "*.pem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range certs {
		_ = pem.Encode(f, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	return f.Name()
}

// A renewed CA keeps the one it replaced: leaves verify for whoever trusts
// only the old CA (a sandbox created before the renewal, running or
// paused) and for whoever trusts what PEM gives after it, by Go and by
// OpenSSL (curl, Python and Node in a sandbox), also after another
// restart; once the old CA cannot outlive a leaf, the new one signs.
func TestRenewedCAStaysTrustedByTheOld(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "egress-ca")
	old := writeOldCA(t, dir, time.Now().Add(10*24*time.Hour)) // within caRenewBefore (and the old 30 days)
	ca, err := LoadOrCreateCA(dir, "Cubicle egress CA test")
	if err != nil {
		t.Fatal(err)
	}
	if ca.Cert.Equal(old) {
		t.Fatal("the CA was not renewed")
	}
	trusts := func(what string, leaf []byte, chain [][]byte, bundle []byte) {
		t.Helper()
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		if !roots.AppendCertsFromPEM(bundle) {
			t.Fatalf("%s: no certificate in the bundle", what)
		}
		for _, c := range chain {
			ic, _ := x509.ParseCertificate(c)
			inter.AddCert(ic)
		}
		lc, _ := x509.ParseCertificate(leaf)
		if _, err := lc.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: roots, Intermediates: inter}); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		openssl, err := exec.LookPath("openssl")
		if err != nil {
			return // Go's verifier above is the check then
		}
		caFile := filepath.Join(t.TempDir(), "bundle.pem")
		if err := os.WriteFile(caFile, bundle, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(openssl, "verify", "-CAfile", caFile, "-verify_hostname", "api.test", pemFile(t, leaf)).CombinedOutput()
		if err != nil {
			t.Errorf("openssl, %s: %v: %s", what, err, out)
		}
	}
	oldPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: old.Raw})
	for _, c := range []*CA{ca, mustLoad(t, dir)} {
		leaf, err := c.Issue([]string{"api.test"}, 7*24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		trusts("a sandbox from before the renewal", leaf.Certificate[0], leaf.Certificate[1:], oldPEM)
		trusts("a sandbox from after it", leaf.Certificate[0], leaf.Certificate[1:], c.PEM())
	}
	// A leaf the old CA cannot outlive is signed by the new one.
	leaf, err := ca.Issue([]string{"api.test"}, 200*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if string(leaf.Certificate[1]) != string(ca.Cert.Raw) {
		t.Error("a leaf past the old CA's expiry is not from the new CA")
	}
	trusts("a sandbox from after the renewal, a long leaf", leaf.Certificate[0], leaf.Certificate[1:], ca.PEM())

	// An expired CA is replaced and not kept.
	dir2 := filepath.Join(t.TempDir(), "egress-ca")
	writeOldCA(t, dir2, time.Now().Add(-time.Hour))
	fresh := mustLoad(t, dir2)
	if fresh.prev != nil {
		t.Error("an expired CA was kept")
	}
	if n := len(pemBlocks(fresh.PEM())); n != 1 {
		t.Errorf("a fresh CA's PEM has %d certificates", n)
	}
}

func mustLoad(t *testing.T, dir string) *CA {
	t.Helper()
	ca, err := LoadOrCreateCA(dir, "Cubicle egress CA test")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func pemBlocks(b []byte) [][]byte {
	var out [][]byte
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return out
		}
		out = append(out, blk.Bytes)
	}
}
