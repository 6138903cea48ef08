package scheduler

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

// Reason is the class of a node's rejection; the no-fit error counts
// nodes per class.
type Reason string

const (
	ReasonLeaseExpired      Reason = "lease-expired"
	ReasonCordoned          Reason = "cordoned"
	ReasonAccelIncompatible Reason = "accelerator-incompatible"
	ReasonAccelBusy         Reason = "accelerator-busy"
	ReasonVolumeDriver      Reason = "volume-driver"
	ReasonCPU               Reason = "cpu"
	ReasonMemory            Reason = "memory"
	ReasonDisk              Reason = "disk"
	ReasonPolicy            Reason = "policy"
	ReasonPinned            Reason = "pinned"
)

// reasonOrder is the order classes appear in messages.
var reasonOrder = []Reason{ReasonCPU, ReasonMemory, ReasonDisk, ReasonAccelBusy, ReasonAccelIncompatible,
	ReasonVolumeDriver, ReasonPinned, ReasonPolicy, ReasonCordoned, ReasonLeaseExpired}

// Rejection says why one node cannot run a request.
type Rejection struct {
	Node   string
	Reason Reason
	// Need and Free are set for resource reasons (millicores or MiB).
	Need, Free int64
	// Detail names the missing thing (a volume driver, a policy message).
	Detail string
	// Err is the accelerator error (a *accel.CompatError or one wrapping
	// accel.ErrNoCapacity) for accelerator reasons, or the policy's.
	Err error
}

func (r *Rejection) String() string {
	switch r.Reason {
	case ReasonCPU:
		return fmt.Sprintf("node %s lacks CPU (need %s, free %s)", r.Node, milli(r.Need), milli(r.Free))
	case ReasonMemory:
		return fmt.Sprintf("node %s lacks memory (need %d MiB, free %d MiB)", r.Node, r.Need, r.Free)
	case ReasonDisk:
		return fmt.Sprintf("node %s lacks disk (need %d MiB, free %d MiB)", r.Node, r.Need, r.Free)
	case ReasonAccelIncompatible, ReasonAccelBusy, ReasonPolicy:
		return fmt.Sprintf("node %s: %v", r.Node, r.Err)
	case ReasonVolumeDriver:
		return fmt.Sprintf("node %s has no volume driver %q", r.Node, r.Detail)
	case ReasonPinned:
		return fmt.Sprintf("node %s is not the request's node: %s", r.Node, r.Detail)
	case ReasonCordoned:
		return fmt.Sprintf("node %s is cordoned", r.Node)
	case ReasonLeaseExpired:
		return fmt.Sprintf("node %s has not renewed its lease (%s)", r.Node, r.Detail)
	}
	return fmt.Sprintf("node %s: %s", r.Node, r.Reason)
}

func milli(m int64) string {
	if m%1000 == 0 {
		return fmt.Sprintf("%d CPU", m/1000)
	}
	return fmt.Sprintf("%.3g CPU", float64(m)/1000)
}

// checker is one hard constraint (Nomad's FeasibilityChecker): nil when n
// can run req, else why not. ev carries per-decision values computed once.
type checker func(ev *evalCtx, n *Node) *Rejection

// evalCtx is one decision's request and its derived values.
type evalCtx struct {
	s   *Scheduler
	req *Request
	// committed, when set, is the ledger's view, read instead of
	// Node.Committed (so Schedule need not copy the nodes).
	committed map[string]Resources
}

// used is what n has committed in this decision's view.
func (ev *evalCtx) used(n *Node) Resources {
	if ev.committed != nil {
		return ev.committed[n.ID]
	}
	return n.Committed
}

// defaultCheckers run cheapest and most permanent first: a node that is
// gone or cordoned is reported as such, and an accelerator mismatch (the
// request can never run there) wins over a resource shortage (it could
// later), so an incompatible request still fails as incompatible.
func defaultCheckers() []checker {
	return []checker{checkPin, checkLease, checkCordon, checkAccelerators, checkVolumeDrivers, checkResources, checkPolicy}
}

// checkPin: a pinned request runs on its node only, whatever else is free.
func checkPin(ev *evalCtx, n *Node) *Rejection {
	if ev.req.Pin != "" && n.ID != ev.req.Pin {
		return &Rejection{Node: n.ID, Reason: ReasonPinned, Detail: ev.req.PinReason}
	}
	return nil
}

func checkLease(ev *evalCtx, n *Node) *Rejection {
	if n.HeartbeatAge > ev.s.cfg.LeaseTTL {
		return &Rejection{Node: n.ID, Reason: ReasonLeaseExpired, Detail: fmt.Sprintf("last heartbeat %s ago, TTL %s", n.HeartbeatAge.Round(1e6), ev.s.cfg.LeaseTTL)}
	}
	return nil
}

func checkCordon(_ *evalCtx, n *Node) *Rejection {
	if n.Cordoned {
		return &Rejection{Node: n.ID, Reason: ReasonCordoned}
	}
	return nil
}

// checkAccelerators judges the node's reported inventory with accel's own
// predicate, so the error names the failing layer exactly as the node's
// manager would at reservation.
func checkAccelerators(ev *evalCtx, n *Node) *Rejection {
	if ev.req.Accelerator == nil {
		return nil
	}
	_, err := accel.FitInventory(n.ID, n.Accelerators, *ev.req.Accelerator, ev.req.Contract, accel.StageScheduling)
	if err == nil {
		return nil
	}
	r := &Rejection{Node: n.ID, Reason: ReasonAccelIncompatible, Err: err}
	if errors.Is(err, accel.ErrNoCapacity) {
		r.Reason = ReasonAccelBusy
	}
	return r
}

func checkVolumeDrivers(ev *evalCtx, n *Node) *Rejection {
	for _, d := range ev.req.VolumeDrivers {
		if !slices.Contains(n.VolumeDrivers, d) {
			return &Rejection{Node: n.ID, Reason: ReasonVolumeDriver, Detail: d}
		}
	}
	return nil
}

func checkResources(ev *evalCtx, n *Node) *Rejection {
	free := ev.s.Allocatable(n).Sub(ev.used(n))
	need := ev.req.Resources
	switch {
	case need.MemoryMiB > free.MemoryMiB:
		return &Rejection{Node: n.ID, Reason: ReasonMemory, Need: need.MemoryMiB, Free: max(free.MemoryMiB, 0)}
	case need.MilliCPU > free.MilliCPU:
		return &Rejection{Node: n.ID, Reason: ReasonCPU, Need: need.MilliCPU, Free: max(free.MilliCPU, 0)}
	case need.DiskMiB > free.DiskMiB:
		return &Rejection{Node: n.ID, Reason: ReasonDisk, Need: need.DiskMiB, Free: max(free.DiskMiB, 0)}
	}
	return nil
}

func checkPolicy(ev *evalCtx, n *Node) *Rejection {
	if len(ev.req.Policies) == 0 {
		return nil
	}
	a := newActivation(ev, n)
	for _, p := range ev.req.Policies {
		ok, err := p.filter(a)
		if err != nil {
			return &Rejection{Node: n.ID, Reason: ReasonPolicy, Detail: p.Filter, Err: err}
		}
		if !ok {
			return &Rejection{Node: n.ID, Reason: ReasonPolicy, Detail: p.Filter, Err: fmt.Errorf("filter %q is false", p.Filter)}
		}
	}
	return nil
}
