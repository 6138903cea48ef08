// Package store defines Cubicle's durable state and the interface every
// backend (SQLite embedded, PostgreSQL for clusters) implements.
package store

import (
	"context"
	"errors"
	"time"
)

var (
	ErrNotFound = errors.New("store: not found")
	ErrConflict = errors.New("store: conflict")
)

// SandboxState is the control-plane state of a sandbox.
type SandboxState string

const (
	StateCreating SandboxState = "creating"
	StateRunning  SandboxState = "running"
	StatePausing  SandboxState = "pausing"
	StatePaused   SandboxState = "paused"
	StateResuming SandboxState = "resuming"
	StateKilled   SandboxState = "killed"
)

// Live reports whether the sandbox still holds node resources.
func (s SandboxState) Live() bool { return s != StateKilled }

// Network is the stored network configuration of a sandbox.
type Network struct {
	AllowInternet      bool     `json:"allowInternet"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
}

// Sandbox is one sandbox row.
type Sandbox struct {
	ID           string
	TemplateID   string
	Alias        string
	State        SandboxState
	Node         string
	Metadata     map[string]string
	EnvVars      map[string]string
	EnvdToken    string
	TrafficToken string
	CPUCount     int
	MemoryMB     int
	DiskSizeMB   int
	Network      Network
	AutoPause    bool
	AutoResume   bool
	Addr         string // sandbox IP on the node
	APIKeyID     string
	StartedAt    time.Time
	EndAt        time.Time
	UpdatedAt    time.Time
	KilledAt     time.Time
	KillReason   string
	// Volumes are the sandbox's volume mounts; CreateSandbox records one
	// attachment row per entry in the same transaction.
	Volumes []VolumeMount
}

// VolumeMount is one volume mounted into a sandbox.
type VolumeMount struct {
	VolumeID string `json:"volumeID"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// VolumeState is the control-plane state of a volume.
type VolumeState string

const (
	// VolumeCreating: row written, plugin Create not yet confirmed.
	VolumeCreating VolumeState = "creating"
	VolumeReady    VolumeState = "ready"
	// VolumeDeleting: delete guard passed, plugin Destroy not yet confirmed.
	VolumeDeleting VolumeState = "deleting"
)

// Volume is one volume row. PrivateData is the plugin's opaque blob; it is
// never returned to API clients.
type Volume struct {
	ID          string
	Name        string
	Driver      string
	State       VolumeState
	Token       string
	PrivateData string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// VolumeAttachment is a durable reference from a sandbox to a volume.
type VolumeAttachment struct {
	VolumeID  string
	SandboxID string
	Node      string
	Path      string
	ReadOnly  bool
	CreatedAt time.Time
}

// SandboxFilter selects sandboxes in List. Zero values match everything.
type SandboxFilter struct {
	States   []SandboxState
	Metadata map[string]string
	Template string
	// Cursor pagination in StartedAt-desc (or asc) order: rows strictly after
	// (AfterStarted, AfterID).
	AfterStarted time.Time
	AfterID      string
	Ascending    bool
	StartedAfter time.Time
	Limit        int
}

// APIKey is a stored key; only the hash of the secret is kept.
type APIKey struct {
	ID        string
	Name      string
	Hash      string // hex sha256 of the key
	Prefix    string // first chars, for display
	CreatedAt time.Time
	LastUsed  time.Time
}

// Event is an audit/lifecycle event.
type Event struct {
	ID        int64
	SandboxID string
	VolumeID  string
	Type      string
	Level     string
	Message   string
	Time      time.Time
}

// Store is the persistence boundary. Implementations must be safe for concurrent use.
type Store interface {
	CreateSandbox(ctx context.Context, s *Sandbox) error
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// UpdateSandbox writes every field of s. ErrNotFound if missing.
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	// CompareAndSetState moves a sandbox from one of `from` to `to` atomically;
	// ErrConflict when the current state is not in from.
	CompareAndSetState(ctx context.Context, id string, from []SandboxState, to SandboxState) (*Sandbox, error)
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]*Sandbox, error)
	CountSandboxes(ctx context.Context, states []SandboxState) (int, error)

	CreateAPIKey(ctx context.Context, k *APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
	ListAPIKeys(ctx context.Context) ([]*APIKey, error)
	DeleteAPIKey(ctx context.Context, id string) error
	TouchAPIKey(ctx context.Context, id string, t time.Time) error

	// CreateVolume inserts a row; ErrConflict if the ID or name exists.
	CreateVolume(ctx context.Context, v *Volume) error
	GetVolume(ctx context.Context, id string) (*Volume, error)
	ListVolumes(ctx context.Context) ([]*Volume, error)
	// UpdateVolume writes every field of v. ErrNotFound if missing.
	UpdateVolume(ctx context.Context, v *Volume) error
	// MarkVolumeDeleting moves a ready volume with no attachment rows to
	// deleting in one transaction: the delete guard. ErrConflict when it
	// is referenced or not ready, ErrNotFound when missing.
	MarkVolumeDeleting(ctx context.Context, id string) (*Volume, error)
	// DeleteVolume removes the row; ErrConflict while attachment rows exist.
	DeleteVolume(ctx context.Context, id string) error
	// ListVolumeAttachments returns attachment rows; empty filter fields match all.
	ListVolumeAttachments(ctx context.Context, volumeID, sandboxID string) ([]*VolumeAttachment, error)
	// DeleteVolumeAttachments removes a sandbox's rows once its node confirmed the detach.
	DeleteVolumeAttachments(ctx context.Context, sandboxID string) error

	AppendEvent(ctx context.Context, e *Event) error
	// ListVolumeEvents returns a volume's events, oldest first.
	ListVolumeEvents(ctx context.Context, volumeID string, limit int) ([]*Event, error)
	ListEvents(ctx context.Context, sandboxID string, since time.Time, limit int) ([]*Event, error)

	Close() error
}
