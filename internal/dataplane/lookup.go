package dataplane

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cubicle-dev/cubicle/internal/node"
)

// SandboxGetter is what a node's Lookup needs: node.Sandboxes' Get.
type SandboxGetter interface {
	Get(ctx context.Context, id string) (node.Sandbox, error)
}

// NodeLookup is the Lookup of the node n: a sandbox n holds, at the
// address n gave it. Its state is not checked: a dial to a sandbox that is
// not running fails on its own, and one that is resuming may be running
// by the time the dial lands. An unknown ID, or a sandbox without an
// address, is ErrUnknownSandbox.
func NodeLookup(n SandboxGetter) Lookup {
	return func(ctx context.Context, id string) (netip.Addr, error) {
		sb, err := n.Get(ctx, id)
		if err != nil {
			return netip.Addr{}, err // node.ErrNotFound is in errdefs.ErrNotFound
		}
		if !sb.Addr.IsValid() {
			return netip.Addr{}, fmt.Errorf("sandbox %s has no address: %w", id, ErrUnknownSandbox)
		}
		return sb.Addr, nil
	}
}
