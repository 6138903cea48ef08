package dataplane

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cubicle-dev/cubicle/internal/node"
)

// SandboxAddresser is what a node's Lookup needs: node.Local's Address,
// which reads the node's own endpoints without asking the runtime (Get
// runs the runtime's state query, a process per tunnel).
type SandboxAddresser interface {
	// Address is the sandbox's address on the node's bridge;
	// node.ErrNotFound for a sandbox the node does not hold.
	Address(ctx context.Context, id string) (netip.Addr, error)
}

var _ SandboxAddresser = (*node.Local)(nil)

// NodeLookup is the Lookup of the node n: a sandbox n holds, at the
// address n gave it. Its state is not checked: a dial to a sandbox that is
// not running fails on its own, and one that is resuming may be running
// by the time the dial lands. An unknown ID, or a sandbox without an
// address, is ErrUnknownSandbox.
func NodeLookup(n SandboxAddresser) Lookup {
	return func(ctx context.Context, id string) (netip.Addr, error) {
		addr, err := n.Address(ctx, id)
		if err != nil {
			return netip.Addr{}, err // node.ErrNotFound is in errdefs.ErrNotFound
		}
		if !addr.IsValid() {
			return netip.Addr{}, fmt.Errorf("sandbox %s has no address: %w", id, ErrUnknownSandbox)
		}
		return addr, nil
	}
}
