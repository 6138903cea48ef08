package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// TestNodeJoin: against a real `cubicle serve` with TLS, `cubicle node
// token create` prints a token and the cluster CA's pin, and `cubicle node
// join` gets a node certificate with it once; the same token again, an
// expired token, and a wrong pin fail (the wrong pin before the token is
// sent: the token still works afterwards).
func TestNodeJoin(t *testing.T) {
	s, _ := startTLSServer(t, "cubicle.test")
	cp := "https://" + s.listenOn

	cubicle := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "cubicle"), args...).CombinedOutput()
		return string(out), err
	}
	tokenCreate := func(args ...string) (tok, pin string) { t.Helper(); return joinToken(t, s, args...) }
	join := func(tok, pin, id, dir string) (string, error) {
		return cubicle("node", "join", "--control-plane", cp, "--token", tok, "--ca-pin", pin, "--node-id", id, "--data-dir", dir, "--address", "127.0.0.1")
	}
	// The token can come from the environment instead (out of ps).
	joinEnv := func(tok, pin, id, dir string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "cubicle"), "node", "join", "--control-plane", cp, "--ca-pin", pin, "--node-id", id, "--data-dir", dir)
		cmd.Env = append(os.Environ(), "CUBICLE_JOIN_TOKEN="+tok)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	tok, pin := tokenCreate("--ttl", "10m", "--label", "zone=a")
	dir := t.TempDir()
	if out, err := join(tok, pin, "node-1", dir); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, nodejoin.CertFile), filepath.Join(dir, nodejoin.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, nodejoin.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := clusterpki.ParseCertPEM(caPEM)
	if err != nil || clusterpki.Pin(ca) != pin {
		t.Fatalf("the CA written is not the pinned one: %v", err)
	}
	if u := pair.Leaf.URIs; len(u) != 1 || u[0].String() != "cubicle://node/node-1" || !pair.Leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
		t.Fatalf("node certificate names %v %v", u, pair.Leaf.IPAddresses)
	}
	if fi, err := os.Stat(filepath.Join(dir, nodejoin.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node key: %v %v", fi, err)
	}
	info, _ := os.ReadFile(filepath.Join(dir, nodejoin.InfoFile))
	if !strings.Contains(string(info), `"zone": "a"`) {
		t.Fatalf("node.json lacks the token's label: %s", info)
	}
	// The node certificate works with the control plane's identity.
	cpCert, err := fetchControlPlaneCert(s.listenOn, pin)
	if err != nil {
		t.Fatalf("control-plane certificate by SNI: %v", err)
	}
	if err := pair.Leaf.CheckSignatureFrom(ca); err != nil || cpCert.Leaf.URIs[0].String() != clusterpki.ControlPlaneURI {
		t.Fatalf("identities: %v %v", err, cpCert.Leaf.URIs)
	}

	// The same token again: refused, without saying why.
	out, err := join(tok, pin, "node-2", t.TempDir())
	if err == nil || !strings.Contains(out, "401") || !strings.Contains(out, "unknown, already used or expired") {
		t.Fatalf("second join with one token: %v\n%s", err, out)
	}
	// An expired token (made in the past straight in the store serve uses).
	st, err := sqlite.Open(filepath.Join(s.DataDir, "cubicle.db"))
	if err != nil {
		t.Fatal(err)
	}
	old, _, err := nodejoin.Create(context.Background(), st, time.Minute, nil, time.Now().Add(-time.Hour))
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := join(old, pin, "node-3", t.TempDir()); err == nil || !strings.Contains(out, "401") {
		t.Fatalf("expired token: %v\n%s", err, out)
	}
	// A wrong pin: refused before the token is sent, so it still works.
	tok2, _ := tokenCreate()
	wrong := "sha256:" + strings.Repeat("ab", 32)
	if out, err := join(tok2, wrong, "node-4", t.TempDir()); err == nil || !strings.Contains(out, "does not match the pin") {
		t.Fatalf("wrong pin: %v\n%s", err, out)
	}
	if out, err := joinEnv(tok2, pin, "node-4", t.TempDir()); err != nil {
		t.Fatalf("the token after a wrong-pin attempt: %v\n%s", err, out)
	}
	list, _ := cubicle("node", "token", "list", "--data-dir", s.DataDir)
	if !strings.Contains(list, "used by node-1") || !strings.Contains(list, "used by node-4") || !strings.Contains(list, "zone=a") {
		t.Fatalf("token list:\n%s", list)
	}

	// A bad CSR is a 400 in e2b's shape; a join over the public
	// certificate (no SNI for the cluster) is refused too.
	conf, _ := clusterpki.JoinClientConfig(pin)
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: conf}}
	tok3, _ := tokenCreate()
	body, _ := json.Marshal(nodejoin.Request{Token: tok3, NodeID: "node-5", CSR: "junk"})
	resp, err := hc.Post(cp+nodejoin.Path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 400 || e.Code != 400 || !strings.Contains(e.Message, "certificate request") {
		t.Fatalf("bad CSR: %d %+v", resp.StatusCode, e)
	}
	code, _, raw := s.raw("POST", nodejoin.Path, map[string]any{"token": tok3, "nodeID": "node-5", "csr": "junk"})
	if code != 400 || !strings.Contains(string(raw), clusterpki.JoinServerName) {
		t.Fatalf("join without the cluster server name: %d %s", code, raw)
	}
}

// fetchControlPlaneCert asks the listener for the cluster's server name,
// as a node does, checking the pin.
func fetchControlPlaneCert(addr, pin string) (*tls.Certificate, error) {
	conf, err := clusterpki.JoinClientConfig(pin)
	if err != nil {
		return nil, err
	}
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	st := c.ConnectionState()
	return &tls.Certificate{Leaf: st.PeerCertificates[0]}, nil
}
