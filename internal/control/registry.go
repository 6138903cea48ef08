package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// heartbeatInterval is how often the node's row is renewed: a third of
// the scheduler's default lease TTL, so one missed beat loses nothing.
const heartbeatInterval = 5 * time.Second

// RegisterNode records the node in the store's registry from its Info
// (registering again after a restart updates the row and keeps the
// operator's cordon). serve calls it once at start; Run then heartbeats.
func (m *Manager) RegisterNode(ctx context.Context) error {
	n, err := m.nodeRow(ctx)
	if err != nil {
		return err
	}
	if err := m.store.RegisterNode(ctx, n); err != nil {
		return fmt.Errorf("register node %s: %w", n.ID, err)
	}
	return nil
}

// nodeRow is what the in-process node reports, as a registry row.
func (m *Manager) nodeRow(ctx context.Context) (*store.Node, error) {
	info, err := m.nodeInfo(ctx)
	if err != nil {
		return nil, err
	}
	m.pullsImages.Store(info.Abilities.PullsImages)
	inv, err := m.node.AcceleratorInventory(ctx)
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
		ID: info.ID, Runtime: info.Runtime, Version: info.Version, VolumeDrivers: info.VolumeDrivers, Accelerators: accels,
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
	err = m.store.HeartbeatNode(ctx, n.ID, store.NodeHeartbeat{Address: n.Address, Labels: n.Labels, Capacity: n.Capacity,
		VolumeDrivers: n.VolumeDrivers, Accelerators: n.Accelerators})
	if errors.Is(err, store.ErrNotFound) {
		return m.store.RegisterNode(ctx, n)
	}
	return err
}

func (m *Manager) runHeartbeat(ctx context.Context) {
	t := time.NewTicker(heartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.heartbeat(ctx); err != nil && ctx.Err() == nil {
				m.log.Error("node heartbeat", "err", err)
			}
		}
	}
}

// schedulerNode is the node as the scheduler sees it: what it reports now
// plus the operator's flags from the registry. A node with no row (never
// registered: a Manager whose caller skipped RegisterNode) is schedulable,
// as before the registry existed. Draining implies no new sandboxes.
func (m *Manager) schedulerNode(ctx context.Context, info node.Info) (scheduler.Node, error) {
	inv, err := m.node.AcceleratorInventory(ctx)
	if err != nil {
		return scheduler.Node{}, err
	}
	n := scheduler.Node{ID: info.ID, VolumeDrivers: info.VolumeDrivers, Accelerators: inv}
	row, err := m.store.GetNode(ctx, info.ID)
	switch {
	case err == nil:
		n.Cordoned = row.Cordoned || row.Draining
		n.Labels = row.Labels
	case !errors.Is(err, store.ErrNotFound):
		return scheduler.Node{}, fmt.Errorf("node registry: %w", err)
	}
	return n, nil
}
