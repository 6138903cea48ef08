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
	// DefaultUser is the agent's default user ("" = user), from the template.
	DefaultUser string
	// Accelerators is the JSON array of accelerator requests ("" = none).
	Accelerators string
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
	// ExcludeMetadataKey drops rows whose metadata has this key (the API
	// hides warm-pool standbys this way).
	ExcludeMetadataKey string
}

// Warm-pool standbys are ordinary rows marked with these metadata keys;
// ClaimPoolSandbox removes both when it hands one out.
const (
	PoolMetadataKey      = "cubicle.pool"       // template ID
	PoolBuildMetadataKey = "cubicle.pool.build" // the template build it runs
)

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
	// ClaimPoolSandbox atomically picks the oldest running standby of
	// templateID on buildID, removes its pool metadata keys and returns it,
	// so two concurrent claims never get the same row. ErrNotFound when
	// there is none.
	ClaimPoolSandbox(ctx context.Context, templateID, buildID string) (*Sandbox, error)

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

	TemplateStore

	AppendEvent(ctx context.Context, e *Event) error
	// ListVolumeEvents returns a volume's events, oldest first.
	ListVolumeEvents(ctx context.Context, volumeID string, limit int) ([]*Event, error)
	ListEvents(ctx context.Context, sandboxID string, since time.Time, limit int) ([]*Event, error)

	Close() error
}

// Template build statuses (the e2b enum plus the internal uploaded phase,
// which the API reports as building).
const (
	BuildWaiting  = "waiting"
	BuildBuilding = "building"
	BuildUploaded = "uploaded"
	BuildReady    = "ready"
	BuildError    = "error"
)

// Template is one catalog row. ReadyImage is what sandboxes boot; it only
// changes when a later build reaches ready.
type Template struct {
	ID            string
	PrimaryName   string
	Names         []string // primary name and name:tag entries (loaded by Get/List)
	Public        bool
	CPUCount      int
	MemoryMB      int
	DiskSizeMB    int
	StartCmd      string
	ReadyCmd      string
	RunAs         string // USER of the last build: "", "1000", "0", "1000:1000" or a name
	Workdir       string
	ReadyBuildID  string
	ReadyImage    string
	LatestBuildID string
	BuildStatus   string
	BuildCount    int64
	SpawnCount    int64
	LastSpawnedAt time.Time
	PoolSize      int
	// Accelerators is the JSON compatibility contract ("" = CPU-only).
	Accelerators string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// TemplateBuild is one build of a template.
type TemplateBuild struct {
	ID         string
	TemplateID string
	Status     string
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	Image      string // image reference in the local image store
	Rootfs     string // unpacked filesystem the runtime uses as the lower layer
	Reason     string
	Step       string
	Spec       string // the start request (JSON), credentials removed
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
}

// BuildLog is one build log entry; Seq counts from 0 per build.
type BuildLog struct {
	Seq     int
	Time    time.Time
	Level   string
	Message string
	Step    string
}

// TemplateTag points a tag of a template at a build.
type TemplateTag struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

// Idempotency is a stored response for an Idempotency-Key.
type Idempotency struct {
	Key, BodyHash, Response string
	CreatedAt               time.Time
}

// TemplateStore is the template catalog's persistence.
type TemplateStore interface {
	// CreateTemplate inserts the template, its names and its first build in
	// one transaction; ErrConflict when the ID or any name is taken.
	CreateTemplate(ctx context.Context, t *Template, b *TemplateBuild) error
	GetTemplate(ctx context.Context, id string) (*Template, error)
	// TemplateByName looks a template up by any of its names.
	TemplateByName(ctx context.Context, name string) (*Template, error)
	// ListTemplates pages in creation order after afterID (exclusive).
	ListTemplates(ctx context.Context, afterID string, limit int) ([]*Template, error)
	UpdateTemplate(ctx context.Context, t *Template) error
	// AddTemplateBuild records a new build and makes it the latest one.
	AddTemplateBuild(ctx context.Context, t *Template, b *TemplateBuild) error
	DeleteTemplate(ctx context.Context, id string) error
	SetTemplateNames(ctx context.Context, id string, names []string) error
	GetTemplateBuild(ctx context.Context, id string) (*TemplateBuild, error)
	ListTemplateBuilds(ctx context.Context, templateID string) ([]*TemplateBuild, error)
	UpdateTemplateBuild(ctx context.Context, b *TemplateBuild) error
	AppendBuildLogs(ctx context.Context, buildID string, logs []BuildLog) error
	ListBuildLogs(ctx context.Context, buildID string, offset, limit int) ([]BuildLog, error)
	SetTemplateTag(ctx context.Context, templateID, tag, buildID string) error
	DeleteTemplateTag(ctx context.Context, templateID, tag string) error
	ListTemplateTags(ctx context.Context, templateID string) ([]TemplateTag, error)
	RecordSpawn(ctx context.Context, id string, at time.Time) error
	// PutIdempotency stores a response under key unless one exists, in which
	// case the existing one is returned.
	PutIdempotency(ctx context.Context, k *Idempotency) (*Idempotency, error)
	// SetIdempotencyResponse records the response of a stored key.
	SetIdempotencyResponse(ctx context.Context, key, response string) error
}
