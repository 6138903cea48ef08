package scheduler

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

// ErrNoFit: no node can run the sandbox now. Every *NoFitError matches it.
var ErrNoFit = errors.New("no node can run this sandbox")

// ClassSummary counts the nodes rejected for one reason.
type ClassSummary struct {
	Nodes int
	// Need is what the request asked (resource classes); MostFree the
	// largest amount free on any node of the class.
	Need, MostFree int64
	// First is the first rejection of the class (nodes in ID order).
	First *Rejection
}

// NoFitError is why no node could run a request, by class. When every
// node was refused on accelerators, Accel is the closest node's error (a
// *accel.CompatError naming the layer, or accel.ErrNoCapacity when
// matching devices exist but are all held) and the error matches it too,
// so the API answers exactly as it does for one node.
type NoFitError struct {
	// Nodes is how many nodes were considered.
	Nodes   int
	Classes map[Reason]*ClassSummary
	Accel   error
	// Contended counts reservations on feasible nodes that concurrent
	// placements filled first.
	Contended int
}

func (e *NoFitError) Error() string {
	if e.Nodes == 0 {
		return ErrNoFit.Error() + ": no nodes are registered"
	}
	var parts []string
	for _, r := range reasonOrder {
		c := e.Classes[r]
		if c == nil {
			continue
		}
		n := c.Nodes
		switch r {
		case ReasonCPU:
			parts = append(parts, fmt.Sprintf("%s CPU (need %s, most free %s)", nodes(n, "lacks", "lack"), milli(c.Need), milli(c.MostFree)))
		case ReasonMemory:
			parts = append(parts, fmt.Sprintf("%s memory (need %d MiB, most free %d MiB)", nodes(n, "lacks", "lack"), c.Need, c.MostFree))
		case ReasonDisk:
			parts = append(parts, fmt.Sprintf("%s disk (need %d MiB, most free %d MiB)", nodes(n, "lacks", "lack"), c.Need, c.MostFree))
		case ReasonAccelBusy:
			parts = append(parts, fmt.Sprintf("%s matching accelerators all in use", nodes(n, "has", "have")))
		case ReasonAccelIncompatible:
			parts = append(parts, fmt.Sprintf("%s no compatible accelerator (%v)", nodes(n, "has", "have"), c.First.Err))
		case ReasonVolumeDriver:
			parts = append(parts, fmt.Sprintf("%s volume driver %q", nodes(n, "lacks", "lack"), c.First.Detail))
		case ReasonPinned:
			parts = append(parts, fmt.Sprintf("%s excluded (%s)", nodes(n, "is", "are"), c.First.Detail))
		case ReasonPolicy:
			parts = append(parts, fmt.Sprintf("%s refused by placement policy (%v)", nodes(n, "is", "are"), c.First.Err))
		case ReasonCordoned:
			parts = append(parts, nodes(n, "is", "are")+" cordoned")
		case ReasonLeaseExpired:
			parts = append(parts, nodes(n, "is", "are")+" lost (no heartbeat)")
		}
	}
	if e.Contended > 0 {
		parts = append(parts, fmt.Sprintf("%d reservations lost to concurrent placements", e.Contended))
	}
	return ErrNoFit.Error() + ": " + strings.Join(parts, ", ")
}

// nodes is "1 node <one>" or "N nodes <many>".
func nodes(n int, one, many string) string {
	if n == 1 {
		return "1 node " + one
	}
	return fmt.Sprintf("%d nodes %s", n, many)
}

// Unwrap lets errors.Is match ErrNoFit and, when set, the accelerator
// error (accel.ErrIncompatible / accel.ErrNoCapacity).
func (e *NoFitError) Unwrap() []error {
	if e.Accel != nil {
		return []error{ErrNoFit, e.Accel}
	}
	return []error{ErrNoFit}
}

// add records one node's rejection.
func (e *NoFitError) add(r *Rejection) {
	if e.Classes == nil {
		e.Classes = map[Reason]*ClassSummary{}
	}
	c := e.Classes[r.Reason]
	if c == nil {
		c = &ClassSummary{First: r, Need: r.Need, MostFree: r.Free}
		e.Classes[r.Reason] = c
	}
	c.Nodes++
	c.MostFree = max(c.MostFree, r.Free)
	if r.Node < c.First.Node {
		c.First = r
	}
}

// finish sets Accel when every node failed on accelerators: the closest
// node's error, so the caller can answer as for a single node.
func (e *NoFitError) finish(closest *Rejection) {
	n := 0
	for _, r := range []Reason{ReasonAccelBusy, ReasonAccelIncompatible} {
		if c := e.Classes[r]; c != nil {
			n += c.Nodes
		}
	}
	if n == e.Nodes && n > 0 && closest != nil {
		e.Accel = closest.Err
	}
}

// layerRank orders accel layers by how far a device got through
// accel.Match: a node failing late is closer to fitting.
var layerRank = map[accel.Layer]int{
	accel.LayerHardware: 1, accel.LayerBackend: 2, accel.LayerDriver: 3, accel.LayerCUDA: 4,
	accel.LayerGuestKernel: 5, accel.LayerModulesImage: 6,
}

// closeness ranks accelerator rejections: devices busy (fits later) over
// any incompatibility, then by layer. Ties keep the first node by ID.
func closeness(r *Rejection) int {
	if r.Reason == ReasonAccelBusy {
		return 100
	}
	var ce *accel.CompatError
	if errors.As(r.Err, &ce) {
		return layerRank[ce.Layer]
	}
	return 0
}
