// Package volume holds the volume plugin protocol shared by the control plane
// (Controller hooks: Create/Destroy) and the node (Node hooks: Attach/Detach),
// and the registries that route a driver name to a plugin. Field names and
// semantics follow the CubeSandbox volume plugin protocol, so plugins written
// for it run unmodified.
package volume

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Typed errors; the API maps them to HTTP statuses.
var (
	// ErrUnknownDriver: no plugin registered under that name (400 at the API).
	ErrUnknownDriver = errdefs.NewReason(errdefs.ErrInvalidArgument, "volume_unknown_driver", "volume: unknown driver")
	// ErrPlugin: the plugin ran and reported failure (non-zero exit, "error"
	// field, gRPC error status, crash).
	ErrPlugin = errdefs.NewReason(errdefs.ErrUnavailable, "volume_plugin_failed", "volume: plugin failed")
	// ErrPluginTimeout: the hook did not finish within the plugin's timeout.
	ErrPluginTimeout = errdefs.NewReason(errdefs.ErrDeadlineExceeded, "volume_plugin_timeout", "volume: plugin timed out")
	// ErrProtocol: the plugin answered but broke the protocol (bad JSON,
	// private_data over MaxPrivateData, host_path outside the base dir, …).
	ErrProtocol = errdefs.NewReason(errdefs.ErrInternal, "volume_plugin_protocol", "volume: plugin protocol violation")
	// ErrConfig: a plugin list failed validation at start.
	ErrConfig = errdefs.NewReason(errdefs.ErrInvalidArgument, "volume_invalid_config", "volume: invalid plugin configuration")
)

// MaxPrivateData bounds the opaque blob Create may return.
const MaxPrivateData = 1024

// Namespace is what Attach/Detach receive as `namespace` (containerd's
// namespace in CubeSandbox); Cubicle has one.
const Namespace = "cubicle"

// DefaultBaseDir is the node's volume_plugin_base_dir when unset.
const DefaultBaseDir = "/data/cube-shared/volume"

// CreateRequest is the Create hook input. SizeMB is Cubicle's extension:
// the volume's size in MiB, sent only to plugins that are Sized (the
// protocol's binary and rpc plugins have no such field); 0 is no limit.
type CreateRequest struct {
	VolumeID string
	Name     string
	SizeMB   int
}

// CreateResult is the Create hook output.
type CreateResult struct {
	Token       string
	PrivateData string
}

// DestroyRequest is the Destroy hook input.
type DestroyRequest struct {
	VolumeID string
}

// AttachRequest is the Attach hook input. RefCount is the number of holders
// on this node before this attach (0 = first: mount the backend).
type AttachRequest struct {
	SandboxID     string
	Namespace     string
	VolumeID      string
	RefCount      int64
	VolumeBaseDir string
	PrivateData   string
}

// AttachResult is the Attach hook output; Metadata is echoed to Detach.
type AttachResult struct {
	HostPath string
	Metadata map[string]string
}

// DetachRequest is the Detach hook input. RefCount is the number of holders
// on this node after this detach (0 = last: tear the backend mount down).
type DetachRequest struct {
	SandboxID string
	Namespace string
	VolumeID  string
	RefCount  int64
	Metadata  map[string]string
}

// Controller is the control-plane half of a plugin.
type Controller interface {
	Create(ctx context.Context, req CreateRequest) (CreateResult, error)
	Destroy(ctx context.Context, req DestroyRequest) error
}

// Node is the node half of a plugin.
type Node interface {
	Attach(ctx context.Context, req AttachRequest) (AttachResult, error)
	Detach(ctx context.Context, req DetachRequest) error
}

// Sized is optionally implemented by a plugin that holds each volume to
// CreateRequest.SizeMB, with writes past it failing with ENOSPC, and keeps
// the data on this host's data disk. The control plane sends a size only
// to such plugins and counts their volumes against the team's byte quota
// and the server's free-space budget; a size asked of another driver is
// refused.
type Sized interface {
	EnforcesSize() bool
}

// HostBound is optionally implemented by a plugin whose Controller half
// keeps each volume's data on the host it runs on (the built-in local
// driver: a directory or image under its root). Only a node on that host
// can attach such a volume, so in a cluster the control plane pins its
// sandboxes to its own in-process node, and a control plane without one
// refuses to create it.
type HostBound interface {
	KeepsDataOnHost() bool
}

// Plugin implements both halves (every driver in this module does).
type Plugin interface {
	Controller
	Node
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// MaxNameLen bounds volume names.
const MaxNameLen = 128

// ValidateName enforces the e2b volume name rule.
func ValidateName(name string) error {
	if name == "" {
		return errors.New("volume name must not be empty")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("volume name is %d characters, at most %d allowed", len(name), MaxNameLen)
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("volume name %q must match ^[a-zA-Z0-9_-]+$", name)
	}
	return nil
}

// CheckHostPath verifies that hostPath is an absolute path strictly inside
// baseDir, after resolving symlinks on both sides, so a plugin cannot expose
// an arbitrary host directory to a sandbox.
func CheckHostPath(baseDir, hostPath string) error {
	if hostPath == "" {
		return fmt.Errorf("%w: attach returned an empty host_path", ErrProtocol)
	}
	if !filepath.IsAbs(hostPath) {
		return fmt.Errorf("%w: host_path %q is not absolute", ErrProtocol, hostPath)
	}
	base, err := filepath.EvalSymlinks(baseDir)
	if err != nil {
		return fmt.Errorf("volume base dir: %w", err)
	}
	hp, err := filepath.EvalSymlinks(hostPath)
	if err != nil {
		return fmt.Errorf("%w: host_path %q: %v", ErrProtocol, hostPath, err)
	}
	rel, err := filepath.Rel(base, hp)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return fmt.Errorf("%w: host_path %q is not inside volume_base_dir %q", ErrProtocol, hostPath, baseDir)
	}
	return nil
}
