package accel

import "fmt"

// FitInventory is the placement predicate over an inventory as a node
// reports it (sorted by ID): the indexes of the allocatable devices that
// match req under contract c, or why there are not enough. The node-local
// Manager and the cluster scheduler both decide through it, so a request
// is judged by the same rules and fails with the same layers everywhere:
// *CompatError when no device on the node could ever match, ErrNoCapacity
// when matching devices exist but too few are allocatable now.
func FitInventory(nodeID string, devs []Device, req Request, c *Contract, stage Stage) ([]int, error) {
	var first *CompatError
	matching := 0
	var free []int
	// Disabled, quarantined and busy devices still count as matching: they
	// make a request "no capacity now" (retry), not "never" (fail fast).
	for i := range devs {
		if ce := Match(devs[i], req, c, stage); ce != nil {
			if first == nil {
				first = ce
			}
			continue
		}
		matching++
		if devs[i].State.Schedulable() {
			free = append(free, i)
		}
	}
	count := max(req.Count, 1)
	switch {
	case matching == 0 && first != nil:
		return nil, first
	case matching == 0:
		return nil, &CompatError{Stage: stage, Layer: LayerHardware, Detail: fmt.Sprintf("node %s has no %s accelerators", nodeID, req.Class)}
	case matching < count:
		return nil, &CompatError{Stage: stage, Layer: LayerHardware, Detail: fmt.Sprintf("%d requested, node %s has only %d matching", count, nodeID, matching)}
	case len(free) < count:
		return nil, fmt.Errorf("%w: %d matching, %d allocatable, %d requested", ErrNoCapacity, matching, len(free), count)
	}
	return free, nil
}
