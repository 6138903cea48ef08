package dataplane_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/runtime"
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

// inspectCounter is the node's real runc driver, counting Inspect calls.
type inspectCounter struct {
	runtime.Driver
	n atomic.Int64
}

func (c *inspectCounter) Inspect(ctx context.Context, id string) (runtime.Info, error) {
	c.n.Add(1)
	return c.Driver.Inspect(ctx, id)
}

// TestNodeLookupSkipsTheRuntime: a tunnel's lookup reads the node's own
// endpoints and never runs the runtime's state query (a `runc state`
// process per tunnel was most of a tunnel's cost: docs/cluster.md,
// "Cluster create latency"); it still finds the address the sandbox was
// given, and a sandbox the node does not hold (never had, or deleted) is
// not found.
func TestNodeLookupSkipsTheRuntime(t *testing.T) {
	counter := &inspectCounter{}
	l, _ := localnode.NewWithRuntime(t, func(d runtime.Driver) runtime.Driver {
		counter.Driver = d
		return counter
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := "dp" + localnode.RandHex(t, 6)
	sb, err := l.Create(ctx, node.CreateRequest{ID: id, Layers: localnode.Layers(t), EnvdToken: "tok", CPUCount: 1, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			l.Delete(context.Background(), id)
		}
	})
	lookup := dataplane.NodeLookup(l)
	before := counter.n.Load()
	for range 3 {
		addr, err := lookup(ctx, id)
		if err != nil || addr != sb.Addr || !addr.IsValid() {
			t.Fatalf("lookup: %v, %v; the sandbox was given %v", addr, err, sb.Addr)
		}
	}
	if n := counter.n.Load() - before; n != 0 {
		t.Fatalf("3 lookups ran the runtime's Inspect %d times", n)
	}
	if _, err := lookup(ctx, "dpnosuchsandbox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown sandbox: %v", err)
	}
	if err := l.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if _, err := lookup(ctx, id); !errors.Is(err, errdefs.ErrNotFound) || !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("a deleted sandbox: %v", err)
	}
}
