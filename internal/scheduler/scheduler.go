// Package scheduler places sandboxes on nodes. It is pure: it reads the
// state nodes report (plain structs a heartbeat can carry) and a request,
// and answers which nodes can run the sandbox, best first, or why none
// can. Reserving capacity on the chosen node goes through a Ledger, the
// only place where "never oversell" is enforced.
//
// The shape follows Nomad's scheduler: small feasibility checkers that
// each say why they filtered a node, then a ranking. Accelerator
// compatibility is judged by internal/accel's own rules (FitInventory), so
// a refusal names the same layer whether one node or a thousand were asked.
package scheduler

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

// ErrInvalid: a bad configuration, request or policy expression.
var ErrInvalid = errors.New("scheduler: invalid")

// Resources is an amount of the three resources a sandbox holds on a node.
// CPU is in millicores so that overcommit ratios stay exact integers.
type Resources struct {
	MilliCPU  int64 `json:"milliCPU"`
	MemoryMiB int64 `json:"memoryMiB"`
	DiskMiB   int64 `json:"diskMiB"`
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{r.MilliCPU + o.MilliCPU, r.MemoryMiB + o.MemoryMiB, r.DiskMiB + o.DiskMiB}
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	return Resources{r.MilliCPU - o.MilliCPU, r.MemoryMiB - o.MemoryMiB, r.DiskMiB - o.DiskMiB}
}

// Fits reports whether r fits in free.
func (r Resources) Fits(free Resources) bool {
	return r.MilliCPU <= free.MilliCPU && r.MemoryMiB <= free.MemoryMiB && r.DiskMiB <= free.DiskMiB
}

// Valid reports that no amount is negative (a negative reservation would
// grow the node).
func (r Resources) Valid() bool { return r.MilliCPU >= 0 && r.MemoryMiB >= 0 && r.DiskMiB >= 0 }

// Request is one sandbox to place.
type Request struct {
	TeamID     string
	TemplateID string
	Resources  Resources
	// Accelerator is the effective request (accel.Effective of the
	// sandbox's request and the template's contract); nil for none.
	Accelerator *accel.Request
	// Contract is the template's compatibility contract, nil for none.
	Contract *accel.Contract
	// VolumeDrivers must all be registered on the node.
	VolumeDrivers []string
	// Pin, when set, is the only node the request may run on, and
	// PinReason why (a volume of the local driver is a directory of
	// that node); every other node is rejected with ReasonPinned.
	Pin, PinReason string
	// Policies are the team's and the template's placement policies
	// (compiled once when set); every filter must pass, scores add up.
	Policies []*Policy
}

// Node is what a node reports about itself, plus what the control plane
// knows of it (cordon, heartbeat age). Plain data, so a heartbeat can
// carry it.
type Node struct {
	ID       string
	Labels   map[string]string
	Cordoned bool
	// HeartbeatAge is how long ago the node's lease was last renewed;
	// past Config.LeaseTTL the node counts as lost. The in-process node
	// reports 0.
	HeartbeatAge time.Duration
	// Capacity is the node's physical size; Committed is what its live
	// sandboxes hold. Schedule reads the ledger's committed instead.
	Capacity  Resources
	Committed Resources
	// VolumeDrivers registered on the node.
	VolumeDrivers []string
	// Accelerators is the node's inventory with device states, sorted by
	// ID (accel.Manager.Inventory).
	Accelerators []accel.Device
	// Templates whose image the node has cached.
	Templates []string
	// WarmStandbys counts idle pooled sandboxes per template ID.
	WarmStandbys map[string]int
}

// Strategy chooses between spreading load and packing it.
type Strategy string

const (
	// Spread prefers the node with the most room left (fewer sandboxes
	// lost with one node).
	Spread Strategy = "spread"
	// BinPack prefers the fullest node that fits (empty nodes can be
	// drained and removed).
	BinPack Strategy = "binpack"
)

// Config tunes placement.
type Config struct {
	Strategy Strategy // default Spread
	// CPUOvercommit multiplies a node's CPUs when admitting sandboxes
	// (CPU is compressible; memory and disk are not). Default 1, at
	// most 100.
	CPUOvercommit float64
	// LeaseTTL: a node whose heartbeat is older is not a candidate.
	// Default 15s.
	LeaseTTL time.Duration
	// CachedBonus and WarmBonus are added to the score (which is in 0..1
	// before bonuses) of a node holding the template's image, or an idle
	// standby of it. Defaults 0.25 and 0.5; negative is refused.
	CachedBonus float64
	WarmBonus   float64
	// Candidates is how many ranked nodes Place returns (the caller tries
	// the next when a reservation fails). Default 8.
	Candidates int
}

// Scheduler ranks nodes for requests. Safe for concurrent use.
type Scheduler struct {
	cfg      Config
	checkers []checker
}

// New validates cfg and fills in defaults.
func New(cfg Config) (*Scheduler, error) {
	switch cfg.Strategy {
	case "":
		cfg.Strategy = Spread
	case Spread, BinPack:
	default:
		return nil, fmt.Errorf("%w: strategy %q (want %q or %q)", ErrInvalid, cfg.Strategy, Spread, BinPack)
	}
	if cfg.CPUOvercommit == 0 {
		cfg.CPUOvercommit = 1
	}
	if math.IsNaN(cfg.CPUOvercommit) || cfg.CPUOvercommit < 1 || cfg.CPUOvercommit > 100 {
		return nil, fmt.Errorf("%w: CPU overcommit ratio %v outside 1..100", ErrInvalid, cfg.CPUOvercommit)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 15 * time.Second
	}
	if cfg.LeaseTTL < 0 {
		return nil, fmt.Errorf("%w: lease TTL %v is negative", ErrInvalid, cfg.LeaseTTL)
	}
	if cfg.CachedBonus == 0 {
		cfg.CachedBonus = 0.25
	}
	if cfg.WarmBonus == 0 {
		cfg.WarmBonus = 0.5
	}
	if cfg.CachedBonus < 0 || cfg.WarmBonus < 0 || math.IsNaN(cfg.CachedBonus) || math.IsNaN(cfg.WarmBonus) {
		return nil, fmt.Errorf("%w: score bonuses must be >= 0", ErrInvalid)
	}
	if cfg.Candidates == 0 {
		cfg.Candidates = 8
	}
	if cfg.Candidates < 0 {
		return nil, fmt.Errorf("%w: candidates %d is negative", ErrInvalid, cfg.Candidates)
	}
	s := &Scheduler{cfg: cfg}
	s.checkers = defaultCheckers()
	return s, nil
}

// Config returns the effective configuration.
func (s *Scheduler) Config() Config { return s.cfg }

// Allocatable is what a node can hand out: its capacity with CPU
// overcommit applied. The ledger is given this, not the raw capacity.
func (s *Scheduler) Allocatable(n *Node) Resources {
	a := n.Capacity
	a.MilliCPU = int64(float64(a.MilliCPU) * s.cfg.CPUOvercommit)
	return a
}

// ValidateRequest refuses a request that could never be placed because it
// is malformed (as opposed to one no node can run now). The accelerator
// request is already effective (validated by the caller before it was
// merged with the contract, which may leave the class open), so it is
// judged by FitInventory only.
func ValidateRequest(r *Request) error {
	if !r.Resources.Valid() {
		return fmt.Errorf("%w: negative resources %+v", ErrInvalid, r.Resources)
	}
	for _, p := range r.Policies {
		if p == nil {
			return fmt.Errorf("%w: nil policy", ErrInvalid)
		}
	}
	return nil
}
