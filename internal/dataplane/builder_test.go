package dataplane_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestBuilderTarget: on a builder node the control plane's BuilderTarget
// tunnel reaches the node's builder socket (and nothing else); a node that
// is not a builder refuses it with ErrNotBuilder (404); another node's
// identity never gets a tunnel to it; a sandbox-shaped Dial cannot name it.
func TestBuilderTarget(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "buildkitd.sock")
	testenv.Serve(t, "unix", sock, func(c net.Conn) {
		c.Write([]byte("buildkitd:"))
		io.Copy(c, c)
	})
	var dials atomic.Int64
	f := nodeA(t, dataplane.ServerConfig{Builder: func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}})
	c, err := f.cl.DialBuilder(context.Background(), "node-a", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("buildkitd:ping"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "buildkitd:ping" {
		t.Fatalf("through the builder tunnel: %q %v", got, err)
	}
	c.Close()
	if n := dials.Load(); n != 1 {
		t.Fatalf("builder dialled %d times, want 1", n)
	}

	// A node without a builder.
	plain := nodeA(t, dataplane.ServerConfig{})
	_, err = plain.cl.DialBuilder(context.Background(), "node-a", plain.addr)
	var te *dataplane.TunnelError
	if !errors.Is(err, dataplane.ErrNotBuilder) || !errors.As(err, &te) || te.Status != http.StatusNotFound {
		t.Fatalf("builder tunnel to a node that is not a builder: %v", err)
	}

	// Another node's certificate: refused at the handshake.
	peer, err := dataplane.NewClient(f.pki.Node(t, "node-b"), f.pki.CA.Cert, f.pki.Store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.DialBuilder(context.Background(), "node-a", f.addr); err == nil || errors.As(err, &te) {
		t.Fatalf("a node's identity opened the builder tunnel: %v", err)
	}
	// The sandbox form cannot spell the builder's name.
	if _, err := f.cl.Dial(context.Background(), "node-a", f.addr, "buildkitd.cubicle.invalid", 1); !errors.Is(err, dataplane.ErrBadTarget) {
		t.Fatalf("a sandbox dial naming the builder: %v", err)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("builder dialled %d times, want 1", n)
	}
}
