package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

type fixture struct {
	st       *sqlite.Store
	front    *httptest.Server
	upstream *httptest.Server
	port     int
	sb       *store.Sandbox
}

func setup(t *testing.T, upstream http.Handler) *fixture {
	t.Helper()
	return setupNet(t, upstream, false, store.Network{AllowPublicTraffic: true})
}

// setupNet is setup with the sandbox's network config, and an upstream that
// speaks TLS when tlsUp is set.
func setupNet(t *testing.T, upstream http.Handler, tlsUp bool, nw store.Network) *fixture {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	up := httptest.NewUnstartedServer(upstream)
	if tlsUp {
		up.StartTLS()
	} else {
		up.Start()
	}
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	port, _ := strconv.Atoi(u.Port())
	sb := &store.Sandbox{ID: "abcdefghij0123456789", TemplateID: "base", State: store.StateRunning, Addr: "127.0.0.1",
		EnvdToken: "envdtok", TrafficToken: "traffic", Network: nw,
		StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
	if err := st.CreateSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-From", "api")
		w.WriteHeader(http.StatusTeapot)
	})
	front := httptest.NewServer(New(Config{Domain: "cubicle.test"}, nil, st, api))
	t.Cleanup(front.Close)
	return &fixture{st: st, front: front, upstream: up, port: port, sb: sb}
}

func echoPath() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s tt=%q", r.Method, r.URL.RequestURI(), r.Header.Get(headerTrafficToken))
	})
}

func get(t *testing.T, f *fixture, path string, hdr map[string]string, host string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.front.URL+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestRoutesByHeadersAndHost(t *testing.T) {
	f := setup(t, echoPath())
	resp, body := get(t, f, "/files?path=x", map[string]string{headerSandboxID: f.sb.ID, headerSandboxPort: strconv.Itoa(f.port)}, "")
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "GET /files?path=x") {
		t.Fatalf("header routing: %d %q", resp.StatusCode, body)
	}
	resp, body = get(t, f, "/hello", nil, fmt.Sprintf("%d-%s.cubicle.test", f.port, f.sb.ID))
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "GET /hello") {
		t.Fatalf("host routing: %d %q", resp.StatusCode, body)
	}
	// Anything else is the API's.
	resp, _ = get(t, f, "/v2/sandboxes", nil, "")
	if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-From") != "api" {
		t.Fatalf("api fallthrough: %d", resp.StatusCode)
	}
	// A host under another domain is not a sandbox host.
	resp, _ = get(t, f, "/", nil, fmt.Sprintf("%d-%s.elsewhere.test", f.port, f.sb.ID))
	if resp.StatusCode != http.StatusTeapot {
		t.Fatalf("foreign domain: %d", resp.StatusCode)
	}
}

func errBody(t *testing.T, status int, body string) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != status || e.Message == "" {
		t.Fatalf("error body %q for status %d", body, status)
	}
}

func TestRejections(t *testing.T) {
	f := setup(t, echoPath())
	hdr := func(id string, port int) map[string]string {
		return map[string]string{headerSandboxID: id, headerSandboxPort: strconv.Itoa(port)}
	}
	resp, body := get(t, f, "/", hdr("zzzzzzzzzzzzzzzzzzzz", f.port), "")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("unknown sandbox: %d", resp.StatusCode)
	}
	errBody(t, resp.StatusCode, body)
	resp, body = get(t, f, "/", hdr("BAD/ID", f.port), "")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad id: %d", resp.StatusCode)
	}
	errBody(t, resp.StatusCode, body)
	resp, _ = get(t, f, "/", map[string]string{headerSandboxID: f.sb.ID, headerSandboxPort: "99999"}, "")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad port: %d", resp.StatusCode)
	}
	resp, _ = get(t, f, "/init", hdr(f.sb.ID, 49983), "")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("/init from outside: %d", resp.StatusCode)
	}
	// Killed sandboxes are gone from the data plane.
	f.sb.State = store.StateKilled
	f.st.UpdateSandbox(context.Background(), f.sb)
	resp, _ = get(t, f, "/", hdr(f.sb.ID, f.port), "")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("killed sandbox: %d", resp.StatusCode)
	}
}

func TestTrafficToken(t *testing.T) {
	f := setup(t, echoPath())
	f.sb.Network.AllowPublicTraffic = false
	f.st.UpdateSandbox(context.Background(), f.sb)
	host := fmt.Sprintf("%d-%s.cubicle.test", f.port, f.sb.ID)
	resp, _ := get(t, f, "/", nil, host)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	resp, _ = get(t, f, "/", map[string]string{headerTrafficToken: "wrong"}, host)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("wrong token: %d", resp.StatusCode)
	}
	resp, body := get(t, f, "/", map[string]string{headerTrafficToken: "traffic"}, host)
	if resp.StatusCode != 200 || !strings.Contains(body, `tt=""`) {
		t.Fatalf("right token: %d %q (token must be stripped before the sandbox)", resp.StatusCode, body)
	}
}

// Streaming responses must reach the client before the upstream finishes.
func TestStreamingIsNotBuffered(t *testing.T) {
	release := make(chan struct{})
	f := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first\n"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		w.Write([]byte("second\n"))
	}))
	defer close(release)
	req, _ := http.NewRequest(http.MethodPost, f.front.URL+"/process.Process/Start", strings.NewReader("x"))
	req.Header.Set(headerSandboxID, f.sb.ID)
	req.Header.Set(headerSandboxPort, strconv.Itoa(f.port))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
}

func TestWebSocketUpgradePassesThrough(t *testing.T) {
	f := setup(t, wsEcho())
	u, _ := url.Parse(f.front.URL)
	conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkWSEcho(t, f, conn)
}

// A TLS listener that offers HTTP/2 still upgrades WebSockets: clients ask
// for http/1.1 by ALPN, as browsers and ws libraries do (serve --tls-*).
func TestWebSocketUpgradeOverTLS(t *testing.T) {
	f := setup(t, wsEcho())
	front := httptest.NewUnstartedServer(New(Config{Domain: "cubicle.test"}, nil, f.st, http.NotFoundHandler()))
	front.EnableHTTP2 = true
	front.StartTLS()
	t.Cleanup(front.Close)
	roots := x509.NewCertPool()
	roots.AddCert(front.Certificate())
	conn, err := tls.Dial("tcp", front.Listener.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "example.com", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	checkWSEcho(t, f, conn)
}

// wsEcho upgrades and echoes one line over the upgraded connection.
func wsEcho() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want upgrade", 400)
			return
		}
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		line, _ := rw.ReadString('\n')
		rw.WriteString("echo:" + line)
		rw.Flush()
	})
}

func checkWSEcho(t *testing.T, f *fixture, conn net.Conn) {
	t.Helper()
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %d-%s.cubicle.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", f.port, f.sb.ID)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprintf(conn, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo:ping\n" {
		t.Fatalf("echo: %q %v", line, err)
	}
}

func TestSignedURLFindsSandbox(t *testing.T) {
	f := setup(t, echoPath())
	// The signed URL has no sandbox headers; the agent port is fixed, so point
	// the row at an address where nothing listens and check routing by status.
	sig := agentapi.Signature("/home/user/x", "read", "", "envdtok", 0)
	resp, body := get(t, f, "/files?path=%2Fhome%2Fuser%2Fx&signature="+url.QueryEscape(sig), nil, "")
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusBadGateway || e.SandboxID != f.sb.ID || e.Port != 49983 {
		t.Fatalf("signed URL should be routed to the sandbox agent: %d %q", resp.StatusCode, body)
	}
	// envd's text for a wrong signature (envd/internal/api/auth.go).
	resp, body = get(t, f, "/files?path=%2Fhome%2Fuser%2Fx&signature=v1_bogus", nil, "")
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusUnauthorized || e.Code != 401 || e.Message != "invalid signature" {
		t.Fatalf("bad signature: %d %q", resp.StatusCode, body)
	}
}

// sandboxErr decodes e2b's proxy error body.
func sandboxErr(t *testing.T, body string) (e struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
	Port      int    `json:"port"`
}) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e
}

// A gone sandbox gets e2b's client-proxy body; only a caller holding its
// token learns how it ended.
func TestGoneSandboxBody(t *testing.T) {
	f := setup(t, echoPath())
	unknown := "zzzzzzzzzzzzzzzzzzzz"
	resp, body := get(t, f, "/", map[string]string{headerSandboxID: unknown}, "")
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusBadGateway || e.Code != 502 || e.Message != "The sandbox was not found" || e.SandboxID != unknown {
		t.Fatalf("unknown sandbox: %d %s", resp.StatusCode, body)
	}
	f.sb.State, f.sb.KillReason, f.sb.KilledAt = store.StateKilled, "out of memory", time.Now()
	if err := f.st.UpdateSandbox(context.Background(), f.sb); err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("%d-%s.cubicle.test", f.port, f.sb.ID)
	resp, body = get(t, f, "/", nil, host)
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusBadGateway || e.Message != "The sandbox was not found" || e.SandboxID != f.sb.ID {
		t.Fatalf("killed sandbox, no token: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, f, "/", map[string]string{"X-Access-Token": "envdtok"}, host)
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusBadGateway || !strings.HasPrefix(e.Message, "The sandbox was not found: out of memory at ") {
		t.Fatalf("killed sandbox, with token: %d %s", resp.StatusCode, body)
	}
}

// A live sandbox whose port refuses the dial is not a timeout: other ports
// get e2b's port-closed body, the code interpreter's port a 404 that says why.
func TestRefusedPort(t *testing.T) {
	f := setup(t, echoPath())
	port := freePort(t)
	resp, body := get(t, f, "/", nil, fmt.Sprintf("%d-%s.cubicle.test", port, f.sb.ID))
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusBadGateway || e.Code != 502 ||
		e.Message != "The sandbox is running but port is not open" || e.SandboxID != f.sb.ID || e.Port != port {
		t.Fatalf("closed port: %d %s", resp.StatusCode, body)
	}

	// Port 49999 on an address of its own, so that nothing on this host
	// answers there.
	f.sb.Addr, f.sb.Alias = "127.0.0.87", "my-tpl"
	if err := f.st.UpdateSandbox(context.Background(), f.sb); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.87:49999", time.Second); err == nil {
		c.Close()
		testenv.Skip(t, "something listens on 127.0.0.87:49999")
	}
	req, _ := http.NewRequest(http.MethodPost, f.front.URL+"/execute", strings.NewReader(`{"code":"1"}`))
	req.Host = "49999-" + f.sb.ID + ".cubicle.test"
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	e := sandboxErr(t, string(b))
	want := "no code interpreter is running in sandbox " + f.sb.ID + " (nothing listens on port 49999): its template my-tpl (base) has no python3 with ipykernel; create the sandbox from code-interpreter-v1 or a template built from it"
	if r2.StatusCode != http.StatusNotFound || e.Code != 404 || e.Message != want || e.Port != 49999 || e.SandboxID != f.sb.ID {
		t.Fatalf("code interpreter port: %d %s", r2.StatusCode, b)
	}
	// The code interpreter template does have one: it is not running (yet).
	f.sb.TemplateID, f.sb.Alias = "code-interpreter-v1", ""
	if err := f.st.UpdateSandbox(context.Background(), f.sb); err != nil {
		t.Fatal(err)
	}
	resp, body = get(t, f, "/execute", nil, "49999-"+f.sb.ID+".cubicle.test")
	if e := sandboxErr(t, body); resp.StatusCode != http.StatusNotFound || !strings.HasSuffix(e.Message, "(nothing listens on port 49999): the interpreter found no kernel it could start, or the agent has exited (the sandbox image may have been changed)") {
		t.Fatalf("code interpreter template, port closed: %d %s", resp.StatusCode, body)
	}
}

// The copy buffer size is load-bearing for SDK download speed (see buffers.go).
func TestCopyBufferIs64KiB(t *testing.T) {
	p := New(Config{}, nil, nil, nil)
	b := p.rp.BufferPool.Get()
	if len(b) < copyBufferSize || copyBufferSize < 64<<10 {
		t.Fatalf("copy buffer %d bytes, want >= 64 KiB", len(b))
	}
	p.rp.BufferPool.Put(b)
}

// CubeSandbox's run_code carries the team's API key and no access token:
// the owner's key gets the interpreter the sandbox's token, and no API key
// ever reaches the sandbox.
func TestInterpreterAuthByOwnerKey(t *testing.T) {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", codeInterpreterPort))
	if err != nil {
		t.Fatalf("this test needs 127.0.0.1:%d: %v", codeInterpreterPort, err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "token=%q key=%q", r.Header.Get(headerAccessToken), r.Header.Get(headerAPIKey))
	})}
	go up.Serve(ln)
	t.Cleanup(func() { up.Close() })
	f := setup(t, echoPath())
	ctx := context.Background()
	f.sb.TeamID = store.DefaultTeamID
	if err := f.st.UpdateSandbox(ctx, f.sb); err != nil {
		t.Fatal(err)
	}
	if err := f.st.CreateTeam(ctx, &store.Team{ID: "t_other", Name: "other"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []*store.APIKey{
		{ID: "k1", TeamID: store.DefaultTeamID, Name: "owner", Hash: hashKey("owner-key"), Prefix: "o"},
		{ID: "k2", TeamID: "t_other", Name: "other", Hash: hashKey("other-key"), Prefix: "x"},
	} {
		if err := f.st.CreateAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	hdr := func(key string) map[string]string {
		return map[string]string{headerSandboxID: f.sb.ID, headerSandboxPort: strconv.Itoa(codeInterpreterPort), headerAPIKey: key}
	}
	if _, body := get(t, f, "/execute", hdr("owner-key"), ""); body != `token="envdtok" key=""` {
		t.Fatalf("owner's key: %s", body)
	}
	if _, body := get(t, f, "/execute", hdr("other-key"), ""); body != `token="" key=""` {
		t.Fatalf("another team's key: %s", body)
	}
	if _, body := get(t, f, "/execute", hdr("nope"), ""); body != `token="" key=""` {
		t.Fatalf("an unknown key: %s", body)
	}
}

func TestMaskRequestHost(t *testing.T) {
	host := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.Host) })
	f := setupNet(t, host, false, store.Network{AllowPublicTraffic: true, MaskRequestHost: "localhost:${PORT}"})
	_, body := get(t, f, "/", nil, fmt.Sprintf("%d-%s.cubicle.test", f.port, f.sb.ID))
	if want := fmt.Sprintf("localhost:%d", f.port); body != want {
		t.Fatalf("the service saw Host %q, want the mask %q", body, want)
	}
	// Without a mask the service sees the public host.
	g := setup(t, host)
	pub := fmt.Sprintf("%d-%s.cubicle.test", g.port, g.sb.ID)
	if _, body := get(t, g, "/", nil, pub); body != pub {
		t.Fatalf("Host %q, want %q", body, pub)
	}
}

func TestHTTPSPortsReachTheSandboxOverTLS(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v", r.TLS != nil)
	})
	// A self-signed backend (httptest's own certificate) works, as e2b documents.
	f := setupNet(t, h, true, store.Network{AllowPublicTraffic: true})
	f.sb.Network.HTTPSPorts = []int{f.port}
	if err := f.st.UpdateSandbox(context.Background(), f.sb); err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, f, "/", nil, fmt.Sprintf("%d-%s.cubicle.test", f.port, f.sb.ID))
	if resp.StatusCode != http.StatusOK || body != "tls=true" {
		t.Fatalf("%d %q, want 200 tls=true", resp.StatusCode, body)
	}
	// The same TLS backend without httpsPorts gets plain HTTP, which it refuses.
	f.sb.Network.HTTPSPorts = nil
	if err := f.st.UpdateSandbox(context.Background(), f.sb); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, f, "/", nil, fmt.Sprintf("%d-%s.cubicle.test", f.port, f.sb.ID)); resp.StatusCode == http.StatusOK {
		t.Fatal("plain HTTP to a TLS port answered 200: httpsPorts is not what decides")
	}
}
