package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/cacerts"
)

// /init's egressCA goes into the sandbox's trust store, only for a caller
// that knows the token, and a bad one changes nothing.
func TestInitInstallsEgressCA(t *testing.T) {
	e := newTestEnv(t, testToken)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egress"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	tree := e.a.cfg.Root
	post := func(body map[string]any, tok string) int {
		b, _ := json.Marshal(body)
		resp, _ := e.do(t, "POST", "/init", bytes.NewReader(b), map[string]string{"Content-Type": "application/json", "X-Access-Token": tok})
		return resp.StatusCode
	}
	local := filepath.Join(tree, cacerts.EgressPath)

	if c := post(map[string]any{"egressCA": string(ca)}, "wrong"); c != 401 {
		t.Fatalf("egressCA without the token: %d", c)
	}
	if _, err := os.Stat(local); !os.IsNotExist(err) {
		t.Fatalf("a refused /init wrote the CA: %v", err)
	}
	if c := post(map[string]any{"egressCA": "not pem", "accessToken": "t2"}, testToken); c != 400 {
		t.Fatalf("bad egressCA: %d", c)
	}
	if c := post(map[string]any{"envVars": map[string]string{}}, testToken); c != 204 {
		t.Fatalf("the token changed with a refused /init: %d", c)
	}
	if c := post(map[string]any{"egressCA": string(ca)}, testToken); c != 204 {
		t.Fatalf("egressCA: %d", c)
	}
	got, _ := os.ReadFile(local)
	bundle, _ := os.ReadFile(filepath.Join(tree, cacerts.BundlePath))
	if !bytes.Equal(got, ca) || !strings.Contains(string(bundle), string(ca)) {
		t.Fatalf("CA not installed: %s = %q, bundle %q", cacerts.EgressPath, got, bundle)
	}
}
