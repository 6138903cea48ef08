package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/servecert"
)

// hostEcho answers every GET with the Host header it received.
const hostEcho = `python3 -c '
import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(s):
        b = s.headers.get("Host", "").encode()
        s.send_response(200); s.send_header("Content-Length", str(len(b))); s.end_headers(); s.wfile.write(b)
    def log_message(s, *a): pass
h.HTTPServer(("0.0.0.0", 8000), H).serve_forever()' >/dev/null 2>&1 &`

// TestTLSDomain: `serve --domain D --tls-self-signed` serves the API at
// https://api.D and sandboxes at https://<port>-<id>.D on one port, with a
// certificate from a local CA that it keeps across restarts; the e2b SDKs'
// E2B_DOMAIN-only URLs work against it. Names resolve through the client's
// dialer (every name goes to the server's address), so no DNS or
// /etc/hosts changes are needed.
func TestTLSDomain(t *testing.T) {
	const domain = "cubicle.test"
	s := newServer(t, nil, "--domain", domain, "--tls-self-signed")
	// The CA is made by the code serve runs, before it starts, so the client
	// trusts the server from its first request (serve reuses it).
	_, caPath, err := servecert.SelfSigned(filepath.Join(s.DataDir, "tls"), domain)
	if err != nil {
		t.Fatal(err)
	}
	pemCA, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, s.listenOn)
		},
	}
	s.client = &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	s.URL = "https://api." + domain
	s.start()

	// The API over TLS, negotiated as HTTP/2.
	resp, err := s.client.Get(s.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.TLS == nil {
		t.Fatalf("health over %s, TLS %v: want HTTP/2 over TLS", resp.Proto, resp.TLS != nil)
	}

	c := s.create(map[string]any{"templateID": "base", "network": map[string]any{"maskRequestHost": "app.local:${PORT}"}})
	if out := s.mustRun(c, "echo over-tls"); strings.TrimSpace(out) != "over-tls" {
		t.Fatalf("command through the TLS listener: %q", out)
	}
	s.mustRun(c, hostEcho)
	host := fmt.Sprintf("8000-%s.%s", c.SandboxID, domain)
	var body string
	for i := 0; i < 50; i++ {
		resp, err := s.client.Get("https://" + host + "/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				body = string(b)
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	// getHost(8000) over https reaches the service, which sees the mask.
	if body != "app.local:8000" {
		t.Fatalf("https://%s answered %q, want the masked host app.local:8000", host, body)
	}

	// A certificate that does not cover the domain stops serve at start.
	bad := newServer(t, nil, "--domain", "other.test", "--tls-cert", filepath.Join(s.DataDir, "tls", "server.pem"),
		"--tls-key", filepath.Join(s.DataDir, "tls", "server-key.pem"))
	out, err := bad.command().CombinedOutput()
	if err == nil || !strings.Contains(string(out), "api.other.test is not covered") {
		t.Fatalf("serve with a certificate for another domain: %v\n%s", err, out)
	}
}
