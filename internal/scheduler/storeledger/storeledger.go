// Package storeledger is the scheduler.Ledger over the store's capacity
// ledger: every control-plane replica reserves through the same database
// transaction, so a node is never oversold across replicas (SERIALIZABLE
// on PostgreSQL, the single writer on SQLite).
package storeledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Ledger adapts a store.CapacityLedger to scheduler.Ledger. It holds no
// state of its own: any number of Ledgers over one database agree.
type Ledger struct{ s store.CapacityLedger }

var _ scheduler.Ledger = (*Ledger)(nil)

// New returns the Ledger kept in s.
func New(s store.CapacityLedger) *Ledger { return &Ledger{s: s} }

func toStore(r scheduler.Resources) store.Capacity {
	return store.Capacity{MilliCPU: r.MilliCPU, MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB}
}

func fromStore(c store.Capacity) scheduler.Resources {
	return scheduler.Resources{MilliCPU: c.MilliCPU, MemoryMiB: c.MemoryMiB, DiskMiB: c.DiskMiB}
}

// SetNode implements scheduler.Ledger.
func (l *Ledger) SetNode(ctx context.Context, nodeID string, a scheduler.Resources) error {
	if nodeID == "" || !a.Valid() {
		return fmt.Errorf("%w: node %q allocatable %+v", scheduler.ErrInvalid, nodeID, a)
	}
	return l.s.SetAllocatable(ctx, nodeID, toStore(a))
}

// Reserve implements scheduler.Ledger: scheduler.Admit judges inside the
// store's transaction, so the capacity rule is the MemLedger's exactly.
func (l *Ledger) Reserve(ctx context.Context, sandboxID, nodeID string, r scheduler.Resources) error {
	if sandboxID == "" || !r.Valid() {
		return fmt.Errorf("%w: sandbox %q resources %+v", scheduler.ErrInvalid, sandboxID, r)
	}
	err := l.s.ReserveCapacity(ctx, sandboxID, nodeID, toStore(r), func(alloc, committed store.Capacity) error {
		return scheduler.Admit(nodeID, fromStore(alloc), fromStore(committed), r)
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %s", scheduler.ErrUnknownNode, nodeID)
	case errors.Is(err, store.ErrConflict):
		return fmt.Errorf("%w: %v", scheduler.ErrConflict, err)
	}
	return err
}

// Release implements scheduler.Ledger.
func (l *Ledger) Release(ctx context.Context, sandboxID string) error {
	return l.s.ReleaseCapacity(ctx, sandboxID)
}

// Allocatable is every node's allocatable as the store holds it (last
// set by any replica).
func (l *Ledger) Allocatable(ctx context.Context) (map[string]scheduler.Resources, error) {
	c, err := l.s.AllocatableCapacity(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]scheduler.Resources, len(c))
	for id, r := range c {
		out[id] = fromStore(r)
	}
	return out, nil
}

// Committed implements scheduler.Ledger.
func (l *Ledger) Committed(ctx context.Context) (map[string]scheduler.Resources, error) {
	c, err := l.s.CommittedCapacity(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]scheduler.Resources, len(c))
	for id, r := range c {
		out[id] = fromStore(r)
	}
	return out, nil
}
