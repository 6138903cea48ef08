package dataplane_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
)

func TestMain(m *testing.M) { localnode.Main(m) }

// TestRealSandboxThroughNodeLookup: a real node (runc, its own bridge)
// serves its data plane with NodeLookup; the control plane's client
// reaches the sandbox's agent on the bridge through it, and the sandbox
// is unknown once deleted.
func TestRealSandboxThroughNodeLookup(t *testing.T) {
	l, _ := localnode.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := "dp" + localnode.RandHex(t, 6)
	if _, err := l.Create(ctx, node.CreateRequest{ID: id, Layers: localnode.Layers(t), EnvdToken: "tok", CPUCount: 1, MemoryMB: 256}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			l.Delete(context.Background(), id)
		}
	})
	pki := dataplanetest.NewPKI(t)
	addr, _ := pki.Serve(t, "node-a", dataplane.ServerConfig{Lookup: dataplane.NodeLookup(l)})
	cl := pki.Client(t)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return cl.Dial(ctx, "node-a", addr, id, node.AgentPort)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://sandbox/health")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("the agent's /health through the tunnel: %d", resp.StatusCode)
	}
	if err := l.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if _, err := cl.Dial(ctx, "node-a", addr, id, node.AgentPort); !errors.Is(err, dataplane.ErrUnknownSandbox) {
		t.Fatalf("a deleted sandbox: %v", err)
	}
}
