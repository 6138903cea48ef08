package cacerts

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func testCA(t *testing.T, name string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestParse(t *testing.T) {
	a, b := testCA(t, "a"), testCA(t, "b")
	s, err := Parse(append(append([]byte("# comment\n"), a...), b...))
	if err != nil || s.Len() != 2 {
		t.Fatalf("two certificates: %v, %v", s, err)
	}
	if !bytes.Contains(s.PEM(), a) || !bytes.Contains(s.PEM(), b) {
		t.Fatal("PEM lost a certificate")
	}
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})
	for name, in := range map[string][]byte{
		"empty":    nil,
		"text":     []byte("not pem"),
		"key":      append(append([]byte{}, a...), key...),
		"garbage":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")}),
		"trailing": append(append([]byte{}, a...), []byte("junk")...),
	} {
		if _, err := Parse(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestSandboxFiles(t *testing.T) {
	extra := testCA(t, "proxy")
	s, err := Parse(extra)
	if err != nil {
		t.Fatal(err)
	}
	top, bottom := t.TempDir(), t.TempDir()
	write := func(root, rel, data string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(bottom, BundlePath, "MOZILLA\n")
	files, err := s.SandboxFiles([]string{top, bottom})
	if err != nil {
		t.Fatal(err)
	}
	if got := files[BundlePath]; !bytes.HasPrefix(got, []byte("MOZILLA\n")) || !bytes.HasSuffix(got, extra) {
		t.Fatalf("bundle = %q: want the image's bundle, then the extra CA", got)
	}
	if !bytes.Equal(files[LocalPath], extra) {
		t.Fatalf("local CA file = %q", files[LocalPath])
	}

	// The top layer shadows the lower one.
	write(top, BundlePath, "TOP")
	files, _ = s.SandboxFiles([]string{top, bottom})
	if !bytes.HasPrefix(files[BundlePath], []byte("TOP\n")) {
		t.Fatalf("top layer not used: %q", files[BundlePath])
	}

	// A hostile image's symlink resolves inside its own layer: it cannot
	// make the host's files part of a sandbox's bundle.
	secret := filepath.Join(t.TempDir(), "secret")
	write(filepath.Dir(secret), "secret", "HOST SECRET")
	evil := t.TempDir()
	if err := os.MkdirAll(filepath.Join(evil, "etc/ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(evil, BundlePath)); err != nil {
		t.Fatal(err)
	}
	files, err = s.SandboxFiles([]string{evil})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(files[BundlePath], []byte("HOST SECRET")) {
		t.Fatal("a layer's symlink read a host file")
	}
	if !bytes.Equal(files[BundlePath], extra) {
		t.Fatalf("bundle of an image without one = %q, want the extra CA alone", files[BundlePath])
	}
}

func TestInstall(t *testing.T) {
	egress, other := testCA(t, "egress"), testCA(t, "other")
	s, err := Parse(egress)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bundle := filepath.Join(dir, BundlePath)
	if err := os.MkdirAll(filepath.Dir(bundle), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bundle, append([]byte("MOZILLA\n"), other...), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent: the second adds nothing
		if err := s.Install(dir, EgressPath); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(bundle)
	if want := append(append([]byte("MOZILLA\n"), other...), egress...); !bytes.Equal(got, want) {
		t.Fatalf("bundle = %q, want the image's bundle then the CA once", got)
	}
	if fi, _ := os.Stat(bundle); fi.Mode().Perm() != 0o644 {
		t.Fatalf("bundle mode %v", fi.Mode())
	}
	if local, _ := os.ReadFile(filepath.Join(dir, EgressPath)); !bytes.Equal(local, egress) {
		t.Fatalf("%s = %q", EgressPath, local)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "etc/ssl/certs/.cubicle-ca-*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}

	// An image without a bundle gets one with the CA alone.
	bare := t.TempDir()
	if err := s.Install(bare, EgressPath); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(bare, BundlePath)); !bytes.Equal(got, egress) {
		t.Fatalf("bare bundle = %q", got)
	}
}

// A sandbox controls its own tree: a symlink it placed must not lead the
// install outside it.
func TestInstallStaysInRoot(t *testing.T) {
	s, err := Parse(testCA(t, "egress"))
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	for name, link := range map[string]string{"etc/ssl/certs": outside, "usr/local/share/ca-certificates": "../../../../" + filepath.Base(outside)} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(link, p); err != nil {
				t.Fatal(err)
			}
			if err := s.Install(dir, EgressPath); err == nil {
				t.Fatal("install through a symlink out of the root succeeded")
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("wrote outside the root: %v", ents)
			}
		})
	}
}

// An image whose bundle is an absolute symlink (to another file of the
// image) keeps its certificates: the link is read inside the tree, then
// replaced by the bundle with the CA appended.
func TestInstallThroughAbsoluteLink(t *testing.T) {
	egress := testCA(t, "egress")
	s, err := Parse(egress)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc/ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/ssl/cert.pem"), []byte("IMAGE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/ssl/cert.pem", filepath.Join(dir, BundlePath)); err != nil {
		t.Fatal(err)
	}
	if err := s.Install(dir, EgressPath); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, BundlePath)); !bytes.Equal(got, append([]byte("IMAGE\n"), egress...)) {
		t.Fatalf("bundle = %q", got)
	}
}
