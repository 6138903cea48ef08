package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// heartbeatInterval is how often the node's row is renewed: a third of
// the scheduler's default lease TTL, so one missed beat loses nothing.
const heartbeatInterval = 5 * time.Second

// RegisterNode records the in-process node in the store's registry from
// its Info (registering again after a restart updates the row and keeps
// the operator's cordon). serve calls it once at start; Run then
// heartbeats. A pure control plane has no in-process node: remote nodes
// register themselves.
func (m *Manager) RegisterNode(ctx context.Context) error {
	if _, ok := m.nodes.Local(); !ok {
		return nil
	}
	n, err := m.nodeRow(ctx)
	if err != nil {
		return err
	}
	if err := m.ownID(ctx, n.ID); err != nil {
		return err
	}
	if err := m.store.RegisterNode(ctx, n); err != nil {
		return fmt.Errorf("register node %s: %w", n.ID, err)
	}
	return nil
}

// ownID refuses an ID a remote node joined under (after the in-process
// node's row was forgotten): registering or heartbeating under it would
// make the two nodes share one row, and replicas without the in-process
// node would send its sandboxes' calls to the remote node.
func (m *Manager) ownID(ctx context.Context, id string) error {
	joined, err := m.store.NodeJoined(ctx, id)
	if err != nil {
		return fmt.Errorf("node %s: %w", id, err)
	}
	if joined {
		return fmt.Errorf("%w: node ID %s was joined by a remote node (`cubicle node join`), so this process's in-process node does not take it: give this serve another --node-id, or `cubicle node forget %s` first", ErrConflict, id, id)
	}
	return nil
}

// nodeRow is what the in-process node reports, as a registry row.
func (m *Manager) nodeRow(ctx context.Context) (*store.Node, error) {
	id, _ := m.nodes.Local()
	nd := m.nodes.LocalNode()
	info, err := m.nodeInfo(ctx, nd, id)
	if err != nil {
		return nil, err
	}
	inv, err := nd.AcceleratorInventory(ctx)
	if err != nil {
		return nil, fmt.Errorf("node accelerators: %w", err)
	}
	var accels string
	if len(inv) > 0 {
		b, err := json.Marshal(inv)
		if err != nil {
			return nil, err
		}
		accels = string(b)
	}
	return &store.Node{
		ID: id, Runtime: info.Runtime, Version: info.Version, VolumeDrivers: info.VolumeDrivers, Accelerators: accels,
		// Disk has no host size here: embedded disk admission is the disk
		// budget (diskbudget), not the registry.
		Capacity: store.Capacity{MilliCPU: int64(info.Capacity.CPUs) * 1000, MemoryMiB: int64(info.Capacity.MemoryBytes >> 20)},
	}, nil
}

// heartbeat renews the node's row with the facts that change. A node
// forgotten while it runs (`cubicle node forget` with no live sandboxes)
// registers again: it is alive, so it belongs in the registry.
func (m *Manager) heartbeat(ctx context.Context) error {
	n, err := m.nodeRow(ctx)
	if err != nil {
		return err
	}
	if err := m.ownID(ctx, n.ID); err != nil {
		return err
	}
	err = m.store.HeartbeatNode(ctx, n.ID, store.NodeHeartbeat{Address: n.Address, Labels: n.Labels, Capacity: n.Capacity,
		VolumeDrivers: n.VolumeDrivers, Accelerators: n.Accelerators})
	if errors.Is(err, store.ErrNotFound) {
		return m.store.RegisterNode(ctx, n)
	}
	return err
}
