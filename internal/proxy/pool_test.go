package proxy

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// A sandbox that gets the address of a killed one must not inherit the
// proxy's keep-alive connections to it (on runsc the old connection is still
// ESTABLISHED on the host and the new sandbox resets it); connections are
// still reused within one sandbox, and the Host header is the inbound one.
func TestUpstreamConnectionsArePerSandbox(t *testing.T) {
	var mu sync.Mutex
	var remotes, hosts []string
	f := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes = append(remotes, r.RemoteAddr)
		hosts = append(hosts, r.Host)
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	next := &store.Sandbox{ID: "zyxwvutsrq9876543210", TemplateID: "base", State: store.StateRunning, Addr: f.sb.Addr,
		EnvdToken: "envdtok2", TrafficToken: "traffic2", Network: store.Network{AllowPublicTraffic: true},
		StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(context.Background(), next); err != nil {
		t.Fatal(err)
	}
	hostOf := func(id string) string { return strconv.Itoa(f.port) + "-" + id + ".cubicle.test" }
	for _, id := range []string{f.sb.ID, f.sb.ID, next.ID, next.ID} {
		resp, body := get(t, f, "/x", nil, hostOf(id))
		if resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("%s: %d %q", id, resp.StatusCode, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if remotes[0] != remotes[1] || remotes[2] != remotes[3] {
		t.Fatalf("keep-alive not reused within a sandbox: %v", remotes)
	}
	if remotes[1] == remotes[2] {
		t.Fatalf("the second sandbox at %s got the first one's connection %s", f.sb.Addr, remotes[1])
	}
	if hosts[0] != hostOf(f.sb.ID) || hosts[2] != hostOf(next.ID) {
		t.Fatalf("upstream Host headers: %v", hosts)
	}
}
