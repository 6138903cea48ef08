package nodegrpc

import (
	"context"
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// The node protocol does not carry host mounts: a request with one is
// refused before anything is sent, never passed on without them.
func TestHostMountsAreNotSentToARemoteNode(t *testing.T) {
	c := &Client{} // no connection: nothing may be sent
	req := node.CreateRequest{ID: "x", Mounts: []runtime.Mount{{Source: "/data/shared/a", Destination: "/mnt/a", Under: "/data/shared"}}}
	if _, err := c.Create(context.Background(), req); !errors.Is(err, node.ErrHostMountsRemote) {
		t.Fatalf("create: %v", err)
	}
	if err := c.Resume(context.Background(), "x", req); !errors.Is(err, node.ErrHostMountsRemote) {
		t.Fatalf("resume: %v", err)
	}
	if err := c.Rebuild(context.Background(), "x", req); !errors.Is(err, node.ErrHostMountsRemote) {
		t.Fatalf("rebuild: %v", err)
	}
}
