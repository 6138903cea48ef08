// Package store defines Cubicle's durable state and the interface every
// backend (SQLite embedded, PostgreSQL for clusters) implements.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

var (
	ErrNotFound = errors.New("store: not found")
	ErrConflict = errors.New("store: conflict")
	// ErrQuota is what a QuotaError matches with errors.Is.
	ErrQuota = errors.New("store: team quota exceeded")
)

// DefaultTeamID is the team every object of a pre-tenancy install was
// migrated into, and the team `cubicle apikey create` puts keys in.
const DefaultTeamID = "default"

// SystemTeamID owns rows no API key may reach (a template build's
// throwaway ready-probe sandbox). No team row has this ID and no quota
// applies to it.
const SystemTeamID = ""

// Team is a tenant: every API key belongs to one, and every sandbox,
// volume and template is owned by one. Another team's objects are
// invisible (the API answers 404 as if they did not exist).
type Team struct {
	ID        string
	Name      string
	Quota     Quota
	CreatedAt time.Time
}

// Quota bounds what a team may hold at once; 0 means unlimited. Sandbox
// limits count every live sandbox row of the team (warm-pool standbys of
// its templates included); the check and the insert are one transaction.
type Quota struct {
	MaxSandboxes int // concurrent live sandboxes
	MaxVCPUs     int // sum of cpuCount over live sandboxes
	MaxMemoryMB  int // sum of memoryMB over live sandboxes
	MaxDiskMB    int // sum of diskSizeMB over live sandboxes
	MaxVolumes   int // volumes
	MaxVolumeMB  int // sum of sizeMB over the team's volumes
}

// QuotaError names the quota a create would exceed.
type QuotaError struct {
	Quota string // e.g. "concurrent sandboxes"
	Limit int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("team quota exceeded: %s (%d)", e.Quota, e.Limit)
}
func (e *QuotaError) Unwrap() error { return ErrQuota }

// SandboxState is the control-plane state of a sandbox.
type SandboxState string

const (
	StateCreating SandboxState = "creating"
	StateRunning  SandboxState = "running"
	StatePausing  SandboxState = "pausing"
	StatePaused   SandboxState = "paused"
	StateResuming SandboxState = "resuming"
	StateKilled   SandboxState = "killed"
	// StateLost: the sandbox was running or paused on a node that stopped
	// heartbeating. It may still run there; it is killed after the node
	// loss grace, or goes back to the state its node reports when the
	// node returns.
	StateLost SandboxState = "lost"
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
	// HTTPSPorts are sandbox ports whose services speak TLS: the proxy
	// reaches them over HTTPS (e2b's network.httpsPorts).
	HTTPSPorts []int `json:"httpsPorts,omitempty"`
	// Rules are e2b's network.rules: per-host header transforms the
	// egress proxy applies to HTTPS requests (keys lower-cased).
	Rules map[string][]NetworkRule `json:"rules,omitempty"`
	// EgressProxy is the SOCKS5 upstream all TCP egress goes through.
	EgressProxy *EgressProxy `json:"egressProxy,omitempty"`
	// DNSServers is e2b's network.dnsServers: nil is the default (the
	// node's resolvers), an empty list none.
	DNSServers *[]string `json:"dnsServers,omitempty"`
}

// NetworkRule is one transform of network.rules.
type NetworkRule struct {
	Headers map[string]string `json:"headers,omitempty"`
	// Plain: the rule applies to plain HTTP (port 80) and not to HTTPS
	// (CubeSandbox's scheme "http"); e2b's rules never set it.
	Plain bool `json:"plain,omitempty"`
	// Port is the TCP port the rule applies on; 0 is its scheme's own
	// (CubeSandbox's match.port).
	Port int `json:"port,omitempty"`
}

// EgressProxy is network.egressProxy. The API never returns Password or
// TLSCACert.
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// PasswordSealed: Password is sealed with the secrets key
	// (control.FieldSealer), base64.
	PasswordSealed bool `json:"passwordSealed,omitempty"`
	// TLS wraps the hop to the proxy; ServerName and CACert are optional.
	TLS           bool   `json:"tls,omitempty"`
	TLSServerName string `json:"tlsServerName,omitempty"`
	TLSCACert     string `json:"tlsCACert,omitempty"`
}

// Sandbox is one sandbox row.
type Sandbox struct {
	ID string
	// TeamID owns the sandbox (SystemTeamID for internal ones).
	TeamID       string
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
	// Layers are the rootfs layers the sandbox runs on, top-most first
	// (nil for rows from before snapshots: its template's ready build).
	Layers []string
	// Image and SnapshotLayers are Layers by reference, for a node that
	// does not share the control plane's files: the image it boots from
	// (a built-in's name, or repository@sha256:… in the control plane's
	// registry; "" for rows from before references) and the snapshots
	// stacked above it by ID, top-most first.
	Image          string
	SnapshotLayers []string
	// PauseMemory: a timeout pause (AutoPause) keeps memory; false makes
	// it a filesystem pause (e2b's autoPauseMemory: false).
	PauseMemory bool
	// PausePackage is the package of the sandbox's current pause in the
	// snapshot store (nil: none, so it cannot resume on another node). It
	// is set only once the push of this pause finished and cleared when the
	// sandbox runs again, so a package of an earlier pause is never used.
	PausePackage *PausePackage
}

// PausePackage names the internal snapshot that packages a paused
// sandbox (cross-node resume).
type PausePackage struct {
	SnapshotID string `json:"snapshotID"`
	// FilesOnly: the pause kept memory that the package does not hold
	// (runc freezes it in its node's RAM), so only a reboot over its
	// files can resume it on another node.
	FilesOnly bool `json:"filesOnly,omitempty"`
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
	ID string
	// TeamID owns the volume; Name is unique within the team.
	TeamID      string
	Name        string
	Driver      string
	State       VolumeState
	Token       string
	PrivateData string
	// SizeMB is the volume's size, which its driver enforces (volume.Sized);
	// 0: no size (a driver that keeps data elsewhere, or a volume made
	// before sizes existed). The team's MaxVolumeMB sums it.
	SizeMB    int
	CreatedAt time.Time
	UpdatedAt time.Time
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
	// TeamID restricts the list to one team's rows ("" = every team: the
	// control plane's own scans). The API always sets it.
	TeamID   string
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
	ID     string
	TeamID string
	// Admin keys may also manage what all teams share: nodes and
	// accelerators, the image store, public and built-in templates.
	Admin     bool
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
	// CreateSandbox inserts the row (and its volume attachment rows). The
	// team's quota is checked in the same transaction, counting its live
	// rows: a *QuotaError (ErrQuota) when the new row would exceed it.
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
	// templateID on buildID, removes its pool metadata keys, hands it to
	// teamID and returns it, so two concurrent claims never get the same
	// row. ErrNotFound when there is none; a *QuotaError when moving it to
	// teamID would exceed that team's quota (checked in the same
	// transaction). nodes, when not nil, restricts the pick to standbys
	// whose row names one of them (the nodes a claim's placement policies
	// accept); an empty non-nil list matches none.
	ClaimPoolSandbox(ctx context.Context, templateID, buildID, teamID string, nodes []string) (*Sandbox, error)

	// CreateAPIKey stores a key of an existing team (ErrNotFound when the
	// team is missing); ErrConflict when the ID or hash exists.
	CreateAPIKey(ctx context.Context, k *APIKey) error
	// APIKeyByHash reads the key row on every call: nothing may cache it,
	// so a deleted key stops working with the next request.
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
	ListAPIKeys(ctx context.Context) ([]*APIKey, error)
	DeleteAPIKey(ctx context.Context, id string) error
	TouchAPIKey(ctx context.Context, id string, t time.Time) error

	// CreateTeam inserts a team; ErrConflict if the ID or name exists.
	CreateTeam(ctx context.Context, t *Team) error
	GetTeam(ctx context.Context, id string) (*Team, error)
	TeamByName(ctx context.Context, name string) (*Team, error)
	ListTeams(ctx context.Context) ([]*Team, error)
	// UpdateTeam writes the name and quota. ErrNotFound if missing.
	UpdateTeam(ctx context.Context, t *Team) error
	// DeleteTeam removes a team that owns nothing: ErrConflict while any
	// API key, live sandbox, volume or template belongs to it.
	DeleteTeam(ctx context.Context, id string) error

	// CreateVolume inserts a row; ErrConflict if the ID, or the name within
	// the team, exists; a *QuotaError when the team is at its volume quota,
	// or its volumes' sizes with this one would exceed MaxVolumeMB
	// (checked in the same transaction).
	CreateVolume(ctx context.Context, v *Volume) error
	GetVolume(ctx context.Context, id string) (*Volume, error)
	// VolumeByName finds a team's volume by name.
	VolumeByName(ctx context.Context, teamID, name string) (*Volume, error)
	// ListVolumes returns every team's volumes (the reconciler's scan).
	ListVolumes(ctx context.Context) ([]*Volume, error)
	// ListTeamVolumes returns one team's volumes, oldest first.
	ListTeamVolumes(ctx context.Context, teamID string) ([]*Volume, error)
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
	// MoveVolumeAttachments names node in a sandbox's rows: the sandbox
	// runs on node now and its old node confirmed the detach (a paused
	// sandbox resumed on another node). ErrNotFound when it has none.
	MoveVolumeAttachments(ctx context.Context, sandboxID, node string) error

	TemplateStore
	SnapshotStore
	SecretStore
	NodeStore
	ClusterStore
	PolicyStore

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
	ID string
	// TeamID owns the template; its names are unique within the team.
	// Public templates are visible to (and resolvable by name from) every
	// team, but only admin keys change them.
	TeamID        string
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
	// ImageDigest is Image's manifest digest ("sha256:<hex>"), recorded
	// with the image so every replica resolves the build's image from
	// this row rather than from its own image index; "" for builds
	// recorded before it and for builds that only re-use a rootfs.
	ImageDigest string
	Rootfs      string // unpacked filesystem the runtime uses as the lower layer
	Reason      string
	Step        string
	Spec        string // the start request (JSON), credentials removed
	CreatedAt   time.Time
	UpdatedAt   time.Time
	FinishedAt  time.Time
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

// TemplateReady is what a ready build sets on its template.
type TemplateReady struct {
	Image                          string
	StartCmd, ReadyCmd             string
	RunAs, Workdir                 string
	CPUCount, MemoryMB, DiskSizeMB int
}

// TemplateStore is the template catalog's persistence.
type TemplateStore interface {
	// CreateTemplate inserts the template, its names and its first build in
	// one transaction; ErrConflict when the ID or any name is taken in the
	// template's team.
	CreateTemplate(ctx context.Context, t *Template, b *TemplateBuild) error
	GetTemplate(ctx context.Context, id string) (*Template, error)
	// TemplateByName looks a name up as teamID sees it: the team's own
	// templates first, then public ones (the oldest, when several share it).
	TemplateByName(ctx context.Context, teamID, name string) (*Template, error)
	// ListTemplates pages every team's templates in creation order after
	// afterID (exclusive).
	ListTemplates(ctx context.Context, afterID string, limit int) ([]*Template, error)
	// ListTeamTemplates pages like ListTemplates over what teamID sees: its
	// own templates and public ones.
	ListTeamTemplates(ctx context.Context, teamID, afterID string, limit int) ([]*Template, error)
	// UpdateTemplate writes the template's settings. The counters
	// (BuildCount, SpawnCount, LastSpawnedAt) are not written: they only
	// change by the store's atomic increments (AddTemplateBuild,
	// RecordSpawn), so a stale row cannot roll them back.
	UpdateTemplate(ctx context.Context, t *Template) error
	// AddTemplateBuild records a new build, makes it the latest one and
	// increments BuildCount (t.BuildCount gets the stored value), in one
	// transaction and only while the template's latest build is still
	// prevLatestID and that build is neither running (building, uploaded)
	// nor queued (waiting with a spec): ErrConflict otherwise, e.g. when
	// another rebuild got there first. A prevLatestID build that was never
	// started is marked error, superseded, in the same transaction.
	AddTemplateBuild(ctx context.Context, t *Template, b *TemplateBuild, prevLatestID string) error
	// StartTemplateBuild stores the start request (spec) of a waiting build
	// that has none yet; ErrConflict when it was started or superseded.
	StartTemplateBuild(ctx context.Context, buildID, spec string) error
	// RecordTemplateBuild writes the build row and, in the same
	// transaction, mirrors its status onto the template when it is the
	// latest build; ready (for a ready build) also makes it the template's
	// ready build. Only those columns change, never the rest of the row.
	RecordTemplateBuild(ctx context.Context, b *TemplateBuild, ready *TemplateReady) error
	// DeleteTemplate removes the template; a snapshot's template also marks
	// the snapshot deleted, in the same transaction.
	DeleteTemplate(ctx context.Context, id string) error
	// SetTemplateNames replaces the names (unique within the template's
	// team; ErrConflict when one is taken).
	SetTemplateNames(ctx context.Context, id string, names []string) error
	// SetTemplateAlias makes alias the template's one name (its primary
	// name, plus alias:tag for each of its tags other than default),
	// replacing all its names, in one transaction. A template of the same
	// team that holds the alias loses it and its tagged forms (and its
	// primary name, when that was the alias). With newerOnly the alias is
	// not taken from a template created after this one: false, nil. An
	// empty alias leaves the template without names. ErrNotFound when
	// there is no such template.
	SetTemplateAlias(ctx context.Context, id, alias string, newerOnly bool) (bool, error)
	GetTemplateBuild(ctx context.Context, id string) (*TemplateBuild, error)
	ListTemplateBuilds(ctx context.Context, templateID string) ([]*TemplateBuild, error)
	UpdateTemplateBuild(ctx context.Context, b *TemplateBuild) error
	// TouchTemplateBuild sets the UpdatedAt of a build in progress
	// (building or uploaded) to now: the heartbeat by which the replica
	// running it tells the others it is alive. A build in another state is
	// left alone (no error); ErrNotFound when there is no such build.
	TouchTemplateBuild(ctx context.Context, id string) error
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
	// DeleteIdempotencyBefore removes keys created before t and says how many.
	DeleteIdempotencyBefore(ctx context.Context, t time.Time) (int, error)
}

// SnapshotObject is one part ("rootfs", "checkpoint") of a snapshot's
// package in the snapshot store, with the digest a fetch must match.
type SnapshotObject struct {
	Part   string `json:"part"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Snapshot is a captured sandbox. Its ID is also the ID of the template
// row that creates sandboxes from it.
type Snapshot struct {
	ID               string
	TeamID           string
	SandboxID        string // the source sandbox
	SourceTemplateID string // the template the source was created from
	Node             string
	Kind             string // "memory" or "filesystem"
	Runtime          string // memory images restore only on the runtime that took them
	// Layers are the rootfs layers sandboxes from it stack their upper on,
	// top-most (the snapshot's own layer) first.
	Layers     []string
	Checkpoint string // memory image dir ("" for filesystem snapshots)
	// Image and SnapshotLayers are Layers by reference (Sandbox's):
	// SnapshotLayers starts with the snapshot's own ID.
	Image          string
	SnapshotLayers []string
	// Package is the snapshot's own layer (and memory image) in the
	// snapshot store, for a restore on another node; nil when it was not
	// uploaded (no store configured, or the upload failed).
	Package   []SnapshotObject
	SizeBytes int64
	// Volumes are the source's mounts: IDs, paths, read-only flags; never
	// volume data or plugin private data.
	Volumes     []VolumeMount
	EnvVars     map[string]string
	DefaultUser string
	// AgentToken is the source agent's access token when the snapshot was
	// taken: a memory snapshot's agent wakes up holding it, and the node
	// needs it once to re-initialise that agent with its new sandbox's.
	AgentToken string
	// Internal snapshots (a fork's) are never listed; they are born deleted
	// and go with the last sandbox that uses them.
	Internal  bool
	CreatedAt time.Time
	DeletedAt time.Time // zero while the snapshot exists
}

// SnapshotFilter selects snapshots in ListSnapshots. Deleted (and
// internal) rows are only returned with IncludeDeleted.
type SnapshotFilter struct {
	TeamID         string // "" = every team
	SandboxID      string
	IncludeDeleted bool
	// Cursor pagination, newest first: rows strictly after (AfterCreated, AfterID).
	AfterCreated time.Time
	AfterID      string
	Limit        int
}

// SnapshotStore is the snapshots' persistence.
type SnapshotStore interface {
	// CreateSnapshot inserts the snapshot with its template row (t), names
	// and ready build (b) in one transaction; ErrConflict when the ID or a
	// name is taken in the team; a *QuotaError (ErrQuota) when the team
	// already has limit snapshots (0 = no limit; checked in the same
	// transaction). Internal snapshots are stored deleted and never count.
	CreateSnapshot(ctx context.Context, sn *Snapshot, t *Template, b *TemplateBuild, limit int) error
	// GetSnapshot returns the row, deleted or not.
	GetSnapshot(ctx context.Context, id string) (*Snapshot, error)
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]*Snapshot, error)
	// PurgeSnapshot removes a deleted snapshot's row (its files are gone).
	// ErrConflict while it is not deleted.
	PurgeSnapshot(ctx context.Context, id string) error
}

// Secret is one secret row. Sealed is the current version's value as the
// secret package sealed it (never plaintext); previous versions are dropped
// on update, so Version counts updates but only the current one is kept.
type Secret struct {
	ID        string
	TeamID    string
	Name      string
	Version   int
	Metadata  map[string]string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// SecretFilter pages one team's secrets, oldest first, after a cursor.
type SecretFilter struct {
	TeamID       string
	AfterCreated time.Time
	AfterID      string
	Limit        int
}

// SecretStore is the secrets' persistence. Every method is team-scoped:
// another team's secret is ErrNotFound, exactly like a missing one.
type SecretStore interface {
	// CreateSecret inserts the row; ErrConflict when the ID, or the name
	// within the team, is taken; ErrNotFound when the team is missing; a
	// *QuotaError when the team already has limit secrets (0 = no limit;
	// checked in the same transaction).
	CreateSecret(ctx context.Context, s *Secret, limit int) error
	// GetSecret finds a team's secret by ID, SecretByName by name.
	GetSecret(ctx context.Context, teamID, id string) (*Secret, error)
	SecretByName(ctx context.Context, teamID, name string) (*Secret, error)
	// ListSecrets returns up to f.Limit rows ordered by (created, id).
	ListSecrets(ctx context.Context, f SecretFilter) ([]*Secret, error)
	// UpdateSecret replaces the sealed value with version fromVersion+1
	// (and the metadata when metadata is non-nil) only while the row is at
	// fromVersion: ErrConflict when another update won, ErrNotFound when
	// the row is missing.
	UpdateSecret(ctx context.Context, teamID, id string, fromVersion int, sealed []byte, metadata map[string]string) (*Secret, error)
	// DeleteSecret removes the row; ErrNotFound when missing.
	DeleteSecret(ctx context.Context, teamID, id string) error
}
