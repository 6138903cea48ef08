package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNodeInUse is what a NodeInUseError matches: a node cannot be
// forgotten while live sandboxes still name it.
var ErrNodeInUse = errors.New("store: node still holds live sandboxes")

// NodeInUseError counts the live sandboxes that keep a node registered.
type NodeInUseError struct {
	Node      string
	Sandboxes int
}

func (e *NodeInUseError) Error() string {
	return fmt.Sprintf("node %s still holds %d live sandboxes", e.Node, e.Sandboxes)
}
func (e *NodeInUseError) Unwrap() error { return ErrNodeInUse }

// Capacity is an amount of node resources: a node's size, what it may hand
// out, or what a sandbox holds. CPU is in thousandths of a CPU.
type Capacity struct {
	MilliCPU  int64 `json:"milliCPU"`
	MemoryMiB int64 `json:"memoryMiB"`
	DiskMiB   int64 `json:"diskMiB"`
}

// Node is one registered node: what it reported at its last heartbeat,
// plus the operator's flags. Cordoned and Draining belong to the control
// plane: registering or heartbeating never changes them.
type Node struct {
	ID string
	// Address is the node's gRPC host:port; DataAddress its data plane's
	// (both empty for the in-process node).
	Address     string
	DataAddress string
	Labels      map[string]string
	// Capacity is the node's physical size, before any sandbox's share.
	Capacity      Capacity
	Runtime       string
	Version       string
	VolumeDrivers []string
	// Accelerators is the device inventory as JSON ([]accel.Device), so
	// the store does not depend on the accelerator package.
	Accelerators string
	// Templates are the template images the node has cached.
	Templates []string
	// Cordoned: no new sandboxes. Draining: cordoned, and its sandboxes
	// are to leave.
	Cordoned     bool
	Draining     bool
	RegisteredAt time.Time
	HeartbeatAt  time.Time
}

// NodeHeartbeat carries the facts a node may change between heartbeats.
type NodeHeartbeat struct {
	Address       string
	DataAddress   string
	Labels        map[string]string
	Capacity      Capacity
	VolumeDrivers []string
	Accelerators  string
	Templates     []string
	Time          time.Time
}

// NodeStore is the node registry. A registered node is a row; its lease
// is its heartbeat time, judged by the scheduler.
type NodeStore interface {
	// RegisterNode inserts the node, or updates every fact of an existing
	// one (a restarted node registers again). RegisteredAt is set on first
	// registration only; Cordoned and Draining of an existing row are kept.
	// n.HeartbeatAt zero means now.
	RegisterNode(ctx context.Context, n *Node) error
	// HeartbeatNode records a heartbeat and the facts that change;
	// ErrNotFound when the node never registered (or was forgotten).
	HeartbeatNode(ctx context.Context, id string, hb NodeHeartbeat) error
	GetNode(ctx context.Context, id string) (*Node, error)
	// ListNodes returns every node ordered by ID.
	ListNodes(ctx context.Context) ([]*Node, error)
	// SetNodeFlags sets the cordoned and draining flags and returns the
	// row; ErrNotFound when missing.
	SetNodeFlags(ctx context.Context, id string, cordoned, draining bool) (*Node, error)
	// ForgetNode deletes the node, its allocatable capacity and its
	// reservations, frees its ID for a new join, and records the time (its
	// second) as the ID's revocation (NodeRevokedAt): its certificates
	// issued so far are refused. A node that joined but never registered is forgotten
	// the same way. Refused with a *NodeInUseError (ErrNodeInUse) while
	// live sandboxes name it; ErrNotFound when the ID is neither
	// registered nor joined. The check and the
	// delete are one transaction, so every sandbox committed before it is
	// counted. Sandbox creates do not read the registry: one committed
	// alongside is ordered after the forget and names a node with no row
	// (a running node registers again at its next heartbeat).
	ForgetNode(ctx context.Context, id string) error

	CapacityLedger
}

// CapacityLedger stores what every node may hand out and what each
// sandbox holds (scheduler.Ledger's state). It is separate from the
// registry so a node's allocatable (its capacity times the scheduler's
// overcommit) is the scheduler's decision, not the node's report.
//
// A reservation stops counting once its sandbox row is killed, in the
// same transaction as the kill: a crash between the kill and a release
// never leaks capacity. Reservations of sandboxes with no row yet (a
// create between placement and its insert) count.
type CapacityLedger interface {
	// SetAllocatable records what nodeID may hand out.
	SetAllocatable(ctx context.Context, nodeID string, c Capacity) error
	// ReserveCapacity records c for sandboxID on nodeID in one transaction
	// with check, which is called with the node's allocatable and what is
	// committed there (without this reservation); a non-nil error from
	// check is returned as is and nothing is recorded. check may be called
	// more than once (a retried transaction) and must not have side
	// effects. Reserving the same sandbox, node and amount again succeeds
	// without counting twice; another reservation for the sandbox is
	// ErrConflict. ErrNotFound when nodeID has no allocatable.
	ReserveCapacity(ctx context.Context, sandboxID, nodeID string, c Capacity, check func(allocatable, committed Capacity) error) error
	// ReleaseCapacity deletes sandboxID's reservation; idempotent.
	ReleaseCapacity(ctx context.Context, sandboxID string) error
	// CommittedCapacity sums the counting reservations of every node with
	// an allocatable.
	CommittedCapacity(ctx context.Context) (map[string]Capacity, error)
	// AllocatableCapacity is every node's allocatable as last set.
	AllocatableCapacity(ctx context.Context) (map[string]Capacity, error)
}
