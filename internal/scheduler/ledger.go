package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Ledger errors; match with errors.Is / errors.As.
var (
	// ErrInsufficient: the node has not enough room left. Every
	// *InsufficientError matches it.
	ErrInsufficient = errors.New("scheduler: insufficient capacity")
	// ErrUnknownNode: the node was never registered with the ledger.
	ErrUnknownNode = errors.New("scheduler: unknown node")
	// ErrConflict: the sandbox already holds a different reservation.
	ErrConflict = errors.New("scheduler: conflicting reservation")
)

// InsufficientError names the resource that ran out.
type InsufficientError struct {
	Node     string
	Resource Reason // ReasonCPU, ReasonMemory or ReasonDisk
	Need     int64
	Free     int64
}

func (e *InsufficientError) Error() string {
	return fmt.Sprintf("%v: node %s: %s need %d, free %d", ErrInsufficient, e.Node, e.Resource, e.Need, e.Free)
}

// Unwrap makes every InsufficientError an ErrInsufficient.
func (e *InsufficientError) Unwrap() error { return ErrInsufficient }

// Ledger is the capacity ledger: what each node can hand out and what
// every sandbox holds. It is the single place that enforces "never
// oversell": Reserve checks and records atomically, so any number of
// concurrent callers (goroutines here, control-plane replicas once it is
// backed by the store's transaction) never commit more than a node's
// allocatable capacity. Implementations are safe for concurrent use and
// run ledgertest.
type Ledger interface {
	// SetNode records a node's allocatable capacity (Scheduler.Allocatable
	// of what it reports), registering it when new. Shrinking below what
	// is committed is allowed: reservations then fail until releases
	// bring the node under its capacity again.
	SetNode(ctx context.Context, nodeID string, allocatable Resources) error
	// Reserve holds r on nodeID for sandboxID, or fails with
	// *InsufficientError (nothing recorded), ErrUnknownNode, or
	// ErrConflict when sandboxID already holds a different reservation.
	// Reserving the same sandbox, node and resources again succeeds
	// without counting twice (a retried call).
	Reserve(ctx context.Context, sandboxID, nodeID string, r Resources) error
	// Release frees sandboxID's reservation; releasing an unknown sandbox
	// is a no-op (idempotent).
	Release(ctx context.Context, sandboxID string) error
	// Committed returns what is reserved on every registered node.
	Committed(ctx context.Context) (map[string]Resources, error)
}

// MemLedger is the in-process Ledger (one control plane, embedded mode).
type MemLedger struct {
	mu        sync.Mutex
	nodes     map[string]*ledgerNode
	sandboxes map[string]reservation
}

type ledgerNode struct {
	allocatable, committed Resources
}

type reservation struct {
	node string
	res  Resources
}

var _ Ledger = (*MemLedger)(nil)

// NewMemLedger returns an empty ledger.
func NewMemLedger() *MemLedger {
	return &MemLedger{nodes: map[string]*ledgerNode{}, sandboxes: map[string]reservation{}}
}

// SetNode implements Ledger.
func (l *MemLedger) SetNode(_ context.Context, nodeID string, a Resources) error {
	if nodeID == "" || !a.Valid() {
		return fmt.Errorf("%w: node %q allocatable %+v", ErrInvalid, nodeID, a)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.nodes[nodeID]; n != nil {
		n.allocatable = a
		return nil
	}
	l.nodes[nodeID] = &ledgerNode{allocatable: a}
	return nil
}

// Reserve implements Ledger.
func (l *MemLedger) Reserve(_ context.Context, sandboxID, nodeID string, r Resources) error {
	if sandboxID == "" || !r.Valid() {
		return fmt.Errorf("%w: sandbox %q resources %+v", ErrInvalid, sandboxID, r)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if have, ok := l.sandboxes[sandboxID]; ok {
		if have.node == nodeID && have.res == r {
			return nil
		}
		return fmt.Errorf("%w: sandbox %s holds %+v on node %s", ErrConflict, sandboxID, have.res, have.node)
	}
	n := l.nodes[nodeID]
	if n == nil {
		return fmt.Errorf("%w: %s", ErrUnknownNode, nodeID)
	}
	if err := Admit(nodeID, n.allocatable, n.committed, r); err != nil {
		return err
	}
	n.committed = n.committed.Add(r)
	l.sandboxes[sandboxID] = reservation{node: nodeID, res: r}
	return nil
}

// Admit is the one capacity rule every Ledger applies: r fits in what
// allocatable leaves after committed, or an *InsufficientError names the
// first resource that does not.
func Admit(nodeID string, allocatable, committed, r Resources) error {
	free := allocatable.Sub(committed)
	switch {
	case r.MilliCPU > free.MilliCPU:
		return &InsufficientError{Node: nodeID, Resource: ReasonCPU, Need: r.MilliCPU, Free: max(free.MilliCPU, 0)}
	case r.MemoryMiB > free.MemoryMiB:
		return &InsufficientError{Node: nodeID, Resource: ReasonMemory, Need: r.MemoryMiB, Free: max(free.MemoryMiB, 0)}
	case r.DiskMiB > free.DiskMiB:
		return &InsufficientError{Node: nodeID, Resource: ReasonDisk, Need: r.DiskMiB, Free: max(free.DiskMiB, 0)}
	}
	return nil
}

// Release implements Ledger.
func (l *MemLedger) Release(_ context.Context, sandboxID string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	have, ok := l.sandboxes[sandboxID]
	if !ok {
		return nil
	}
	delete(l.sandboxes, sandboxID)
	if n := l.nodes[have.node]; n != nil {
		n.committed = n.committed.Sub(have.res)
	}
	return nil
}

// Committed implements Ledger.
func (l *MemLedger) Committed(_ context.Context) (map[string]Resources, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]Resources, len(l.nodes))
	for id, n := range l.nodes {
		out[id] = n.committed
	}
	return out, nil
}
