package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// placement is where a create runs: the chosen node and, in cluster
// mode, its reservation in the capacity ledger.
type placement struct {
	nodeID   string
	node     node.Node
	reserved bool
	// accepted, for a judgeOnly placement, lists every node the request
	// could run on (a pool claim takes a standby on one of them only).
	accepted []string
}

// placeRequest is what place needs besides the create's options.
type placeRequest struct {
	sandboxID string
	accels    []accel.Request
	drivers   []string // volume drivers the mounts need
	// pin restricts placement to one node (a snapshot's files are on
	// the node that took it); exclude removes nodes (a retry).
	pin string
	// movable lets a pinned create go to another node that pulls images
	// (the snapshot's chain is in the snapshot store).
	movable bool
	exclude map[string]bool
	// volPin is the node whose directories the create's local-driver
	// volumes are, and volPinWhy why (the scheduler's pin).
	volPin, volPinWhy string
	// runtime, when set, admits only nodes whose registered runtime it
	// is (a memory image restores only on the runtime that took it).
	runtime string
	// judgeOnly asks whether some node is acceptable, reserving nothing
	// (a pool claim checks its placement policies so).
	judgeOnly bool
}

// place is the scheduling stage: the scheduler picks the node among every
// node of the set (the in-process node's live facts, remote nodes' facts
// from their registry rows: capacity, labels, volume drivers, accelerator
// inventory, cordon and heartbeat). It fails fast as a single node would:
// *accel.CompatError naming the layer when no device could ever match,
// accel.ErrNoCapacity when all matching ones are in use, a
// *scheduler.NoFitError (429) otherwise. The team's and the template's
// placement policies apply (placementPolicies); a node refused by one is
// named in the no-fit error.
//
// In cluster mode (any node besides the in-process one, or
// Config.Reserve) the sandbox's CPU and memory are reserved on the chosen node in
// the store's capacity ledger, in the same decision (scheduler.Schedule),
// so concurrent creates on any replica never oversell a node. Embedded
// mode reserves nothing: its admission is MaxSandboxes and the disk
// budget, and the in-process node asks for no resources.
func (m *Manager) place(ctx context.Context, o CreateOptions, tpl template.Template, pr placeRequest) (placement, error) {
	req := &scheduler.Request{TeamID: o.TeamID, TemplateID: tpl.ID, Contract: tpl.Accelerators, VolumeDrivers: pr.drivers,
		Pin: pr.volPin, PinReason: pr.volPinWhy}
	if len(pr.accels) == 1 {
		req.Accelerator = &pr.accels[0]
	}
	pols, err := m.placementPolicies(ctx, o.TeamID, tpl.ID)
	if err != nil {
		return placement{}, err
	}
	req.Policies = pols
	members, err := m.nodes.Members(ctx)
	if err != nil {
		return placement{}, err
	}
	now := time.Now()
	nodes := make([]scheduler.Node, 0, len(members))
	reserve := m.cfg.Reserve
	for _, mb := range members {
		if pr.exclude[mb.ID] || (pr.pin != "" && mb.ID != pr.pin && !pr.movable) {
			continue
		}
		if pr.pin != "" && mb.ID != pr.pin && !m.pullsOK(ctx, mb.ID) {
			continue // it could not boot the chain by reference
		}
		if pr.runtime != "" && (mb.Row == nil || mb.Row.Runtime != pr.runtime) {
			continue
		}
		if !m.nodes.IsLocal(mb.ID) {
			if mb.Row.Address == "" {
				// Another replica's in-process node: only that replica
				// can drive it.
				continue
			}
			reserve = true
		}
		n, err := m.schedulerNode(ctx, mb, now)
		if err != nil {
			if m.nodes.IsLocal(mb.ID) {
				return placement{}, err
			}
			// A row whose facts do not decode cannot be judged, so the
			// node is not offered.
			m.log.Error("placement: node facts", "node", mb.ID, "err", err)
			continue
		}
		nodes = append(nodes, n)
	}
	if err := m.fillStandbys(ctx, tpl, nodes); err != nil {
		return placement{}, err
	}
	var chosen string
	if reserve && !pr.judgeOnly {
		req.Resources = scheduler.Resources{MilliCPU: int64(tpl.CPUCount) * 1000, MemoryMiB: int64(tpl.MemoryMB)}
		led := storeledger.New(m.store)
		if err := m.syncAllocatable(ctx, led, nodes); err != nil {
			return placement{}, err
		}
		p, serr := m.sched.Schedule(ctx, led, nodes, req, pr.sandboxID)
		err, chosen = serr, p.NodeID
	} else {
		cands, perr := m.sched.Place(req, nodes)
		if err = perr; err == nil {
			chosen = cands[0].NodeID
		}
	}
	if err != nil {
		var nf *scheduler.NoFitError
		if errors.As(err, &nf) && nf.Accel != nil {
			err = nf.Accel
		}
		if req.Accelerator != nil {
			m.denyAccelerators(ctx, nodes, err)
		}
		return placement{}, err
	}
	if pr.judgeOnly {
		// Place ranks only the best few; each node is judged alone so
		// every acceptable one is named.
		var accepted []string
		for i := range nodes {
			if _, err := m.sched.Place(req, nodes[i:i+1]); err == nil {
				accepted = append(accepted, nodes[i].ID)
			}
		}
		return placement{nodeID: chosen, accepted: accepted}, nil
	}
	nd, err := m.nodeFor(ctx, chosen)
	if err != nil {
		if reserve {
			m.release(ctx, pr.sandboxID)
		}
		return placement{}, err
	}
	return placement{nodeID: chosen, node: nd, reserved: reserve}, nil
}

// syncAllocatable writes to the ledger what each node may hand out now
// (capacity × overcommit; a node's capacity changes when it registers
// again), only where the ledger holds another value: one read per create
// instead of a write per node. The ledger's value is compared, not what
// this replica last wrote, since another replica may have written since.
func (m *Manager) syncAllocatable(ctx context.Context, led *storeledger.Ledger, nodes []scheduler.Node) error {
	have, err := led.Allocatable(ctx)
	if err != nil {
		return fmt.Errorf("capacity ledger: %w", err)
	}
	for i := range nodes {
		id, alloc := nodes[i].ID, m.sched.Allocatable(&nodes[i])
		if cur, ok := have[id]; ok && cur == alloc {
			continue
		}
		if err := led.SetNode(ctx, id, alloc); err != nil {
			return fmt.Errorf("capacity ledger: %w", err)
		}
	}
	return nil
}

// denyAccelerators records the refusal on every node with devices (their
// accelerator event feeds show why a request found none).
func (m *Manager) denyAccelerators(ctx context.Context, nodes []scheduler.Node, why error) {
	for _, n := range nodes {
		if len(n.Accelerators) == 0 {
			continue
		}
		nd, err := m.nodeFor(ctx, n.ID)
		if err == nil {
			err = nd.DenyAccelerators(ctx, "", why)
		}
		if err != nil {
			m.log.Error("recording an accelerator denial", "node", n.ID, "err", err)
		}
	}
}

// release frees a sandbox's reservation (idempotent). A failure is logged:
// the reservation stops counting anyway once the sandbox's row is killed.
func (m *Manager) release(ctx context.Context, sandboxID string) {
	if err := storeledger.New(m.store).Release(context.WithoutCancel(ctx), sandboxID); err != nil {
		m.log.Error("capacity ledger: release", "sandbox", sandboxID, "err", err)
	}
}

// schedulerNode is a member of the set as the scheduler sees it. The
// in-process node reports its facts live (as before the registry
// existed) plus the operator's flags from its row; a node with no row (a
// Manager whose caller skipped RegisterNode) is schedulable. A remote
// node is its registry row: what it reported at its last heartbeat, whose
// age the scheduler judges. Draining implies no new sandboxes.
func (m *Manager) schedulerNode(ctx context.Context, mb nodeset.Member, now time.Time) (scheduler.Node, error) {
	if m.nodes.IsLocal(mb.ID) {
		nd := m.nodes.LocalNode()
		info, err := m.nodeInfo(ctx, nd, mb.ID)
		if err != nil {
			return scheduler.Node{}, err
		}
		inv, err := nd.AcceleratorInventory(ctx)
		if err != nil {
			return scheduler.Node{}, err
		}
		n := scheduler.Node{ID: mb.ID, VolumeDrivers: info.VolumeDrivers, Accelerators: inv,
			Capacity: scheduler.Resources{MilliCPU: int64(info.Capacity.CPUs) * 1000, MemoryMiB: int64(info.Capacity.MemoryBytes >> 20)}}
		row := mb.Row
		if row == nil {
			// Embedded mode's set reads no registry; the flags are in the
			// store all the same.
			r, err := m.store.GetNode(ctx, mb.ID)
			switch {
			case err == nil:
				row = r
			case !errors.Is(err, store.ErrNotFound):
				return scheduler.Node{}, fmt.Errorf("node registry: %w", err)
			}
		}
		if row != nil {
			n.Cordoned = row.Cordoned || row.Draining
			n.Labels = row.Labels
			// Its own heartbeat keeps it fresh while this process runs;
			// a stale one means the loops are stuck, and the node is lost.
			n.HeartbeatAge = max(now.Sub(row.HeartbeatAt), 0)
		}
		return n, nil
	}
	r := mb.Row
	n := scheduler.Node{ID: r.ID, Labels: r.Labels, Cordoned: r.Cordoned || r.Draining, HeartbeatAge: max(now.Sub(r.HeartbeatAt), 0),
		Capacity:      scheduler.Resources{MilliCPU: r.Capacity.MilliCPU, MemoryMiB: r.Capacity.MemoryMiB, DiskMiB: r.Capacity.DiskMiB},
		VolumeDrivers: r.VolumeDrivers, Templates: slices.Clone(r.Templates)}
	if r.Accelerators != "" {
		if err := json.Unmarshal([]byte(r.Accelerators), &n.Accelerators); err != nil {
			return scheduler.Node{}, fmt.Errorf("node %s: accelerator inventory: %w", r.ID, err)
		}
	}
	return n, nil
}

// retryable reports whether a node's create failure may succeed on another
// node: the node could not be reached or answered that it is unavailable,
// or it ran out of room (its own view can be fresher than the registry's).
// A refusal of the request itself (invalid, not permitted...) is not.
func retryable(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrResourceExhausted) ||
		errors.Is(err, nodeset.ErrUnknownNode)
}

// RetryError is a create that failed on two nodes: the first failure made
// the create try once more elsewhere, and the second ended it. It matches
// both errors (errors.Is / errors.As).
type RetryError struct {
	FirstNode, SecondNode string
	First, Second         error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("on node %s: %v; retried on node %s: %v", e.FirstNode, e.First, e.SecondNode, e.Second)
}

// Unwrap lists the second failure first: it is what decided the outcome.
func (e *RetryError) Unwrap() []error { return []error{e.Second, e.First} }

// createElsewhere is the one retry of a create whose node failed with a
// retryable error (first): the sandbox is removed from that node (best
// effort: a node that cannot be reached is cleaned by its reconcile, which
// sees the row names another node), its reservation released, and it is
// placed again without that node and created there. When no other node
// can run it, the first failure stands; when the second node fails too,
// the error is a *RetryError with both reasons. pl is the node the
// sandbox is on at the end (for the caller's cleanup).
func (m *Manager) createElsewhere(ctx context.Context, o CreateOptions, tpl template.Template, pr placeRequest, sb *store.Sandbox,
	req node.CreateRequest, first placement, firstErr error) (placement, node.Sandbox, error) {
	if derr := first.node.Delete(ctx, sb.ID); derr != nil {
		m.log.Warn("create retry: cleanup on the failed node", "sandbox", sb.ID, "node", first.nodeID, "err", derr)
	}
	if first.reserved {
		m.release(ctx, sb.ID)
	}
	pr.exclude = map[string]bool{first.nodeID: true}
	second, err := m.place(ctx, o, tpl, pr)
	if err != nil {
		// No other node can take it (no room, no device, or none meets
		// the accelerator contract): the first node's answer stands.
		var compat *accel.CompatError
		if errors.Is(err, scheduler.ErrNoFit) || errors.Is(err, accel.ErrNoCapacity) || errors.As(err, &compat) {
			return first, node.Sandbox{}, firstErr
		}
		return first, node.Sandbox{}, fmt.Errorf("on node %s: %w; placing again: %w", first.nodeID, firstErr, err)
	}
	if local, _ := m.nodes.Local(); second.nodeID != local {
		if err := m.checkNetworkOn(ctx, policyOf(o.Network), second.node, second.nodeID); err != nil {
			return second, node.Sandbox{}, &RetryError{FirstNode: first.nodeID, First: firstErr, SecondNode: second.nodeID, Second: err}
		}
	}
	// The root file system is sent the way the second node takes it
	// (layers on the control plane's files, or an image it pulls), not
	// the way the first one did.
	boot, err := m.bootImage(ctx, second.nodeID, second.node, tpl, nil) // never from a snapshot (see createFrom)
	if err != nil {
		return second, node.Sandbox{}, &RetryError{FirstNode: first.nodeID, First: firstErr, SecondNode: second.nodeID, Second: err}
	}
	req.Layers, req.Image = tpl.Layers, node.Image{}
	if !boot.IsZero() {
		req.Layers, req.Image = nil, boot
	}
	sb.Node = second.nodeID
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return second, node.Sandbox{}, err
	}
	m.event(ctx, sb.ID, "create-retried", "warn", "node %s failed the create (%v); retrying on node %s", first.nodeID, firstErr, second.nodeID)
	placed, err := second.node.Create(ctx, req)
	if err != nil {
		return second, node.Sandbox{}, &RetryError{FirstNode: first.nodeID, First: firstErr, SecondNode: second.nodeID, Second: err}
	}
	return second, placed, nil
}
