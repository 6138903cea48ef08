// Package node is the boundary between the control plane and the machine a
// sandbox runs on. Embedded mode uses Local in-process; cluster mode will put a
// remote client behind the same interface.
package node

import (
	"context"
	"net/netip"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

var (
	ErrNotFound     = errdefs.NewReason(errdefs.ErrNotFound, "node_sandbox_not_found", "node: sandbox not found")
	ErrAgentTimeout = errdefs.NewReason(errdefs.ErrUnavailable, "node_agent_timeout", "node: agent did not become ready")
	// ErrHostMountsRemote: host mounts (runtime.Mount.Under) are made by
	// the control plane's own node only: their directories are its host's.
	ErrHostMountsRemote = errdefs.NewReason(errdefs.ErrFailedPrecondition, "node_host_mounts_remote", "node: host mounts are made only by the control plane's own node")
)

// AgentPort is the envd port inside every sandbox.
const AgentPort = 49983

// CreateRequest is everything a node needs to start a sandbox.
type CreateRequest struct {
	ID string
	// Layers are read-only rootfs layers, top-most first: paths on the
	// node's host, which only the embedded node shares with the control
	// plane. Image is the same as a reference any node resolves
	// (ImageSource); a request names one or the other.
	Layers      []string
	Image       Image
	EnvdToken   string
	EnvVars     map[string]string
	DefaultUser string
	CPUCount    int
	MemoryMB    int
	// DiskSizeMB limits the sandbox's writable layer (ENOSPC past it).
	DiskSizeMB int
	Policy     network.Policy
	Mounts     []runtime.Mount
	// Volumes are attached through their plugins before the runtime starts
	// and bind-mounted at their Path; Delete detaches them.
	Volumes []VolumeAttachment
	// StartCmd is a template's start command, run once by the agent as
	// StartUser in StartWorkdir (logged to /var/log/cubicle/start-cmd.log).
	StartCmd     string
	StartUser    string
	StartWorkdir string
	// DefaultWorkdir is where commands and relative file paths start (a
	// template's WORKDIR).
	DefaultWorkdir string
	// Accelerators are reserved, prepared and passed through before the
	// runtime starts, checked in the guest after boot; AccelContract is the
	// template's compatibility contract (nil = none).
	Accelerators  []accel.Request
	AccelContract *accel.Contract
	// Restore is a memory snapshot's checkpoint the sandbox continues
	// from (Layers then start with that snapshot's layer).
	Restore string
	// SnapshotLayers and RestoreSnapshot are Layers' and Restore's
	// node-local forms, by snapshot ID (Snapshots lists them), for a
	// control plane that does not share the node's files: the layers of
	// those snapshots, top-most first, go above Layers or Image (a sandbox
	// from a snapshot of a sandbox from a snapshot needs both), and the
	// sandbox continues from RestoreSnapshot's memory, which must then be
	// SnapshotLayers[0]. Restore and RestoreSnapshot exclude each other.
	SnapshotLayers  []string
	RestoreSnapshot string
	// CurrentToken is the access token a restored agent already holds
	// (the snapshot source's); it authorises the first /init.
	CurrentToken string
}

// Sandbox is the node's view of a sandbox.
type Sandbox struct {
	ID    string
	Addr  netip.Addr
	State runtime.State
	Pid   int
}

// Stats is a metrics sample.
type Stats struct {
	Time       time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    uint64
	MemTotal   uint64
	MemCache   uint64
	DiskUsed   uint64
	DiskTotal  uint64
}

// Node is everything the control plane asks of the machine a sandbox runs
// on. It is composed of one interface per concern, each of which becomes a
// gRPC service of its own when the node goes remote (docs/cluster.md). No
// caller type-asserts a Node: what a node can do is in its Info, and
// nodetest is the contract every implementation passes, in-process and
// over the wire.
type Node interface {
	// Info reports the node's identity, abilities and capacity.
	Info(ctx context.Context) (Info, error)
	Sandboxes
	Agent
	Network
	Snapshots
	Volumes
	Accelerators
	Images
	Events
}

// Images is the node's image cache.
type Images interface {
	// PullImage makes sure image is on the node, fetching it if need be,
	// so that creates from it are cache hits (a warm pool prefetches its
	// template's image before its first standby). ErrImagesUnsupported
	// where Info says no Abilities.PullsImages.
	PullImage(ctx context.Context, image Image) error
}

// Sandboxes is the sandbox lifecycle. Unknown IDs are ErrNotFound, except
// for Delete, which is idempotent.
type Sandboxes interface {
	// Create starts the sandbox and returns once its agent answers and is
	// initialised. On error nothing of it is left.
	Create(ctx context.Context, req CreateRequest) (Sandbox, error)
	// Delete removes every trace of the sandbox; unknown IDs return nil.
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) error
	// Resume thaws/restores (or, after Stop, boots) the sandbox and
	// re-initialises its agent with req's token.
	Resume(ctx context.Context, id string, req CreateRequest) error
	// Stop ends a sandbox's processes keeping its files, network and
	// volumes (a filesystem pause); it then reads as paused, and Resume
	// boots it afresh. ErrSnapshotUnsupported where Info says no Snapshots.
	Stop(ctx context.Context, id string) error
	// Rebuild replaces a sandbox's filesystem (and memory, with
	// req.Restore) by req's, keeping its ID, network and volumes.
	Rebuild(ctx context.Context, id string, req CreateRequest) error
	Get(ctx context.Context, id string) (Sandbox, error)
	List(ctx context.Context) ([]Sandbox, error)
	Stats(ctx context.Context, id, token string) (Stats, error)
	// Logs returns the sandbox's console output (PID 1 stdout/stderr).
	Logs(ctx context.Context, id string) ([]byte, error)
}

// Agent talks to a sandbox's agent.
type Agent interface {
	// Reinit re-initialises a running sandbox's agent with req's token, env
	// and user; currentToken authorises the change (claiming a standby).
	Reinit(ctx context.Context, id string, req CreateRequest, currentToken string) error
	// Run executes bash -l -c cmd in the sandbox as user; returns the exit code.
	Run(ctx context.Context, id, token, user, cmd string) (int, error)
}

// Network is a sandbox's egress policy.
type Network interface {
	UpdatePolicy(ctx context.Context, id string, p network.Policy) error
	// CheckUpstream says whether a policy may tunnel through the egress
	// proxy at address from this node: a *network.FieldError wrapping
	// network.ErrUpstream when not (or when the node has no egress proxy).
	CheckUpstream(ctx context.Context, address string) error
}

// Snapshots are a node's snapshot files. ErrSnapshotUnsupported where
// Info says no Snapshots.
type Snapshots interface {
	// Snapshot captures a running or paused sandbox (files, and memory
	// where Info's Abilities.MemorySnapshots) as snapshotID; the sandbox
	// keeps its state.
	Snapshot(ctx context.Context, id, snapshotID string) (Snapshot, error)
	// DeleteSnapshot removes a snapshot's files; unknown IDs return nil.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	// Snapshots lists the snapshot IDs with files on the node.
	Snapshots(ctx context.Context) ([]string, error)
	// PushSnapshot packs each target's part of a snapshot's files and
	// PUTs it to the target's presigned URL, returning digests and sizes
	// (cross-node restore through an object store).
	PushSnapshot(ctx context.Context, snapshotID string, targets []SnapshotObject) ([]SnapshotObject, error)
	// FetchSnapshot GETs each source, refuses bytes that are not its
	// digest and size (snapstore.ErrDigestMismatch), and unpacks the parts
	// as the node's files of snapshotID. A snapshot the node already has
	// is left as it is.
	FetchSnapshot(ctx context.Context, snapshotID string, sources []SnapshotObject) error
}

// SnapshotObject is one part of a snapshot package in an object store
// (snapstore.Object): a presigned URL and, once pushed, its digest.
type SnapshotObject = snapstore.Object

// Volumes are the node's durable volume references. A sandbox's own are
// taken by Create (CreateRequest.Volumes) and dropped by Delete.
type Volumes interface {
	// AttachVolume takes a reference on a volume for a holder that is not a
	// sandbox (the volume-content API) and returns its host path.
	AttachVolume(ctx context.Context, holder string, v VolumeAttachment) (string, error)
	// DetachVolume drops holder's reference; unknown references are a no-op.
	DetachVolume(ctx context.Context, holder, volumeID string) error
	// VolumeRefs lists the node's durable volume references.
	VolumeRefs(ctx context.Context) ([]VolumeRef, error)
}

// Events are what a node reports as it happens.
type Events interface {
	// Exits reports sandbox exits as they happen, so the control plane need
	// not wait for its periodic reconcile. There is one stream per node: the
	// control plane reads it until ctx ends. A node that does not watch
	// returns a nil channel.
	Exits(ctx context.Context) (<-chan Exit, error)
}
