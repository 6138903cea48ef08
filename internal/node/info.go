package node

import (
	"context"
	"fmt"
	goruntime "runtime"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/version"
)

// Info is what a node says about itself. It is data, not a set of calls or
// type assertions, so a remote node answers it as well as Local does
// (Nomad's driver Capabilities).
type Info struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	// Runtime names the sandbox runtime (runc, runsc...); a memory
	// snapshot restores only on a node with the same runtime.
	Runtime   string    `json:"runtime"`
	Abilities Abilities `json:"abilities"`
	// VolumeDrivers names the volume plugins the node has, in order.
	VolumeDrivers []string `json:"volumeDrivers,omitempty"`
	// Accelerators counts the node's devices by state (nil: none).
	Accelerators map[accel.State]int `json:"accelerators,omitempty"`
	Capacity     Capacity            `json:"capacity"`
	// Images are the registry images the node has cached (the scheduler's
	// "image cached" score; the register body's templates).
	Images []Image `json:"images,omitempty"`
}

// Abilities are what a node can do beyond what every node does.
type Abilities struct {
	// Snapshots: Stop and Snapshot work (otherwise ErrSnapshotUnsupported).
	Snapshots bool `json:"snapshots"`
	// MemorySnapshots: snapshots keep memory, and Restore continues from it.
	MemorySnapshots bool `json:"memorySnapshots"`
	// EnforcesDomains: domain entries of a policy are judged by the node's
	// egress proxy; without it they would fail open and are refused.
	EnforcesDomains bool `json:"enforcesDomains"`
	// EgressProxy: the node tunnels through a policy's upstream proxy
	// (CheckUpstream says whether a given address may be used).
	EgressProxy bool `json:"egressProxy"`
	// PullsImages: the node resolves CreateRequest.Image itself (it has an
	// image source); otherwise it boots from CreateRequest.Layers only.
	PullsImages bool `json:"pullsImages"`
}

// Capacity is the host's size, before any sandbox's share.
type Capacity struct {
	CPUs        int    `json:"cpus"`
	MemoryBytes uint64 `json:"memoryBytes"`
}

// hostCapacity reads the CPUs this process may use and the host's RAM.
func hostCapacity() (Capacity, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return Capacity{}, err
	}
	return Capacity{CPUs: goruntime.NumCPU(), MemoryBytes: uint64(si.Totalram) * uint64(si.Unit)}, nil
}

// Info implements Node.
func (l *Local) Info(ctx context.Context) (Info, error) {
	c, err := hostCapacity()
	if err != nil {
		return Info{}, err
	}
	_, snapErr := l.snapshotter()
	_, upstream := l.cfg.Network.(network.UpstreamResolver)
	de, ok := l.cfg.Network.(network.DomainEnforcer)
	info := Info{
		ID: l.cfg.ID, Version: version.Version, Runtime: l.cfg.Runtime.Name(),
		Abilities: Abilities{
			Snapshots: snapErr == nil, MemorySnapshots: l.memorySnapshots(),
			EnforcesDomains: ok && de.EnforcesDomains(), EgressProxy: upstream,
			PullsImages: l.cfg.Images != nil,
		},
		VolumeDrivers: append([]string(nil), l.cfg.VolumeDrivers...),
		Capacity:      c,
	}
	if l.cfg.Accel != nil {
		info.Accelerators = map[accel.State]int{}
		for _, d := range l.cfg.Accel.Inventory() {
			info.Accelerators[d.State]++
		}
	}
	if l.cfg.Images != nil {
		if info.Images, err = l.cfg.Images.Cached(ctx); err != nil {
			return Info{}, fmt.Errorf("node: cached images: %w", err)
		}
	}
	return info, nil
}
