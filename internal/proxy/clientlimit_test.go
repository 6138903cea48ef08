package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// Signed /files requests that name no sandbox are looked up against every
// running sandbox; past the burst, one address gets e2b's 429 while
// requests that name their sandbox (header or host) and other addresses
// are served as before.
func TestSignedLookupsAreLimitedPerClient(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	// Many sandboxes: each unrouted lookup hashes the URL with every token.
	for i := range 50 {
		sb := &store.Sandbox{ID: fmt.Sprintf("sbx%017d", i), TemplateID: "base", State: store.StateRunning, Addr: "127.0.0.1",
			EnvdToken: fmt.Sprintf("tok%d", i), Network: store.Network{AllowPublicTraffic: true}, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	// One token an hour: nothing refills while the test runs.
	front := httptest.NewServer(New(Config{Domain: "cubicle.test", SignedLookupRate: 1.0 / 3600, SignedLookupBurst: 3}, nil, st, api))
	t.Cleanup(front.Close)
	u, _ := url.Parse(front.URL)

	from := func(local string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", u.Host)
		}}}
	}
	sig := agentapi.Signature("/home/user/x", "read", "", "tok7", 0)
	path := "/files?path=%2Fhome%2Fuser%2Fx&signature=" + url.QueryEscape(sig)
	do := func(c *http.Client, host string, hdr map[string]string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+u.Host+path, nil)
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b [4096]byte
		n, _ := resp.Body.Read(b[:])
		return resp.StatusCode, string(b[:n]), resp.Header
	}
	a := from("127.0.0.1")
	for i := range 3 {
		// Found (tok7's sandbox), then its agent port is closed: 502 naming it.
		code, body, _ := do(a, "", nil)
		if e := sandboxErr(t, body); code != http.StatusBadGateway || e.SandboxID != "sbx00000000000000007" {
			t.Fatalf("lookup %d: %d %s", i, code, body)
		}
	}
	code, body, h := do(a, "", nil)
	if e := sandboxErr(t, body); code != http.StatusTooManyRequests || e.Code != 429 || e.Message == "" || h.Get("Retry-After") == "" {
		t.Fatalf("4th lookup from one address: %d %s (Retry-After %q), want 429", code, body, h.Get("Retry-After"))
	}
	// Named by header or host: no lookup, no limit.
	if code, body, _ := do(a, "", map[string]string{headerSandboxID: "sbx00000000000000007"}); code != http.StatusBadGateway {
		t.Fatalf("routed by header: %d %s", code, body)
	}
	if code, body, _ := do(a, "49983-sbx00000000000000007.cubicle.test", nil); code != http.StatusBadGateway {
		t.Fatalf("routed by host: %d %s", code, body)
	}
	// Another address has its own bucket.
	if code, body, _ := do(from("127.0.0.2"), "", nil); code != http.StatusBadGateway {
		t.Fatalf("another address: %d %s", code, body)
	}
}
