package accel

import "fmt"

// State is a device's lifecycle state (the proposal's state model).
type State string

const (
	StateInitialized State = "initialized" // discovered, not validated yet
	StateAllocatable State = "allocatable" // validated and free
	StateReserved    State = "reserved"    // held for a sandbox, not prepared
	StatePreparing   State = "preparing"   // backend Prepare in progress
	StateAttached    State = "attached"    // the sandbox runs with it
	StateReleasing   State = "releasing"   // teardown started, cleanup not done
	StateReleased    State = "released"    // cleanup done, revalidation pending
	StateUnhealthy   State = "unhealthy"   // failed validation/health check
	StateQuarantined State = "quarantined" // safety not proven after a failure
	StateDisabled    State = "disabled"    // administratively unavailable
)

// States lists every state, in lifecycle order.
var States = []State{
	StateInitialized, StateAllocatable, StateReserved, StatePreparing, StateAttached,
	StateReleasing, StateReleased, StateUnhealthy, StateQuarantined, StateDisabled,
}

// Owner is the actor allowed to make a transition.
type Owner string

const (
	// OwnerNode is the node agent's manager (Cubelet's role): the only
	// owner of allocatable in and out.
	OwnerNode Owner = "node"
	// OwnerRuntime reports attach/teardown facts (CubeShim's role).
	OwnerRuntime Owner = "runtime"
	// OwnerAdmin is an operator (disable/enable/recover).
	OwnerAdmin Owner = "admin"
)

type edge struct{ from, to State }

// transitions is the whole state machine: every legal edge and its single
// owner. Anything not listed is refused.
var transitions = map[edge]Owner{
	{StateInitialized, StateAllocatable}: OwnerNode,
	{StateInitialized, StateUnhealthy}:   OwnerNode,
	{StateInitialized, StateQuarantined}: OwnerNode, // restart found disagreeing state

	{StateAllocatable, StateReserved}:  OwnerNode,
	{StateAllocatable, StateUnhealthy}: OwnerNode,

	{StateReserved, StatePreparing}: OwnerNode,
	{StateReserved, StateReleasing}: OwnerNode, // startup cancelled before prepare

	{StatePreparing, StateAttached}:    OwnerRuntime, // runtime started with the device, guest validated
	{StatePreparing, StateReleasing}:   OwnerNode,    // prepare or startup failed cleanly
	{StatePreparing, StateQuarantined}: OwnerNode,    // prepare failed uncertainly

	{StateAttached, StateReleasing}: OwnerRuntime, // sandbox teardown started

	{StateReleasing, StateReleased}:    OwnerNode,
	{StateReleasing, StateQuarantined}: OwnerNode, // holders remain past the deadline / cleanup failed

	{StateReleased, StateAllocatable}:    OwnerNode, // revalidated
	{StateReleased, StateQuarantined}:    OwnerNode,
	{StateReleased, StateUnhealthy}:      OwnerNode,
	{StateQuarantined, StateAllocatable}: OwnerAdmin, // recover: revalidated
	{StateUnhealthy, StateAllocatable}:   OwnerAdmin, // recover: revalidated
	{StateDisabled, StateInitialized}:    OwnerAdmin, // enable: revalidation follows
}

// hard failures may come from any active state; disable from any state.
var activeStates = []State{StateReserved, StatePreparing, StateAttached, StateReleasing, StateReleased}

func init() {
	for _, s := range activeStates {
		if _, ok := transitions[edge{s, StateUnhealthy}]; !ok {
			transitions[edge{s, StateUnhealthy}] = OwnerNode
		}
		if _, ok := transitions[edge{s, StateQuarantined}]; !ok {
			transitions[edge{s, StateQuarantined}] = OwnerNode
		}
	}
	for _, s := range States {
		if s != StateDisabled {
			transitions[edge{s, StateDisabled}] = OwnerAdmin
		}
	}
}

// TransitionOwner returns the owner of from→to, or false when illegal.
func TransitionOwner(from, to State) (Owner, bool) {
	o, ok := transitions[edge{from, to}]
	return o, ok
}

// CheckTransition returns ErrIllegalTransition unless owner may move a
// device from → to.
func CheckTransition(from, to State, owner Owner) error {
	o, ok := transitions[edge{from, to}]
	if !ok {
		return fmt.Errorf("%w: %s -> %s", ErrIllegalTransition, from, to)
	}
	if o != owner {
		return fmt.Errorf("%w: %s -> %s belongs to %s, not %s", ErrIllegalTransition, from, to, o, owner)
	}
	return nil
}

// Schedulable reports whether a device in s counts as capacity.
func (s State) Schedulable() bool { return s == StateAllocatable }

// Held reports whether a device in s belongs to a sandbox.
func (s State) Held() bool {
	switch s {
	case StateReserved, StatePreparing, StateAttached, StateReleasing:
		return true
	}
	return false
}
