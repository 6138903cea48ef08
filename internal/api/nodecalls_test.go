package api

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/nodeclient"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// nodeCallsEnv is a control plane's API over real TLS (client certificate
// asked for, verified if given, as serve does on the cluster server name)
// with a cluster CA and a secrets service.
type nodeCallsEnv struct {
	st      store.Store
	ca      *clusterpki.CA
	secrets *secret.Secrets
	srv     *httptest.Server
	pki     *pkitest.PKI
}

func newNodeCallsEnv(t *testing.T) *nodeCallsEnv {
	t.Helper()
	pki := pkitest.New(t)
	st, ca, sx := pki.Store, pki.CA, pki.Secrets
	api := New(Config{Join: &nodejoin.Service{Store: st, CA: ca}, Secrets: sx, Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}, nil, st)
	srv := httptest.NewUnstartedServer(api)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.ControlPlane}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pki.Roots(), MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &nodeCallsEnv{st: st, ca: ca, secrets: sx, srv: srv, pki: pki}
}

// nodeCert is a certificate the cluster CA issued to node id.
func (e *nodeCallsEnv) nodeCert(t *testing.T, id string) *tls.Certificate {
	t.Helper()
	c := e.pki.Node(t, id, "127.0.0.1", "node.example")
	return &c
}

func (e *nodeCallsEnv) client(t *testing.T, cert *tls.Certificate) *nodeclient.Client {
	t.Helper()
	c, err := nodeclient.NewClient(e.srv.URL, e.ca.Cert, func() (*tls.Certificate, error) {
		if cert == nil {
			return &tls.Certificate{}, nil // no certificate
		}
		return cert, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func wantStatus(t *testing.T, what string, err error, status int) {
	t.Helper()
	var e *nodeclient.Error
	if !errors.As(err, &e) || e.Status != status {
		t.Fatalf("%s: got %v, want HTTP %d", what, err, status)
	}
}

func testStatus() nodeclient.Status {
	return nodeclient.Status{Address: "10.0.0.7:7443", DataAddress: "10.0.0.7:7444", Runtime: "runc", Version: "v-test",
		Capacity:      store.Capacity{MilliCPU: 4000, MemoryMiB: 8192, DiskMiB: 50000},
		VolumeDrivers: []string{"local"}, Templates: []string{"base"},
		Accelerators: []accel.Device{{ID: "gpu-0000:3b:00.0", Class: "gpu", Vendor: "nvidia"}}}
}

// TestNodeRegisterHeartbeat: the registry row is written from a node's own
// report under the identity of its certificate; labels come from its join
// token; a heartbeat of a node with no row is 404 so it registers again.
func TestNodeRegisterHeartbeat(t *testing.T) {
	e := newNodeCallsEnv(t)
	ctx := context.Background()
	tok, _, _ := nodejoin.Create(ctx, e.st, time.Hour, map[string]string{"zone": "b"}, time.Now())
	if _, err := nodejoin.Redeem(ctx, e.st, tok, "n1", time.Now()); err != nil {
		t.Fatal(err)
	}
	n1 := e.client(t, e.nodeCert(t, "n1"))

	// Without a client certificate: 401, e2b-shaped.
	anon := e.client(t, nil)
	wantStatus(t, "register without a certificate", anon.Register(ctx, testStatus()), 401)
	wantStatus(t, "heartbeat without a certificate", anon.Heartbeat(ctx, testStatus()), 401)
	wantStatus(t, "renew without a certificate", func() error { _, err := anon.Renew(ctx, []byte("x")); return err }(), 401)
	wantStatus(t, "secret without a certificate", func() error { _, err := anon.Secret(ctx, "s", "k"); return err }(), 401)
	// The control plane's own certificate is no node.
	cp, _ := e.ca.IssueControlPlane(time.Now())
	wantStatus(t, "register as the control plane", e.client(t, cp).Register(ctx, testStatus()), 401)

	// Heartbeat before registering: 404, which the client reports as
	// ErrNotRegistered.
	if err := n1.Heartbeat(ctx, testStatus()); !errors.Is(err, nodeclient.ErrNotRegistered) {
		t.Fatalf("heartbeat of an unregistered node: %v, want ErrNotRegistered", err)
	}
	bad := testStatus()
	bad.Address = "no-port"
	wantStatus(t, "register with a bad address", n1.Register(ctx, bad), 400)
	if err := n1.Register(ctx, testStatus()); err != nil {
		t.Fatal(err)
	}
	row, err := e.st.GetNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if row.Address != "10.0.0.7:7443" || row.DataAddress != "10.0.0.7:7444" || row.Capacity.MilliCPU != 4000 || row.Runtime != "runc" ||
		row.Labels["zone"] != "b" || len(row.Templates) != 1 || !strings.Contains(row.Accelerators, "gpu-0000:3b:00.0") {
		t.Fatalf("registered row: %+v", row)
	}
	hb := testStatus()
	hb.DataAddress = "10.0.0.8:7444"
	hb.Accelerators = nil
	if err := n1.Heartbeat(ctx, hb); err != nil {
		t.Fatal(err)
	}
	row2, _ := e.st.GetNode(ctx, "n1")
	if row2.DataAddress != "10.0.0.8:7444" || row2.Accelerators != "" || row2.Labels["zone"] != "b" || row2.HeartbeatAt.Before(row.HeartbeatAt) {
		t.Fatalf("after heartbeat: %+v", row2)
	}
	// Forgotten: its certificate is revoked, so the heartbeat is 401, not
	// the 404 that would make it register again (TestForgottenNodeRefused).
	if err := e.st.ForgetNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "heartbeat after forget", n1.Heartbeat(ctx, hb), 401)
}

// joinNode joins id through the join service with a new token, as POST
// /nodes/join does, and returns the certificate it gets.
func (e *nodeCallsEnv) joinNode(t *testing.T, id string) (*tls.Certificate, error) {
	t.Helper()
	ctx := context.Background()
	tok, _, err := nodejoin.Create(ctx, e.st, time.Hour, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	out, err := (&nodejoin.Service{Store: e.st, CA: e.ca}).Join(ctx, nodejoin.Request{Token: tok, NodeID: id,
		CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), Addresses: []string{"127.0.0.1"}})
	if err != nil {
		return nil, err
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	c, err := tls.X509KeyPair([]byte(out.Certificate), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return &c, nil
}

// TestForgottenNodeRefused: after `cubicle node forget`, every node call
// made with the node's certificate is 401 in e2b's shape, naming the
// forget (register, heartbeat, renew and secret alike: it neither comes
// back nor renews itself out of the revocation), while another node is
// unaffected; a second join of an ID that joined but never registered is
// refused until the forget; a re-join after the forget gets a certificate
// that works.
func TestForgottenNodeRefused(t *testing.T) {
	e := newNodeCallsEnv(t)
	ctx := context.Background()
	old, err := e.joinNode(t, "n5")
	if err != nil {
		t.Fatal(err)
	}
	// Joined, not registered yet: a second token cannot take the ID.
	if _, err := e.joinNode(t, "n5"); !errors.Is(err, store.ErrNodeExists) {
		t.Fatalf("second join of a joined, unregistered ID: want ErrNodeExists, got %v", err)
	}
	n5 := e.client(t, old)
	if err := n5.Register(ctx, testStatus()); err != nil {
		t.Fatal(err)
	}
	other := e.client(t, e.nodeCert(t, "n6"))
	if err := other.Register(ctx, testStatus()); err != nil {
		t.Fatal(err)
	}
	// A sandbox it ran, killed before the forget (the forget guard), with
	// a rule naming a secret: the secret call answers 401 before any 403.
	if _, err := e.secrets.Create(ctx, store.SystemTeamID, "api-key", "s3cret", nil); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sb := &store.Sandbox{ID: "sbx5", TeamID: store.SystemTeamID, TemplateID: "base", State: store.StateKilled, Node: "n5",
		StartedAt: now, EndAt: now.Add(time.Hour), UpdatedAt: now,
		Network: store.Network{Rules: map[string][]store.NetworkRule{"api.example.com": {{Headers: map[string]string{
			"authorization": "Bearer ${e2b.secrets.api-key}"}}}}}}
	if err := e.st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := e.st.ForgetNode(ctx, "n5"); err != nil {
		t.Fatal(err)
	}

	forgotten := func(what string, err error) {
		t.Helper()
		var ne *nodeclient.Error
		if !errors.As(err, &ne) || ne.Status != 401 || !strings.Contains(ne.Message, "n5 was forgotten") || !strings.Contains(ne.Message, "join it again") {
			t.Fatalf("%s after forget: got %v, want 401 naming the forget", what, err)
		}
	}
	forgotten("register", n5.Register(ctx, testStatus()))
	forgotten("heartbeat", n5.Heartbeat(ctx, testStatus()))
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	_, err = n5.Renew(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	forgotten("renew", err)
	_, err = n5.Secret(ctx, "sbx5", "api-key")
	forgotten("secret", err)
	if _, err := e.st.GetNode(ctx, "n5"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("forgotten node registered again: %v", err)
	}
	// The body is e2b-shaped.
	req, _ := http.NewRequest("POST", e.srv.URL+nodeclient.HeartbeatPath, strings.NewReader(`{}`))
	roots := x509.NewCertPool()
	roots.AddCert(e.ca.Cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots,
		ServerName: clusterpki.JoinServerName, Certificates: []tls.Certificate{*old}}}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	hc.CloseIdleConnections()
	if resp.StatusCode != 401 || body["code"] != float64(401) || !strings.Contains(fmt.Sprint(body["message"]), "forgotten") {
		t.Fatalf("forgotten heartbeat body: %d %v", resp.StatusCode, body)
	}
	// Another node is untouched.
	if err := other.Heartbeat(ctx, testStatus()); err != nil {
		t.Fatalf("another node after the forget: %v", err)
	}

	// Join again with a new token: the new certificate works at once.
	fresh, err := e.joinNode(t, "n5")
	if err != nil {
		t.Fatalf("re-join after forget: %v", err)
	}
	// It is valid at once, even within the forget's second.
	if fresh.Leaf.NotBefore.After(time.Now()) {
		t.Fatalf("re-joined certificate starts in the future: %v", fresh.Leaf.NotBefore)
	}
	n5b := e.client(t, fresh)
	if err := n5b.Register(ctx, testStatus()); err != nil {
		t.Fatalf("re-joined node's register: %v", err)
	}
	if err := n5b.Heartbeat(ctx, testStatus()); err != nil {
		t.Fatalf("re-joined node's heartbeat: %v", err)
	}
	if _, err := n5b.Renew(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})); err != nil {
		t.Fatalf("re-joined node's renewal: %v", err)
	}
	// The old certificate stays refused after the re-join.
	forgotten("old certificate's heartbeat after the re-join", n5.Heartbeat(ctx, testStatus()))
}

// TestNodeRenew: a node renews for a new key; the certificate keeps its
// node ID and addresses.
func TestNodeRenew(t *testing.T) {
	e := newNodeCallsEnv(t)
	ctx := context.Background()
	old := e.nodeCert(t, "n2")
	c := e.client(t, old)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	certPEM, err := c.Renew(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := clusterpki.ParseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := e.ca.NodeID(cert, time.Now()); err != nil || id != "n2" {
		t.Fatalf("renewed certificate names %q, %v", id, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(old.Leaf.IPAddresses[0]) ||
		len(cert.DNSNames) != 1 || cert.DNSNames[0] != "node.example" {
		t.Fatalf("renewed certificate: key or addresses changed: %v %v", cert.IPAddresses, cert.DNSNames)
	}
	_, err = c.Renew(ctx, []byte("junk"))
	wantStatus(t, "renew with a bad CSR", err, 400)
}

// TestNodeSecretScope: a node gets a secret only for a live sandbox it
// runs whose current rules name that secret.
func TestNodeSecretScope(t *testing.T) {
	e := newNodeCallsEnv(t)
	ctx := context.Background()
	team := store.SystemTeamID
	if _, err := e.secrets.Create(ctx, team, "api-key", "s3cret", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.secrets.Create(ctx, team, "other", "not-yours", nil); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sb := &store.Sandbox{ID: "sbx1", TeamID: team, TemplateID: "base", State: store.StateRunning, Node: "n1",
		StartedAt: now, EndAt: now.Add(time.Hour), UpdatedAt: now,
		Network: store.Network{Rules: map[string][]store.NetworkRule{"api.example.com": {{Headers: map[string]string{
			"authorization": "Bearer ${e2b.secrets.API-KEY}", "x-missing": "${e2b.secrets.gone}"}}}}}}
	if err := e.st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	n1 := e.client(t, e.nodeCert(t, "n1"))
	n2 := e.client(t, e.nodeCert(t, "n2"))
	if v, err := n1.Secret(ctx, "sbx1", "api-key"); err != nil || v != "s3cret" {
		t.Fatalf("own sandbox's rule secret = %q, %v", v, err)
	}
	_, err := n2.Secret(ctx, "sbx1", "api-key")
	wantStatus(t, "another node's sandbox", err, 403)
	_, err = n1.Secret(ctx, "sbx1", "other")
	wantStatus(t, "a secret the rules do not name", err, 403)
	_, err = n1.Secret(ctx, "nosuch", "api-key")
	wantStatus(t, "an unknown sandbox", err, 403)
	_, err = n1.Secret(ctx, "sbx1", "gone")
	wantStatus(t, "a named secret that does not exist", err, 404)
	// Rules changed (PUT /network): the old secret is no longer given.
	sb.Network.Rules = nil
	if err := e.st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	_, err = n1.Secret(ctx, "sbx1", "api-key")
	wantStatus(t, "after the rules dropped it", err, 403)

	// The body is e2b-shaped.
	req, _ := http.NewRequest("POST", e.srv.URL+nodeclient.SecretPath, strings.NewReader(`{}`))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != 401 || body["code"] != float64(401) || body["message"] == "" {
		t.Fatalf("401 body: %d %v", resp.StatusCode, body)
	}
}
