package control

import (
	"context"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Nodes is the set of nodes the manager drives (the in-process node in
// embedded mode; remote nodes in cluster mode).
func (m *Manager) Nodes() *nodeset.Set { return m.nodes }

// NodeByID returns node id; nodeset.ErrUnknownNode when the set has none.
func (m *Manager) NodeByID(ctx context.Context, id string) (node.Node, error) {
	return m.nodeFor(ctx, id)
}

// nodeFor returns the node called id. A row written before nodes had
// names ("") is the local node's.
func (m *Manager) nodeFor(ctx context.Context, id string) (node.Node, error) {
	if id == "" {
		if lid, ok := m.nodes.Local(); ok {
			id = lid
		}
	}
	n, err := m.nodes.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", id, err)
	}
	return n, nil
}

// nodeOf returns the node that holds sb.
func (m *Manager) nodeOf(ctx context.Context, sb *store.Sandbox) (node.Node, error) {
	return m.nodeFor(ctx, sb.Node)
}

// deleteOn removes sb from its node. A node the set does not know (it
// was forgotten) holds nothing the control plane can reach: the error
// says so and the reconciler retries once the node is back.
func (m *Manager) deleteOn(ctx context.Context, sb *store.Sandbox) error {
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return err
	}
	return nd.Delete(ctx, sb.ID)
}

func (m *Manager) runOn(ctx context.Context, sb *store.Sandbox, cmd string) (int, error) {
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return -1, err
	}
	return nd.Run(ctx, sb.ID, sb.EnvdToken, sb.DefaultUser, cmd)
}
