package buildkit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestRelayUpstream: with Config.Upstream (a builder node's: TLS to the
// control plane's registry) the relay inside the builder's netns forwards
// buildkitd's plain HTTP over the connection Upstream opens, and still
// serves only the owner process: another process in the namespace gets
// nothing from the upstream.
func TestRelayUpstream(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces")
	testenv.LookPath(t, "nsenter")
	testenv.LookPath(t, "curl")
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("upstream tls=" + map[bool]string{true: "yes", false: "no"}[r.TLS != nil] + " path=" + r.URL.Path))
	}))
	defer up.Close()
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	var asked atomic.Value
	upstream := func(ctx context.Context, registry string) (net.Conn, error) {
		asked.Store(registry)
		d := tls.Dialer{Config: &tls.Config{RootCAs: roots, ServerName: "example.com"}}
		return d.DialContext(ctx, "tcp", up.Listener.Addr().String())
	}
	ns := testNetns(t)
	var owner atomic.Int64
	ready := make(chan struct{})
	r, err := startRelays(ns, []string{"127.0.0.1:5000"}, func() int { <-ready; return int(owner.Load()) }, upstream)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	curl := func(asOwner bool) string {
		t.Helper()
		cmd := exec.Command("nsenter", "--net="+ns, "curl", "-s", "--max-time", "20", "http://127.0.0.1:5000/v2/")
		var out strings.Builder
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if asOwner {
			// nsenter execs curl in the same process: its pid is the
			// socket's holder.
			owner.Store(int64(cmd.Process.Pid))
		} else {
			owner.Store(1) // a process that holds no socket of this netns
		}
		select {
		case <-ready:
		default:
			close(ready)
		}
		cmd.Wait()
		return out.String()
	}
	if got := curl(true); got != "upstream tls=yes path=/v2/" {
		t.Fatalf("through the relay: %q", got)
	}
	if got, _ := asked.Load().(string); got != "127.0.0.1:5000" {
		t.Fatalf("Upstream was asked for %q", got)
	}
	if got := curl(false); got != "" {
		t.Fatalf("a process other than the owner got %q through the relay", got)
	}
}
