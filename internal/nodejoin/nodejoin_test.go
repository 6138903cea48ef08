package nodejoin_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func setup(t *testing.T) (*sqlite.Store, *clusterpki.CA) {
	t.Helper()
	p := pkitest.New(t)
	return p.Store, p.CA
}

func TestTokens(t *testing.T) {
	st, _ := setup(t)
	ctx := context.Background()
	now := time.Now()
	tok, row, err := nodejoin.Create(ctx, st, time.Hour, map[string]string{"zone": "a", "cubicle.dev/role": "builder"}, now)
	if err != nil {
		t.Fatal(err)
	}
	id, sec, err := nodejoin.ParseToken(tok)
	if err != nil || id != row.ID || len(sec) != 32 {
		t.Fatalf("token %q: %v", tok, err)
	}
	if strings.Contains(row.SecretHash, sec) || row.SecretHash == sec {
		t.Fatal("the store row holds the secret")
	}
	got, err := nodejoin.Redeem(ctx, st, tok, "n1", now)
	if err != nil || got.Labels["zone"] != "a" {
		t.Fatalf("redeem: %+v %v", got, err)
	}
	if _, err := nodejoin.Redeem(ctx, st, tok, "n2", now); !errors.Is(err, store.ErrTokenUsed) {
		t.Fatalf("second redeem: want ErrTokenUsed, got %v", err)
	}
	old, _, err := nodejoin.Create(ctx, st, time.Hour, nil, now.Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodejoin.Redeem(ctx, st, old, "n3", now); !errors.Is(err, store.ErrTokenExpired) {
		t.Fatalf("expired: want ErrTokenExpired, got %v", err)
	}
	other, _, _ := nodejoin.Create(ctx, st, time.Hour, nil, now)
	forged := other[:13] + strings.Repeat("0", 32)
	if _, err := nodejoin.Redeem(ctx, st, forged, "n4", now); !errors.Is(err, store.ErrTokenUnknown) {
		t.Fatalf("right ID, wrong secret: want ErrTokenUnknown, got %v", err)
	}
	for _, bad := range []string{"", "abc", tok + "x", strings.ToUpper(tok), strings.Replace(tok, ".", ":", 1)} {
		if _, err := nodejoin.Redeem(ctx, st, bad, "n", now); !errors.Is(err, nodejoin.ErrMalformedToken) {
			t.Errorf("%q: want ErrMalformedToken, got %v", bad, err)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second, nodejoin.MaxTTL + time.Second} {
		if _, _, err := nodejoin.Create(ctx, st, ttl, nil, now); !errors.Is(err, nodejoin.ErrInvalidTTL) {
			t.Errorf("ttl %v: want ErrInvalidTTL, got %v", ttl, err)
		}
	}
	for _, l := range []map[string]string{{"": "x"}, {"a b": "x"}, {"k": "-x"}, {"k": strings.Repeat("v", 64)}} {
		if _, _, err := nodejoin.Create(ctx, st, time.Hour, l, now); !errors.Is(err, nodejoin.ErrInvalidLabel) {
			t.Errorf("labels %v: want ErrInvalidLabel, got %v", l, err)
		}
	}
}

func csrPEM(t *testing.T) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// A request the control plane refuses for its CSR, node ID or address
// does not spend the token.
func TestBadRequestKeepsToken(t *testing.T) {
	st, ca := setup(t)
	ctx := context.Background()
	svc := &nodejoin.Service{Store: st, CA: ca}
	tok, _, _ := nodejoin.Create(ctx, st, time.Hour, nil, time.Now())
	for _, tc := range []struct {
		req  nodejoin.Request
		want error
	}{
		{nodejoin.Request{Token: tok, NodeID: "n1", CSR: "junk"}, clusterpki.ErrInvalidCSR},
		{nodejoin.Request{Token: tok, NodeID: "N1", CSR: csrPEM(t)}, clusterpki.ErrInvalidNodeID},
		{nodejoin.Request{Token: tok, NodeID: "n1", CSR: csrPEM(t), Addresses: []string{"not an address"}}, clusterpki.ErrInvalidAddress},
	} {
		if _, err := svc.Join(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Fatalf("want %v, got %v", tc.want, err)
		}
	}
	out, err := svc.Join(ctx, nodejoin.Request{Token: tok, NodeID: "n1", CSR: csrPEM(t), Addresses: []string{"10.1.2.3"}})
	if err != nil || out.NodeID != "n1" || out.ControlPlane != clusterpki.ControlPlaneURI {
		t.Fatalf("join: %+v %v", out, err)
	}
	if _, err := svc.Join(ctx, nodejoin.Request{Token: tok, NodeID: "n2", CSR: csrPEM(t)}); !errors.Is(err, nodejoin.ErrTokenRefused) || !errors.Is(err, store.ErrTokenUsed) {
		t.Fatalf("second join: want ErrTokenRefused (used), got %v", err)
	}
}

// joinServer is a control plane's join endpoint over real TLS: the
// cluster certificate for JoinServerName, else other's certificate.
func joinServer(t *testing.T, svc *nodejoin.Service, cp *tls.Certificate, requests *atomic.Int32) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		var req nodejoin.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		out, err := svc.Join(r.Context(), req)
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(map[string]any{"code": 401, "message": err.Error()})
			return
		}
		json.NewEncoder(w).Encode(out)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cp}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestClientJoin(t *testing.T) {
	st, ca := setup(t)
	_, other := setup(t)
	ctx := context.Background()
	cp, err := ca.IssueControlPlane(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	url := joinServer(t, &nodejoin.Service{Store: st, CA: ca}, cp, &requests)
	tok, _, _ := nodejoin.Create(ctx, st, time.Hour, map[string]string{"zone": "b"}, time.Now())
	pin := clusterpki.Pin(ca.Cert)

	// A wrong pin: the connection is refused before any request is sent.
	dir := t.TempDir()
	_, err = nodejoin.Join(ctx, nodejoin.Options{ControlPlane: url, Token: tok, Pin: clusterpki.Pin(other.Cert), NodeID: "n1", DataDir: dir})
	if !errors.Is(err, clusterpki.ErrPinMismatch) || requests.Load() != 0 {
		t.Fatalf("wrong pin: err %v, %d requests reached the server", err, requests.Load())
	}
	if _, err := nodejoin.Join(ctx, nodejoin.Options{ControlPlane: strings.Replace(url, "https", "http", 1), Token: tok, Pin: pin, NodeID: "n1", DataDir: dir}); !errors.Is(err, nodejoin.ErrInsecureURL) {
		t.Fatalf("http URL: want ErrInsecureURL, got %v", err)
	}

	info, err := nodejoin.Join(ctx, nodejoin.Options{ControlPlane: url, Token: tok, Pin: pin, NodeID: "n1", DataDir: dir, Addresses: []string{"127.0.0.1"}})
	if err != nil || info.Labels["zone"] != "b" || info.Identity != clusterpki.ControlPlaneURI {
		t.Fatalf("join: %+v %v", info, err)
	}
	for _, f := range []string{nodejoin.KeyFile, nodejoin.CertFile, nodejoin.CAFile, nodejoin.InfoFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, nodejoin.CertFile), filepath.Join(dir, nodejoin.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if u := pair.Leaf.URIs; len(u) != 1 || u[0].String() != "cubicle://node/n1" {
		t.Fatalf("certificate identity %v", u)
	}
	if _, err := nodejoin.Join(ctx, nodejoin.Options{ControlPlane: url, Token: tok, Pin: pin, NodeID: "n1", DataDir: dir}); !errors.Is(err, nodejoin.ErrAlreadyJoined) {
		t.Fatalf("joined dir: want ErrAlreadyJoined, got %v", err)
	}
	var se *nodejoin.ServerError
	if _, err := nodejoin.Join(ctx, nodejoin.Options{ControlPlane: url, Token: tok, Pin: pin, NodeID: "n2", DataDir: t.TempDir()}); !errors.As(err, &se) || se.Status != 401 {
		t.Fatalf("token used twice: want a 401, got %v", err)
	}
}
