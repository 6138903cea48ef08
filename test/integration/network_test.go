package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func sandboxIP(t *testing.T, s *server, c created) string {
	t.Helper()
	out := s.mustRun(c, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1")
	return strings.TrimSpace(out)
}

// A port a sandbox process listens on is reachable through the proxy by
// Host name and by headers; other sandboxes cannot reach it directly.
func TestUserPortProxyAndIsolation(t *testing.T) {
	s := startServer(t, "--domain", "cubicle.test")
	a := s.create(map[string]any{"templateID": "base"})
	b := s.create(map[string]any{"templateID": "base"})
	s.mustRun(b, "mkdir -p /tmp/www && echo hello-from-b > /tmp/www/index.html && (python3 -m http.server 8080 --directory /tmp/www >/dev/null 2>&1 &)")
	bIP := sandboxIP(t, s, b)
	if bIP == "" {
		t.Fatal("sandbox B has no address")
	}
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("GET", s.URL+"/index.html", nil)
		req.Host = fmt.Sprintf("8080-%s.cubicle.test", b.SandboxID)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				body = string(raw)
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if body != "hello-from-b\n" {
		t.Fatalf("proxy to sandbox port 8080 by Host: %q", body)
	}
	req, _ := http.NewRequest("GET", s.URL+"/index.html", nil)
	req.Header.Set("E2b-Sandbox-Id", b.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", "8080")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("proxy to sandbox port by headers: %v %v", resp, err)
	}
	resp.Body.Close()
	// B can reach itself, A cannot reach B.
	// bash's /dev/tcp: busybox's static wget crashes in glibc's resolver.
	fetch := "timeout 3 bash -c 'exec 3<>/dev/tcp/" + bIP + "/8080; printf \"GET /index.html HTTP/1.0\\r\\n\\r\\n\" >&3; cat <&3'"
	if out := s.mustRun(b, fetch); !strings.HasSuffix(out, "hello-from-b\n") {
		t.Fatalf("B to itself: %q", out)
	}
	if _, _, code, err := s.run(a, fetch); err != nil || code == 0 {
		t.Fatalf("sandbox A reached sandbox B (code %d, err %v)", code, err)
	}
}

// allowInternetAccess=false blocks egress to addresses outside the sandbox
// (here: the bridge gateway, i.e. the host, on a port with a listener).
func TestHostServicesUnreachable(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base", "allow_internet_access": false})
	gw := strings.TrimSpace(s.mustRun(c, "ip route | awk '/default/ {print $3}'"))
	if gw == "" {
		t.Fatal("no default gateway in sandbox")
	}
	// The API server listens on 127.0.0.1 only, so probe the agent-facing
	// gateway on the API port: the sandbox must not get a connection.
	port := s.listenOn[strings.LastIndex(s.listenOn, ":")+1:]
	if _, _, code, err := s.run(c, "timeout 3 bash -c 'echo > /dev/tcp/"+gw+"/"+port+"'"); err != nil || code == 0 {
		t.Fatalf("sandbox connected to the host at %s:%s (code %d, err %v)", gw, port, code, err)
	}
	var detail map[string]any
	s.do("GET", "/sandboxes/"+c.SandboxID, nil, &detail)
	if detail["allowInternetAccess"] != false {
		t.Fatalf("allowInternetAccess not stored: %v", detail["allowInternetAccess"])
	}
}

func TestResolvConfMounted(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base"})
	out := s.mustRun(c, "cat /etc/resolv.conf; (echo x > /etc/resolv.conf) 2>/dev/null && echo writable; true")
	if !strings.Contains(out, "nameserver ") || strings.Contains(out, "writable") || strings.Contains(out, "127.0.0.") {
		t.Fatalf("resolv.conf in sandbox: %q", out)
	}
}
