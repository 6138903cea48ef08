// Package runtime defines the boundary between Cubicle's node agent and the
// thing that actually runs a sandbox (an OCI runtime today, a microVM later).
package runtime

import (
	"context"
	"os"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Typed errors; callers use errors.Is.
var (
	ErrNotFound      = errdefs.NewReason(errdefs.ErrNotFound, "runtime_sandbox_not_found", "runtime: sandbox not found")
	ErrAlreadyExists = errdefs.NewReason(errdefs.ErrAlreadyExists, "runtime_sandbox_exists", "runtime: sandbox already exists")
	ErrNotRunning    = errdefs.NewReason(errdefs.ErrFailedPrecondition, "runtime_not_running", "runtime: sandbox not running")
	ErrNotPaused     = errdefs.NewReason(errdefs.ErrFailedPrecondition, "runtime_not_paused", "runtime: sandbox not paused")
	ErrUnsupported   = errdefs.NewReason(errdefs.ErrNotImplemented, "runtime_unsupported", "runtime: operation not supported by this driver")
	// ErrSnapshotTooLarge: a snapshot would take more than the sandbox's
	// disk size, or more than the snapshot store has free; nothing of it
	// is kept. The error's text says which.
	ErrSnapshotTooLarge = errdefs.NewReason(errdefs.ErrResourceExhausted, "snapshot_too_large", "snapshot too large")
)

// State is the runtime-level state of a sandbox.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped" // exists (bundle/checkpoint) but no process
)

// Mount is an extra bind mount into the sandbox (volumes, the agent binary,
// host mounts).
type Mount struct {
	Source      string // host path
	Destination string // path inside the sandbox
	ReadOnly    bool
	// Under makes Source a host mount (package hostmount): it is reached
	// from the directory Under without following any symlink, and mounted
	// from that descriptor, so nothing can redirect it between the check
	// and the mount. Only user-namespaced sandboxes take one.
	Under string `json:",omitempty"`
}

// Resources are the cgroup limits for a sandbox.
type Resources struct {
	CPUCount int   // whole CPUs (cpu quota = CPUCount * period)
	MemoryMB int   // memory limit
	PIDs     int64 // pids limit
	// DiskMB limits the writable layer (writes past it get ENOSPC);
	// 0 = no limit.
	DiskMB int
}

// Spec describes a sandbox to create.
type Spec struct {
	ID string // [a-z0-9]{20}
	// Layers are read-only lower directories of the rootfs, top-most first.
	// The driver stacks a per-sandbox writable upper over them (overlayfs).
	Layers    []string
	Hostname  string
	Args      []string // PID 1 command line inside the sandbox (the agent)
	Env       []string // KEY=VALUE for PID 1
	NetNSPath string   // existing network namespace to join ("" = new private netns with loopback only)
	// NetworkReady, when set, is waited on before anything opens NetNSPath:
	// the caller sets the network up while the driver prepares the disk and
	// rootfs. Its error fails the create.
	NetworkReady func(context.Context) error
	// Ready, when set, is the write end of a pipe the driver hands PID 1
	// at its ReadyFD (drivers that implement ReadyPiper): PID 1 writes a
	// byte there once it serves, so the caller learns it without polling.
	// The caller keeps the read end and closes its copy of this one after
	// Create. Args must tell PID 1 about it.
	Ready     *os.File
	Mounts    []Mount
	Resources Resources
	// Devices are host device nodes passed through into the sandbox (GPUs:
	// /dev/nvidia0, /dev/nvidiactl...). The driver creates each node at Path
	// and allows it in the device cgroup; drivers that cannot do so report
	// false from DeviceCapable and fail Create with ErrUnsupported.
	Devices []Device
	// Files are written into the sandbox's writable layer before it starts,
	// owned by the sandbox's root (the extra CA bundle, say). Each shadows
	// the image's file at that path; the sandbox may change it later.
	Files []File
	// Restore, when set, is a memory checkpoint (SnapshotInfo.Checkpoint)
	// the sandbox continues from instead of starting PID 1. Layers must then
	// hold the files the checkpoint was taken with (its snapshot layer on
	// top). Drivers without memory snapshots fail with ErrUnsupported.
	Restore string
}

// Snapshot kinds.
const (
	// SnapshotMemory keeps memory and files: sandboxes from it continue
	// where the source was.
	SnapshotMemory = "memory"
	// SnapshotFilesystem keeps the root filesystem only: sandboxes from it
	// boot fresh over the captured files.
	SnapshotFilesystem = "filesystem"
)

// SnapshotInfo describes what Snapshot wrote.
type SnapshotInfo struct {
	Kind string
	// Layer is the frozen writable layer: a read-only lower dir to stack
	// above the sandbox's own layers. Files are stored with unshifted IDs
	// (root is 0), like image layers.
	Layer string
	// Checkpoint is the memory image ("" for filesystem snapshots).
	Checkpoint string
	SizeBytes  int64 // bytes of the layer's files plus the checkpoint
}

// Snapshotter is implemented by drivers that can snapshot sandboxes and
// stop them keeping only their files.
type Snapshotter interface {
	// Snapshot captures sandbox id (running or paused) under dst, a new
	// directory it creates: dst/rootfs is the layer, dst/checkpoint the
	// memory image when memory is true and the driver can (otherwise the
	// kind is filesystem). The sandbox is held still while its files are
	// read and is left in the state it was found in. The layer keeps
	// sparse files sparse, and a layer copied into dst that would take
	// more than the sandbox's disk size, or than dst's filesystem has
	// free, fails with ErrSnapshotTooLarge. The layer may be a mount (a
	// clone of the sandbox's disk): only DeleteSnapshot removes dst, and
	// OpenSnapshot makes it readable again after a reboot. On error
	// nothing is left under dst.
	Snapshot(ctx context.Context, id, dst string, memory bool) (SnapshotInfo, error)
	// OpenSnapshot makes the layer of a snapshot Snapshot wrote at dst
	// readable (mounts it again when the host rebooted since); a no-op
	// for a layer that is plain files. Callers open a snapshot before
	// they read or stack its layer.
	OpenSnapshot(ctx context.Context, dst string) error
	// DeleteSnapshot removes dst, which Snapshot wrote or a fetch
	// unpacked, mounts included. Sandboxes that stacked its layer keep
	// it.
	DeleteSnapshot(ctx context.Context, dst string) error
	// Stop ends every process of a running or paused sandbox but keeps its
	// files and mounts (a filesystem pause). It then reads as paused, and
	// Resume boots it afresh over the same files.
	Stop(ctx context.Context, id string) error
	// MemorySnapshots reports whether Snapshot can keep memory.
	MemorySnapshots() bool
}

// File is one file a sandbox starts with (Spec.Files).
type File struct {
	Path string // absolute, inside the sandbox
	Data []byte
	Mode uint32 // permission bits; 0 means 0644
}

// Device is one device node to expose inside a sandbox.
type Device struct {
	Path     string // inside the sandbox, absolute under /dev
	HostPath string // host node the numbers come from (informational for OCI drivers, which mknod)
	Type     byte   // 'c' (char) or 'b' (block)
	Major    int64
	Minor    int64
	FileMode uint32 // permission bits of the node; 0 means 0666
	UID, GID uint32 // owner of the node inside the sandbox
}

// DeviceCapable is optionally implemented by a Driver to say whether it can
// pass Spec.Devices through (the node checks it before scheduling
// accelerator sandboxes onto a driver).
type DeviceCapable interface {
	SupportsDevices() bool
}

// ReadyPiper is a Driver that passes Spec.Ready into the sandbox as file
// descriptor ReadyFD of PID 1, at create and at every later boot of the
// same bundle (a stopped sandbox started again), so PID 1 always finds
// a pipe there when it was created with one.
type ReadyPiper interface {
	ReadyFD() int
}

// Info is what the driver knows about a live sandbox.
type Info struct {
	ID      string
	State   State
	Pid     int // host pid of the sandbox's PID 1 (0 when not running)
	Created time.Time
}

// Stats are point-in-time resource readings.
type Stats struct {
	CPUUsageNanos uint64 // cumulative
	MemoryBytes   uint64 // current usage
	MemoryLimit   uint64
	MemoryCache   uint64
	PIDs          uint64
}

// Driver runs sandboxes. Every method is safe for concurrent use on
// different IDs, idempotent where noted, and leaves nothing behind on error.
type Driver interface {
	// Name is "runc", "runsc", "crun"...
	Name() string
	// Create builds the rootfs and starts PID 1. On error everything it made is removed.
	Create(ctx context.Context, spec Spec) (Info, error)
	// Delete kills every process and removes the container, mounts, cgroups and
	// per-sandbox directories. Deleting an unknown ID returns nil (idempotent).
	Delete(ctx context.Context, id string) error
	// Pause stops the sandbox keeping its memory (freezer for runc, checkpoint for runsc).
	Pause(ctx context.Context, id string) error
	// Resume undoes Pause.
	Resume(ctx context.Context, id string) error
	// Inspect returns ErrNotFound for unknown IDs.
	Inspect(ctx context.Context, id string) (Info, error)
	// List returns every sandbox the driver still has state for (used for
	// recovery after a restart of cubicle serve).
	List(ctx context.Context) ([]Info, error)
	Stats(ctx context.Context, id string) (Stats, error)
}
