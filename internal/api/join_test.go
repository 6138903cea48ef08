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
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func joinCSR(t *testing.T) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// TestJoinRoute: POST /nodes/join's answers. The handler sees the TLS
// state a real listener would give it (serve's TLS is TestNodeJoin's).
func TestJoinRoute(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sx, _ := secret.New(st, bytes.Repeat([]byte{5}, secret.KeySize))
	ca, err := clusterpki.LoadOrCreateCA(context.Background(), st, sx)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Join: &nodejoin.Service{Store: st, CA: ca}, Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}, nil, st)
	n := 0
	post := func(body any, sni string, from string) (int, map[string]any, http.Header) {
		t.Helper()
		b, ok := body.(string)
		if !ok {
			raw, _ := json.Marshal(body)
			b = string(raw)
		}
		req := httptest.NewRequest("POST", nodejoin.Path, strings.NewReader(b))
		if from == "" {
			n++ // a new address per request: the rate limit is tested on its own
			from = fmt.Sprintf("10.9.%d.%d:5000", n/250, n%250)
		}
		req.RemoteAddr = from
		if sni != "-" {
			req.TLS = &tls.ConnectionState{ServerName: sni}
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		var out map[string]any
		json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out, rec.Header()
	}
	ctx := context.Background()
	tok, _, _ := nodejoin.Create(ctx, st, time.Hour, map[string]string{"zone": "c"}, time.Now())
	good := nodejoin.Request{Token: tok, NodeID: "node-1", CSR: joinCSR(t), Addresses: []string{"10.0.0.1"}}

	// Not over TLS, or not to the cluster's server name: the client did
	// not check the pin. Refused, and the token is not spent.
	for _, sni := range []string{"-", "api.example.com", ""} {
		if code, out, _ := post(good, sni, ""); code != 400 || out["code"] != float64(400) || !strings.Contains(out["message"].(string), clusterpki.JoinServerName) {
			t.Fatalf("SNI %q: %d %v", sni, code, out)
		}
	}
	if code, out, _ := post(`{"token":"x","nodeID":"n","csr":"","addresses":[],"labels":{"a":"b"}}`, clusterpki.JoinServerName, ""); code != 400 || !strings.Contains(out["message"].(string), `unknown field "labels"`) {
		t.Fatalf("unknown field: %d %v", code, out)
	}
	if code, out, _ := post(`{"token":`, clusterpki.JoinServerName, ""); code != 400 || !strings.Contains(out["message"].(string), "malformed JSON") {
		t.Fatalf("malformed body: %d %v", code, out)
	}
	bad := good
	bad.CSR = "junk"
	if code, out, _ := post(bad, clusterpki.JoinServerName, ""); code != 400 || !strings.Contains(out["message"].(string), "certificate request") {
		t.Fatalf("bad CSR: %d %v", code, out)
	}
	bad = good
	bad.NodeID = "../x"
	if code, out, _ := post(bad, clusterpki.JoinServerName, ""); code != 400 || !strings.Contains(out["message"].(string), "node ID") {
		t.Fatalf("bad node ID: %d %v", code, out)
	}

	code, out, _ := post(good, clusterpki.JoinServerName, "")
	if code != 200 || out["nodeID"] != "node-1" || out["controlPlane"] != clusterpki.ControlPlaneURI || out["labels"].(map[string]any)["zone"] != "c" {
		t.Fatalf("join: %d %v", code, out)
	}
	cert, err := clusterpki.ParseCertPEM([]byte(out["certificate"].(string)))
	if err != nil || cert.URIs[0].String() != "cubicle://node/node-1" {
		t.Fatalf("certificate: %v", err)
	}

	// A node ID with a registry row: 409, and the token stays usable.
	if err := st.RegisterNode(ctx, &store.Node{ID: "node-taken"}); err != nil {
		t.Fatal(err)
	}
	tok2, _, _ := nodejoin.Create(ctx, st, time.Hour, nil, time.Now())
	taken := good
	taken.Token, taken.NodeID = tok2, "node-taken"
	if code, out, _ := post(taken, clusterpki.JoinServerName, ""); code != 409 || out["code"] != float64(409) ||
		!strings.Contains(out["message"].(string), "cubicle node forget node-taken") {
		t.Fatalf("join of a registered node ID: %d %v", code, out)
	}
	taken.NodeID = "node-3"
	if code, out, _ := post(taken, clusterpki.JoinServerName, ""); code != 200 {
		t.Fatalf("the token refused with 409 was spent: %d %v", code, out)
	}

	// Used, expired, unknown and malformed tokens read the same.
	expired, _, _ := nodejoin.Create(ctx, st, time.Minute, nil, time.Now().Add(-time.Hour))
	var msgs []string
	for _, tk := range []string{tok, expired, strings.Repeat("a", 12) + "." + strings.Repeat("b", 32), "nonsense"} {
		r := good
		r.Token, r.NodeID = tk, "node-2"
		code, out, _ := post(r, clusterpki.JoinServerName, "")
		if code != 401 || out["code"] != float64(401) {
			t.Fatalf("token %q: %d %v", tk, code, out)
		}
		msgs = append(msgs, out["message"].(string))
	}
	for _, m := range msgs[1:] {
		if m != msgs[0] {
			t.Fatalf("401 messages differ, telling which tokens exist: %q", msgs)
		}
	}

	// One address is limited (10 at once, 1 a second): 40 in a row cannot
	// all pass however slow the machine.
	limited := false
	for range 40 {
		code, _, h := post(`{}`, clusterpki.JoinServerName, "192.0.2.7:4000")
		if code == 429 {
			if h.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("40 joins from one address were not limited")
	}
}
