package nodegrpc

import (
	"context"
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// A request with host mounts is refused before anything is sent to a
// remote node: the directories are the control plane's host's.
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
