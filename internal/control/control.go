// Package control is the sandbox control plane: it owns the lifecycle state
// machine in the store and drives nodes to match it.
package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/hostmount"
	"github.com/cubicle-dev/cubicle/internal/idlock"
	clusterlease "github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/loop"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// Typed errors mapped to HTTP statuses by the API layer.
var (
	ErrNotFound         = errors.New("sandbox not found")
	ErrConflict         = errors.New("sandbox state conflict")
	ErrInvalid          = errors.New("invalid request")
	ErrTemplateNotFound = errors.New("template not found")
	ErrCapacity         = errors.New("sandbox limit reached")
	ErrBusy             = errors.New("service busy")
)

// EnvdVersion is what every sandbox reports; the SDK gates features on it.
const EnvdVersion = agentapi.EnvdVersion

// Limits bound what a request may ask for.
const (
	MaxMetadataKeys   = 64
	MaxMetadataKey    = 256
	MaxMetadataValue  = 4096
	MaxMetadataBytes  = 16 << 10
	MaxEnvVars        = 256
	DefaultTimeout    = 300 * time.Second
	defaultUser       = "user"
	reapInterval      = 500 * time.Millisecond
	reconcileInterval = 30 * time.Second
)

// Config tunes the manager.
type Config struct {
	// Sealer encrypts credentials kept in sandbox rows (an egress
	// proxy's password) with the secrets key; nil keeps them as given.
	Sealer       FieldSealer
	MaxTimeout   time.Duration // default 24h
	MaxSandboxes int           // live sandboxes; 0 = unlimited
	// MaxSnapshotsPerTeam bounds the snapshots a team keeps (each holds up
	// to a sandbox's disk); 0 = unlimited. Forks' internal snapshots do
	// not count: they live only as long as forks, which the quota bounds.
	MaxSnapshotsPerTeam  int
	MaxConcurrentCreates int // default 32
	// PoolMemoryMB is the memory warm-pool standbys may hold beyond the
	// pools' set sizes: a pool whose template was created faster than its
	// size allows (the peak in any demandBucket of the last demandWindow)
	// grows to that peak while the standbys' memory, set sizes first,
	// stays within it. 0: pools keep their set sizes.
	PoolMemoryMB int
	// PoolRefillParallel bounds the standbys one pool boots at once
	// (default: half the CPUs, at least 2).
	PoolRefillParallel int
	CreateQueueWait    time.Duration // how long a create waits for a slot before 503
	Logger             *slog.Logger
	Registry           prometheus.Registerer // optional
	// Volumes routes driver names to controller plugins; nil = no volumes.
	Volumes       VolumeRegistry
	VolumeMetrics *VolumeMetrics // shared with the node; optional
	// ImageDigest turns a template's image reference in the control
	// plane's image store (Template.Image, "repo:tag") into what a node that
	// pulls images asks the registry for (repository and manifest digest);
	// nil = templates built here cannot boot on such a node.
	ImageDigest func(ref string) (node.Image, error)
	// BuiltinImage is a built-in image (base, mini, code-interpreter-v1)
	// as this control plane published it to its registry
	// (builtin/<name>@digest, serve --publish-builtins), from memory;
	// false (or nil): not published, and nodes get the built-in by name.
	BuiltinImage func(name string) (node.Image, bool)
	// SnapshotStore keeps snapshot packages for restores on another node
	// (serve --snapshot-store; nil: snapshots restore only on their own
	// node). Nodes get presigned URLs from it, never credentials.
	SnapshotStore SnapshotStore
	// ContentIdle is how long the volume-content API keeps a volume
	// attached after its last request (default 30s).
	ContentIdle time.Duration
	// ReadyTimeout bounds a template's ready command at create (default 120s).
	ReadyTimeout time.Duration
	// Server maxima for one sandbox's resources (0 = no bound): a template
	// asking for more is refused at create (ErrInvalid naming the field).
	MaxSandboxCPU      int
	MaxSandboxMemoryMB int
	MaxSandboxDiskMB   int
	// DefaultVolumeMB is the size of a volume created without one on a
	// driver that enforces sizes (volume.Sized); 0 makes such volumes
	// unsized. MaxVolumeMB bounds an asked size (0 = no bound).
	DefaultVolumeMB int
	MaxVolumeMB     int
	// Disk admits new sandbox disks and sized volumes against the data
	// filesystem's free space; nil admits everything.
	Disk DiskBudget
	// Scheduler places sandboxes (serve's --schedule picks its
	// strategy); nil is scheduler.New's defaults (spread).
	Scheduler *scheduler.Scheduler
	// Leaser runs the cluster-wide loops (reaper, reconcilers, pool
	// refill, snapshot GC, node loss) on one replica at a time;
	// nil = lease.Local (one control plane).
	Leaser clusterlease.Leaser
	// Locks serialises lifecycle operations per sandbox; replicas on one
	// database share an idlock.Postgres. nil = an in-process idlock.Map.
	Locks idlock.Locker
	// NodeLostAfter: a node whose heartbeat is older is lost, and its
	// running and paused sandboxes are too (default 15s).
	NodeLostAfter time.Duration
	// NodeLostGrace: how long sandboxes stay lost before they are killed
	// (default 10m).
	NodeLostGrace time.Duration
	// NodeID names the in-process node given to New (default "local").
	NodeID string
	// Nodes is the set of nodes to drive, in place of New's one node.
	Nodes *nodeset.Set
	// HostMountPrefixes are the host directories (canonical, see
	// hostmount.CheckPrefix) under which CubeSandbox's host mounts may
	// name a hostPath; none: host mounts are refused.
	HostMountPrefixes []string
	// Reserve makes every create reserve its CPU and memory on the
	// chosen node in the store's capacity ledger even when the only node
	// is the in-process one (serve --reserve-capacity). Without it,
	// creates reserve only while the set holds a node other than the
	// in-process one.
	Reserve bool
}

// DiskBudget admits a new sparse image (diskbudget.Budget): it returns an
// error matching diskbudget.ErrInsufficientStorage when the data
// filesystem cannot hold it, or a release to call once the image exists
// (or its create failed).
type DiskBudget interface {
	Reserve(key, what string, sizeBytes int64) (release func(), err error)
}

// reserveDisk reserves an image of sizeMB for key; a no-op without a
// budget or a size.
func (m *Manager) reserveDisk(key, what string, sizeMB int) (func(), error) {
	if m.cfg.Disk == nil || sizeMB <= 0 {
		return func() {}, nil
	}
	return m.cfg.Disk.Reserve(key, what, int64(sizeMB)<<20)
}

// TeamResolver is a template.Resolver that knows teams: it resolves a
// reference as one team sees templates (its own and public ones). The
// catalog implements it; plain image resolvers have nothing team-owned.
type TeamResolver interface {
	ResolveTeam(ctx context.Context, teamID, ref string) (template.Template, error)
}

// Manager is the control plane.
type Manager struct {
	cfg       Config
	store     store.Store
	nodes     *nodeset.Set
	templates template.Resolver
	log       *slog.Logger
	sched     *scheduler.Scheduler
	policies  policyCache

	createSlots chan struct{}
	locks       idlock.Locker // serialises lifecycle ops per sandbox, across replicas
	localLocks  idlock.Map    // serialises this process's own state (volume-content leases)
	loops       *loop.Runner
	samples     sampler
	sampleEvery time.Duration // sampleInterval; tests shorten it
	metrics     *opMetrics
	phases      *phaseMetrics
	volumes     VolumeRegistry
	volMetrics  *VolumeMetrics
	leases      *leases

	snapMetrics  *snapshotMetrics
	snapKick     chan struct{}
	snapMu       sync.Mutex
	snapInFlight map[string]bool // snapshot IDs whose row is not written yet

	pool        *poolMetrics
	poolKick    chan struct{}
	userCreates atomic.Int64 // user creates booting; the pool waits for them
	// pulls caches, per node ID, whether the node resolves image
	// references itself (pullsImages).
	pulls sync.Map
	// wasSilent holds the IDs of nodes the node-loss loop found silent
	// and has not yet repaired since they returned (this replica's view;
	// after a failover the periodic reconcile repairs them).
	wasSilent sync.Map
}

// New builds a manager; call Recover before serving and Run in the
// background. n is the in-process node (embedded mode), named
// cfg.NodeID; cfg.Nodes replaces it with a set of nodes (n is then nil).
func New(cfg Config, st store.Store, n node.Node, tr template.Resolver) *Manager {
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.MaxConcurrentCreates == 0 {
		cfg.MaxConcurrentCreates = 32
	}
	if cfg.CreateQueueWait == 0 {
		cfg.CreateQueueWait = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.VolumeMetrics == nil {
		cfg.VolumeMetrics = NewVolumeMetrics(cfg.Registry)
	}
	if cfg.ContentIdle == 0 {
		cfg.ContentIdle = 30 * time.Second
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 120 * time.Second
	}
	if cfg.Leaser == nil {
		cfg.Leaser = clusterlease.NewLocal()
	}
	if cfg.Locks == nil {
		cfg.Locks = &idlock.Map{}
	}
	if cfg.NodeLostAfter <= 0 { // serve refuses a negative flag
		cfg.NodeLostAfter = DefaultNodeLostAfter
	}
	if cfg.NodeLostGrace <= 0 {
		cfg.NodeLostGrace = DefaultNodeLostGrace
	}
	nodes := cfg.Nodes
	if nodes == nil {
		if cfg.NodeID == "" {
			cfg.NodeID = "local"
		}
		nodes = nodeset.Single(cfg.NodeID, n)
	}
	m := &Manager{cfg: cfg, store: st, nodes: nodes, templates: tr, log: cfg.Logger,
		createSlots: make(chan struct{}, cfg.MaxConcurrentCreates), metrics: newOpMetrics(cfg.Registry), phases: newPhaseMetrics(cfg.Registry),
		volumes: cfg.Volumes, volMetrics: cfg.VolumeMetrics, pool: newPoolMetrics(cfg.Registry), poolKick: make(chan struct{}, 1),
		sampleEvery: sampleInterval, snapMetrics: newSnapshotMetrics(cfg.Registry), snapKick: make(chan struct{}, 1),
		snapInFlight: map[string]bool{}, locks: cfg.Locks, loops: loop.New(cfg.Leaser, cfg.Logger)}
	m.leases = newLeases(m, cfg.ContentIdle)
	m.sched = cfg.Scheduler
	if m.sched == nil {
		// A positive TTL always validates. The scheduler's lease TTL is the
		// node-loss threshold: a node whose sandboxes are lost gets no new ones.
		m.sched, _ = scheduler.New(scheduler.Config{LeaseTTL: cfg.NodeLostAfter})
	}
	return m
}

// lock takes a sandbox's lock: across every replica sharing the store's
// database (idlock.Postgres), or in-process (idlock.Map). It fails only
// when ctx ends or the lock's database is unreachable.
func (m *Manager) lock(ctx context.Context, id string) (func(), error) {
	release, err := m.locks.Acquire(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return release, nil
}

// NewID returns 20 chars of [a-z0-9], the shape the e2b proxy accepts.
func NewID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func token(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// CreateOptions is a validated create request.
type CreateOptions struct {
	TemplateID string
	Timeout    time.Duration
	Metadata   map[string]string
	EnvVars    map[string]string
	Network    store.Network
	AutoPause  bool
	AutoResume bool
	APIKeyID   string
	// TeamID owns the sandbox; templates and volumes resolve in its
	// namespace and its quota applies.
	TeamID       string
	VolumeMounts []VolumeMount
	// HostMounts: the caller may ask for host mounts (an admin key, or a
	// team serve --host-mount-team names); they are metadata["host-mount"].
	HostMounts bool
	// Accelerators is Cubicle's extension: devices the sandbox needs.
	Accelerators []accel.Request
	// PauseFilesystem makes the timeout pause (AutoPause) a filesystem
	// pause: e2b's autoPauseMemory: false.
	PauseFilesystem bool
	// snapshot is set by Create when TemplateID names a snapshot.
	snapshot *store.Snapshot
	// hostMounts are the validated metadata["host-mount"] (Create).
	hostMounts []hostmount.Mount
}

// VolumeMount is a requested volume attachment. Name is the volume's ID
// (which equals its name).
type VolumeMount struct {
	Name, Path string
	ReadOnly   bool
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// ValidateMetadata enforces the metadata size limits.
func ValidateMetadata(md map[string]string) error {
	if len(md) > MaxMetadataKeys {
		return invalid("metadata has %d keys, at most %d allowed", len(md), MaxMetadataKeys)
	}
	total := 0
	for k, v := range md {
		if k == "" {
			return invalid("metadata key must not be empty")
		}
		if len(k) > MaxMetadataKey {
			return invalid("metadata key %.32q… is longer than %d bytes", k, MaxMetadataKey)
		}
		if len(v) > MaxMetadataValue {
			return invalid("metadata value for %q is longer than %d bytes", k, MaxMetadataValue)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return invalid("metadata is %d bytes, at most %d allowed", total, MaxMetadataBytes)
	}
	return nil
}

func (m *Manager) validate(ctx context.Context, o *CreateOptions) error {
	if o.Timeout < 0 {
		return invalid("timeout must be >= 0, got %v", o.Timeout.Seconds())
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout > m.cfg.MaxTimeout {
		return invalid("timeout %ds exceeds the maximum of %ds", int(o.Timeout.Seconds()), int(m.cfg.MaxTimeout.Seconds()))
	}
	if err := ValidateMetadata(o.Metadata); err != nil {
		return err
	}
	if len(o.EnvVars) > MaxEnvVars {
		return invalid("at most %d envVars allowed", MaxEnvVars)
	}
	for k := range o.EnvVars {
		if k == "" {
			return invalid("envVars key must not be empty")
		}
		for _, c := range k {
			if c == '=' || c == 0 {
				return invalid("envVars key %q contains '=' or NUL", k)
			}
		}
	}
	// The node-side checks run here against the in-process node; a
	// create placed elsewhere is checked again on its node (createFrom).
	local, _ := m.nodes.Local()
	return m.checkNetwork(ctx, &o.Network, m.nodes.LocalNode(), local)
}

// checkNetworkOn is checkNetwork's part that asks the node.
func (m *Manager) checkNetworkOn(ctx context.Context, p network.Policy, nd node.Node, nodeID string) error {
	info, err := m.nodeInfo(ctx, nd, nodeID)
	if err != nil {
		return err
	}
	if err := m.checkEnforced(info, p); err != nil {
		return invalid("network.%v", err)
	}
	if p.Upstream != nil {
		if !info.Abilities.EgressProxy {
			return invalid("network.egressProxy: this node runs no egress proxy to tunnel through")
		}
		if err := nd.CheckUpstream(ctx, p.Upstream.Address); err != nil {
			return invalid("network.%v", err)
		}
	}
	return nil
}

// checkEnforced refuses domain entries unless the node's egress proxy
// judges them: accepted and unenforced, they would fail open.
func (m *Manager) checkEnforced(info node.Info, p network.Policy) error {
	if info.Abilities.EnforcesDomains {
		return nil
	}
	return network.CheckEnforced(p)
}

func policyOf(n store.Network) network.Policy {
	p := network.Policy{AllowInternet: n.AllowInternet, AllowOut: n.AllowOut, DenyOut: n.DenyOut, DNSServers: n.DNSServers}
	if len(n.Rules) > 0 {
		p.Rules = make(map[string][]network.Rule, len(n.Rules))
		for host, list := range n.Rules {
			rs := make([]network.Rule, len(list))
			for i, r := range list {
				rs[i] = network.Rule{Headers: r.Headers, Plain: r.Plain, Port: uint16(r.Port)}
			}
			p.Rules[host] = rs
		}
	}
	if e := n.EgressProxy; e != nil {
		p.Upstream = &network.Upstream{Address: e.Address, Username: e.Username, Password: e.Password}
		if e.TLS {
			p.Upstream.TLS = &network.UpstreamTLS{ServerName: e.TLSServerName, CACert: e.TLSCACert}
		}
	}
	return p
}

// checkNetwork validates n for node nd (called nodeID) and normalises it
// (rule hosts lower-cased): shape, domain enforcement, and where an egress
// proxy points. With nd nil (no node chosen yet) only the shape is
// checked.
func (m *Manager) checkNetwork(ctx context.Context, n *store.Network, nd node.Node, nodeID string) error {
	p := policyOf(*n)
	if err := network.ValidatePolicy(p); err != nil {
		return invalid("network.%v", err)
	}
	if nd != nil {
		if err := m.checkNetworkOn(ctx, p, nd, nodeID); err != nil {
			return err
		}
	}
	if len(n.Rules) > 0 {
		norm := make(map[string][]store.NetworkRule, len(n.Rules))
		for host, list := range n.Rules {
			d, _, _ := network.RuleKey(host) // valid: checked above
			norm[d] = list
		}
		n.Rules = norm
	}
	return nil
}

func (m *Manager) event(ctx context.Context, id, typ, level, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if err := m.store.AppendEvent(context.WithoutCancel(ctx), &store.Event{SandboxID: id, Type: typ, Level: level, Message: msg}); err != nil {
		m.log.Warn("append event", "sandbox", id, "err", err)
	}
}

// validateCreate checks o (normalising it) and resolves its template.
func (m *Manager) validateCreate(ctx context.Context, o *CreateOptions) (tpl template.Template, err error) {
	if err := m.validate(ctx, o); err != nil {
		return tpl, err
	}
	if err := m.sealNetwork(o.TeamID, &o.Network); err != nil {
		return tpl, err
	}
	if tr, ok := m.templates.(TeamResolver); ok {
		tpl, err = tr.ResolveTeam(ctx, o.TeamID, o.TemplateID)
	} else {
		tpl, err = m.templates.Resolve(ctx, o.TemplateID)
	}
	if err != nil {
		if errors.Is(err, template.ErrNotFound) {
			return tpl, fmt.Errorf("%w: template '%s' not found", ErrTemplateNotFound, o.TemplateID)
		}
		if errors.Is(err, template.ErrNotReady) {
			return tpl, fmt.Errorf("%w: template '%s' is not ready", ErrConflict, o.TemplateID)
		}
		return tpl, err
	}
	return tpl, nil
}

// Create starts a sandbox. The store row is written first (state creating) so
// a crash mid-create is visible to recovery.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (_ *store.Sandbox, err error) {
	defer m.metrics.observe("create", time.Now(), &err)
	// The caller's trace (the API's, for its Server-Timing header) or
	// one of our own: every create feeds the phase histogram.
	tr := phase.From(ctx)
	if tr == nil {
		tr = phase.New()
		ctx = phase.With(ctx, tr)
	}
	defer m.phases.observe(tr, time.Now(), &err)
	endValidate := phase.Start(ctx, phase.Validate)
	tpl, err := m.validateCreate(ctx, &o)
	if err == nil {
		o.hostMounts, err = m.hostMounts(&o)
	}
	endValidate()
	if err != nil {
		return nil, err
	}
	endStore := phase.Start(ctx, phase.Store)
	sn, err := m.store.GetSnapshot(ctx, tpl.ID)
	endStore()
	if err == nil {
		if len(o.Accelerators) > 0 {
			return nil, invalid("accelerators: a sandbox from a snapshot cannot have accelerators")
		}
		o.snapshot = sn
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if len(tpl.Env) > 0 {
		// The template's env under the create's own.
		env := maps.Clone(tpl.Env)
		maps.Copy(env, o.EnvVars)
		o.EnvVars = env
	}
	// Devices cannot be checkpointed, so autoPause would silently become a
	// kill at timeout: refuse it up front.
	if o.AutoPause && (len(o.Accelerators) > 0 || tpl.Accelerators != nil) {
		return nil, invalid("autoPause is not supported for sandboxes with accelerators (GPU sandboxes cannot pause); create it without autoPause")
	}
	var sb *store.Sandbox
	claimed := false
	// A pooled template's create is a claim when a standby of its current
	// build is idle; volumes are attached at boot, so those always boot.
	if tpl.PoolSize > 0 && tpl.BuildID != "" && len(o.VolumeMounts) == 0 && len(o.Accelerators) == 0 && o.snapshot == nil && len(o.hostMounts) == 0 {
		// A claim skips placement, so placement policies are judged
		// first: a standby on a node they refuse is not handed out (the
		// claim picks among the nodes they accept).
		endSchedule := phase.Start(ctx, phase.Schedule)
		pols, err := m.placementPolicies(ctx, o.TeamID, tpl.ID)
		endSchedule()
		if err != nil {
			return nil, err
		}
		var onNodes []string
		if len(pols) > 0 {
			pl, err := m.place(ctx, o, tpl, placeRequest{judgeOnly: true})
			if err != nil {
				return nil, err
			}
			onNodes = pl.accepted
			if local, ok := m.nodes.Local(); ok && slices.Contains(onNodes, local) {
				onNodes = append(onNodes, "") // rows from before nodes had names
			}
		}
		sb, claimed = m.claim(ctx, o, tpl, onNodes)
	}
	if !claimed {
		m.userCreates.Add(1)
		sb, err = m.createFrom(ctx, o, tpl)
		m.userCreates.Add(-1)
		if err != nil {
			return sb, err
		}
	}
	if sp, ok := m.templates.(interface{ Spawned(context.Context, string) }); ok {
		sp.Spawned(ctx, tpl.ID)
	}
	return sb, nil
}

// ReadyTimeoutError: the template's ready command did not succeed in time.
// The sandbox is kept (running) so its start-command log can be read.
type ReadyTimeoutError struct {
	SandboxID string
	LogPath   string
	Err       error
}

func (e *ReadyTimeoutError) Error() string {
	return fmt.Sprintf("template ready command timed out (sandbox %s, log %s): %v", e.SandboxID, e.LogPath, e.Err)
}
func (e *ReadyTimeoutError) Unwrap() error { return ErrReadyTimeout }

// ErrReadyTimeout is what ReadyTimeoutError matches with errors.Is.
var ErrReadyTimeout = errors.New("template ready command timed out")

// StartCmdLog is where the agent writes a template start command's output.
const StartCmdLog = "/var/log/cubicle/start-cmd.log"

// templateUser maps a template USER onto the agent's default user.
func templateUser(runAs string) string {
	switch runAs {
	case "", "1000", "1000:1000":
		return defaultUser
	case "0", "0:0":
		return "root"
	}
	return runAs
}

// checkSize refuses a template bigger than the server maxima.
func (m *Manager) checkSize(tpl template.Template) error {
	for _, c := range []struct {
		field    string
		got, max int
	}{{"cpuCount", tpl.CPUCount, m.cfg.MaxSandboxCPU}, {"memoryMB", tpl.MemoryMB, m.cfg.MaxSandboxMemoryMB}, {"diskSizeMB", tpl.DiskSizeMB, m.cfg.MaxSandboxDiskMB}} {
		if c.max > 0 && c.got > c.max {
			return invalid("template '%s' asks for %s %d, above the server maximum of %d", tpl.ID, c.field, c.got, c.max)
		}
	}
	return nil
}

// takeCreateSlot waits for one of the MaxConcurrentCreates start slots
// (released with <-m.createSlots), at most CreateQueueWait.
func (m *Manager) takeCreateSlot(ctx context.Context) error {
	defer phase.Start(ctx, phase.LockWait)()
	wait := time.NewTimer(m.cfg.CreateQueueWait)
	defer wait.Stop()
	select {
	case m.createSlots <- struct{}{}:
		return nil
	case <-wait.C:
		return fmt.Errorf("%w: too many sandboxes starting at once, try again", ErrBusy)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) createFrom(ctx context.Context, o CreateOptions, tpl template.Template) (_ *store.Sandbox, err error) {
	if err := m.checkSize(tpl); err != nil {
		return nil, err
	}
	if m.cfg.MaxSandboxes > 0 {
		endStore := phase.Start(ctx, phase.Store)
		n, err := m.store.CountSandboxes(ctx, []store.SandboxState{store.StateCreating, store.StateRunning, store.StatePausing, store.StateResuming})
		endStore()
		if err != nil {
			return nil, err
		}
		if n >= m.cfg.MaxSandboxes {
			return nil, fmt.Errorf("%w: %d running sandboxes, the limit is %d", ErrCapacity, n, m.cfg.MaxSandboxes)
		}
	}
	if err := m.takeCreateSlot(ctx); err != nil {
		return nil, err
	}
	released := false
	release := func() {
		if !released {
			released = true
			<-m.createSlots
		}
	}
	defer release()

	accels, err := m.accelRequest(o, tpl)
	if err != nil {
		return nil, err
	}
	pr := placeRequest{sandboxID: NewID(), accels: accels, drivers: m.mountDrivers(ctx, o.TeamID, o.VolumeMounts)}
	wantMounts := o.VolumeMounts
	if len(wantMounts) == 0 && o.snapshot != nil {
		// What the create will mount.
		if wantMounts, err = m.mountsByName(ctx, o.snapshot.Volumes); err != nil {
			return nil, err
		}
	}
	if pr.volPin, pr.volPinWhy, err = m.localVolumeNode(ctx, o.TeamID, wantMounts); err != nil {
		return nil, err
	}
	if sn := o.snapshot; sn != nil {
		pr.pin = sn.Node // its files are on that node...
		// ...unless its chain is in the snapshot store, for a node that
		// pulls images.
		pr.movable = m.movable(ctx, sn) == nil
	}
	if len(o.hostMounts) > 0 {
		// Host directories are the control plane's host's: its own node
		// mounts them, and the sandbox stays there.
		local, ok := m.nodes.Local()
		if !ok {
			return nil, invalid("%q: host mounts are made by the control plane's own node, and this one runs none (serve --embedded-node=false)", hostmount.Key)
		}
		if pr.pin != "" && pr.pin != local && !pr.movable {
			return nil, invalid("%q: the snapshot is on node %s, and host mounts are made by the control plane's own node %s", hostmount.Key, pr.pin, local)
		}
		pr.pin, pr.movable = local, false
	}
	endSchedule := phase.Start(ctx, phase.Schedule)
	pl, err := m.place(ctx, o, tpl, pr)
	endSchedule()
	if err != nil {
		return nil, m.pinnedError(ctx, o.snapshot, err)
	}
	rowMade := false
	defer func() {
		// Before the row exists nothing else frees the reservation.
		if err != nil && !rowMade && pl.reserved {
			m.release(ctx, pr.sandboxID)
		}
	}()
	if local, _ := m.nodes.Local(); pl.nodeID != local {
		// Validation judged the network against the in-process node.
		if err := m.checkNetworkOn(ctx, policyOf(o.Network), pl.node, pl.nodeID); err != nil {
			return nil, err
		}
	}
	defaultUser := templateUser(tpl.RunAs)
	if sn := o.snapshot; sn != nil {
		// The snapshot's volumes (the current records, attached here:
		// shared with the source, never copied) unless the create names
		// its own; its env under the create's.
		if len(o.VolumeMounts) == 0 {
			o.VolumeMounts = wantMounts
		}
		env := maps.Clone(sn.EnvVars)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, o.EnvVars)
		o.EnvVars = env
		if sn.DefaultUser != "" {
			defaultUser = sn.DefaultUser
		}
	}
	mounts, attachments, err := m.resolveMounts(ctx, o.TeamID, o.VolumeMounts, pl.node, pl.nodeID)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sb := &store.Sandbox{
		ID: pr.sandboxID, TeamID: o.TeamID, TemplateID: tpl.ID, Alias: tpl.Alias, State: store.StateCreating, Node: pl.nodeID,
		Metadata: o.Metadata, EnvVars: o.EnvVars, EnvdToken: token(16), TrafficToken: token(16),
		CPUCount: tpl.CPUCount, MemoryMB: tpl.MemoryMB, DiskSizeMB: tpl.DiskSizeMB,
		Network: o.Network, AutoPause: o.AutoPause, AutoResume: o.AutoResume, APIKeyID: o.APIKeyID,
		StartedAt: now, EndAt: now.Add(o.Timeout), Volumes: mounts, DefaultUser: defaultUser,
		Accelerators: accelJSON(accels), Layers: tpl.Layers, PauseMemory: !o.PauseFilesystem,
	}
	var restore, currentToken string
	if o.snapshot != nil {
		if restore, currentToken, err = m.restoreOf(ctx, o.snapshot, sb); err != nil {
			return nil, err
		}
	}
	if sn := o.snapshot; sn != nil && pl.nodeID != sn.Node {
		// Placed off the snapshot's node: the node fetches the chain first.
		if err := m.fetchChain(ctx, pl.node, pl.nodeID, sn); err != nil {
			return nil, err
		}
	}
	// Before the row: a node that cannot boot the template refuses it
	// without leaving a sandbox behind.
	boot, err := m.bootImage(ctx, pl.nodeID, pl.node, tpl, o.snapshot)
	if err != nil {
		return nil, err
	}
	// The row names what it boots from by reference too, so its snapshots
	// (and a rollback) can be named to a node that does not share files.
	if !boot.IsZero() {
		sb.Image = boot.String()
	}
	if o.snapshot != nil {
		sb.SnapshotLayers = o.snapshot.SnapshotLayers
	}
	// Stands in for the disk image until the node has made it. The
	// budget is the in-process node's data filesystem: a remote node's
	// disk is its own.
	releaseDisk := func() {}
	if m.nodes.IsLocal(pl.nodeID) {
		if releaseDisk, err = m.reserveDisk("sandbox/"+sb.ID, fmt.Sprintf("a %d MiB sandbox disk", sb.DiskSizeMB), sb.DiskSizeMB); err != nil {
			return nil, err
		}
	}
	defer releaseDisk()
	endStore := phase.Start(ctx, phase.Store)
	err = m.store.CreateSandbox(ctx, sb)
	endStore()
	if err != nil {
		if errors.Is(err, store.ErrConflict) && len(mounts) > 0 {
			return nil, fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return nil, err
	}
	rowMade = true
	// The node work must not be abandoned half way because the client went away.
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	endWait := phase.Start(nctx, phase.LockWait)
	unlock, err := m.lock(nctx, sb.ID)
	endWait()
	if err != nil {
		m.markKilled(nctx, sb, "create failed: "+err.Error(), nil) // nothing reached the node
		return nil, err
	}
	defer unlock()
	req, err := m.nodeRequest(sb, tpl.Layers)
	if err != nil {
		m.markKilled(nctx, sb, "create failed: "+err.Error(), nil) // nothing reached the node
		return nil, err
	}
	req.Volumes = attachments
	req.Accelerators, req.AccelContract = accels, tpl.Accelerators
	req.Restore, req.CurrentToken = restore, currentToken
	if !boot.IsZero() {
		byReference(&req, boot, sb.SnapshotLayers, o.snapshot != nil && o.snapshot.Kind == runtime.SnapshotMemory)
	}
	req.StartCmd, req.StartUser, req.StartWorkdir, req.DefaultWorkdir = tpl.StartCmd, sb.DefaultUser, tpl.Workdir, tpl.Workdir
	placed, err := pl.node.Create(nctx, req)
	// Not retried elsewhere: volume attachments name the first node, and
	// a snapshot's chain was fetched to (or lives on) the first node.
	if err != nil && retryable(err) && len(attachments) == 0 && o.snapshot == nil && len(o.hostMounts) == 0 {
		pl, placed, err = m.createElsewhere(nctx, o, tpl, pr, sb, req, pl, err)
	}
	releaseDisk()
	if err != nil {
		// Delete again: the node's own rollback may have failed to detach,
		// and the attachment rows may only go once the node confirmed it.
		derr := pl.node.Delete(nctx, sb.ID)
		m.markKilled(nctx, sb, "create failed: "+err.Error(), derr)
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	for _, va := range attachments {
		m.volumeEvent(ctx, va.VolumeID, sb.ID, "volume.attached", "info", "attached to sandbox %s at %s (read-only %v)", sb.ID, va.Path, va.ReadOnly)
	}
	sb.Addr = placed.Addr.String()
	sb.State = store.StateRunning
	endStore = phase.Start(ctx, phase.Store)
	err = m.store.UpdateSandbox(nctx, sb)
	if err != nil {
		endStore()
		_ = pl.node.Delete(nctx, sb.ID)
		return nil, err
	}
	m.event(ctx, sb.ID, "created", "info", "sandbox created from template %s on node %s", sb.TemplateID, sb.Node)
	endStore()
	// The start slot is for booting; waiting on a slow ready command must
	// not hold up other creates.
	release()
	if tpl.ReadyCmd != "" {
		if err := m.waitReady(ctx, sb, tpl.ReadyCmd); err != nil {
			m.event(ctx, sb.ID, "ready-timeout", "error", "ready command %q did not succeed: %v", tpl.ReadyCmd, err)
			return sb, &ReadyTimeoutError{SandboxID: sb.ID, LogPath: StartCmdLog, Err: err}
		}
	}
	return sb, nil
}

// waitReady polls the template's ready command until it exits 0.
func (m *Manager) waitReady(ctx context.Context, sb *store.Sandbox, cmd string) error {
	deadline := time.Now().Add(m.cfg.ReadyTimeout)
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		code, err := m.runOn(rctx, sb, cmd)
		cancel()
		if err == nil && code == 0 {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("exit status %d", code)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", m.cfg.ReadyTimeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Probe runs a build's ready command in a throwaway sandbox of its rootfs
// (catalog.Prober).
func (m *Manager) Probe(ctx context.Context, rootfs string, t template.Template) error {
	t.Layers = template.Layers(rootfs)
	sb, err := m.createFrom(ctx, CreateOptions{Timeout: m.cfg.ReadyTimeout + time.Minute, Metadata: map[string]string{"cubicle.template-probe": t.ID},
		Network: store.Network{AllowInternet: true}, EnvVars: t.Env}, t)
	if sb != nil {
		defer m.Kill(context.WithoutCancel(ctx), sb.ID, "template ready probe finished")
	}
	return err
}

func (m *Manager) nodeRequest(sb *store.Sandbox, layers []string) (node.CreateRequest, error) {
	mounts, err := m.hostRuntimeMounts(sb)
	if err != nil {
		return node.CreateRequest{}, err
	}
	return node.CreateRequest{
		ID: sb.ID, Layers: layers, EnvdToken: sb.EnvdToken, EnvVars: sb.EnvVars, DefaultUser: orDefault(sb.DefaultUser),
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskSizeMB, Policy: m.policyFor(sb.TeamID, sb.Network),
		Mounts: mounts,
	}, nil
}

// markKilled records the kill. The sandbox's volume references go only when
// the node confirmed its cleanup (nodeErr == nil); otherwise the reconciler
// retries the node cleanup and drops them then.
func orDefault(u string) string {
	if u == "" {
		return defaultUser
	}
	return u
}

func (m *Manager) markKilled(ctx context.Context, sb *store.Sandbox, reason string, nodeErr error) {
	sb.State = store.StateKilled
	sb.KilledAt = time.Now().UTC()
	sb.KillReason = reason
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		m.log.Error("mark killed", "sandbox", sb.ID, "err", err)
	}
	m.event(ctx, sb.ID, "killed", "info", "%s", reason)
	m.SnapshotTrigger() // it may have been the last user of a deleted snapshot's files
	if nodeErr == nil && len(sb.Volumes) > 0 {
		m.dropAttachments(ctx, sb)
	}
}

// Get returns a live sandbox; killed ones are NotFound, as in e2b, and so
// are unclaimed warm-pool standbys: users never see or touch those.
//
// Under WithTeam, another team's sandbox is NotFound too: every user-facing
// operation (kill, timeout, pause, connect, network, logs, metrics) starts
// with Get.
func (m *Manager) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := m.get(ctx, id)
	if err != nil {
		return nil, m.endedError(ctx, id, err) // a recent end is named (lifecycle.go)
	}
	if IsStandby(sb) || !teamSees(ctx, sb) {
		return nil, fmt.Errorf("%w: sandbox '%s' not found", ErrNotFound, id)
	}
	return sb, err
}

// get is Get including standbys (the control plane's own operations).
func (m *Manager) get(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := m.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !sb.State.Live()) {
		return nil, fmt.Errorf("%w: sandbox '%s' not found", ErrNotFound, id)
	}
	return sb, err
}

// List passes the filter to the store, without warm-pool standbys.
func (m *Manager) List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	f.ExcludeMetadataKey = PoolKey
	return m.store.ListSandboxes(ctx, f)
}

// CountRunning counts the team's running sandboxes users can see (warm-pool
// standbys are not theirs).
func (m *Manager) CountRunning(ctx context.Context, teamID string) (int, error) {
	rows, err := m.List(ctx, store.SandboxFilter{TeamID: teamID, States: []store.SandboxState{store.StateRunning}})
	return len(rows), err
}

// Kill removes the sandbox from its node and marks it killed.
func (m *Manager) Kill(ctx context.Context, id, reason string) error {
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := m.Get(ctx, id); err != nil {
		return err
	}
	return m.killLocked(ctx, id, reason)
}

func (m *Manager) killLocked(ctx context.Context, id, reason string) (err error) {
	defer m.metrics.observe("kill", time.Now(), &err)
	sb, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// The row goes to killed first, so no caller sees a sandbox that is
	// already stopping as alive; a crash before the node cleanup leaves a
	// killed row with node leftovers, which the reconciler deletes. Volume
	// references are dropped only after the node confirmed the detach.
	sb.State, sb.KilledAt, sb.KillReason = store.StateKilled, time.Now().UTC(), reason
	if err := m.store.UpdateSandbox(nctx, sb); err != nil {
		return err
	}
	nerr := m.deleteOn(nctx, sb)
	if nerr != nil {
		m.log.Error("node delete", "sandbox", id, "err", nerr)
		reason += " (node cleanup pending: " + nerr.Error() + ")"
	}
	m.markKilled(nctx, sb, reason, nerr)
	return nil
}

// SetTimeout sets the expiry to now+d (may shorten it).
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if d < 0 || d > m.cfg.MaxTimeout {
		return invalid("timeout must be between 0 and %d seconds", int(m.cfg.MaxTimeout.Seconds()))
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	sb.EndAt = time.Now().UTC().Add(d)
	return m.store.UpdateSandbox(ctx, sb)
}

// Refresh only extends the expiry.
func (m *Manager) Refresh(ctx context.Context, id string, d time.Duration) error {
	if d < 0 || d > time.Hour {
		return invalid("duration must be between 0 and 3600 seconds")
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	if end := time.Now().UTC().Add(d); end.After(sb.EndAt) {
		sb.EndAt = end
	}
	return m.store.UpdateSandbox(ctx, sb)
}

// Pause pauses a running sandbox: keepMemory freezes (runc) or
// checkpoints (runsc) it; otherwise its processes end and its files stay,
// and a resume boots it afresh (e2b's memory: false). ErrConflict when it
// is already paused.
func (m *Manager) Pause(ctx context.Context, id string, keepMemory bool) error {
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := m.Get(ctx, id); err != nil {
		return err
	}
	why := "paused by request"
	if !keepMemory {
		why = "paused by request (filesystem only)"
	}
	return m.pauseLocked(ctx, id, why, keepMemory)
}

func (m *Manager) pauseLocked(ctx context.Context, id, why string, keepMemory bool) (err error) {
	defer m.metrics.observe("pause", time.Now(), &err)
	sb, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	if sb.State == store.StatePaused {
		return fmt.Errorf("%w: sandbox '%s' is already paused", ErrConflict, id)
	}
	if hasAccelerators(sb) {
		return fmt.Errorf("%w: sandbox '%s' cannot be paused: %w", ErrConflict, id, ErrAccelUnsupported)
	}
	if _, err := m.store.CompareAndSetState(ctx, id, []store.SandboxState{store.StateRunning}, store.StatePausing); err != nil {
		return fmt.Errorf("%w: sandbox '%s' is %s", ErrConflict, id, sb.State)
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		_, _ = m.store.CompareAndSetState(ctx, id, []store.SandboxState{store.StatePausing}, store.StateRunning)
		return fmt.Errorf("pause: %w", err)
	}
	pause := nd.Pause
	if !keepMemory {
		pause = nd.Stop
	}
	if err := pause(nctx, id); err != nil {
		_, _ = m.store.CompareAndSetState(nctx, id, []store.SandboxState{store.StatePausing}, store.StateRunning)
		return fmt.Errorf("pause: %w", err)
	}
	if _, err := m.store.CompareAndSetState(nctx, id, []store.SandboxState{store.StatePausing}, store.StatePaused); err != nil {
		return err
	}
	m.event(ctx, id, "paused", "info", "%s", why)
	// The pause stands whether or not it can move; a failed package only
	// keeps it on its node (the event says why).
	if err := m.packagePause(nctx, id, keepMemory); err != nil {
		m.log.Warn("pause package failed; the sandbox resumes on its node only", "sandbox", id, "err", err)
		m.event(ctx, id, "pause-package-failed", "warn", "the pause was not packaged, so it resumes on node %s only: %v", m.rowNode(sb), err)
	}
	return nil
}

// Connect returns a running sandbox, resuming it when paused; resumed reports
// whether it had to. The expiry is only ever extended. reboot (e2b's
// onResume: 'reboot') resumes a paused sandbox without its memory: its
// processes start afresh over its files.
func (m *Manager) Connect(ctx context.Context, id string, d time.Duration, reboot bool) (sb *store.Sandbox, resumed bool, err error) {
	if d < 0 || d > m.cfg.MaxTimeout {
		return nil, false, invalid("timeout must be between 0 and %d seconds", int(m.cfg.MaxTimeout.Seconds()))
	}
	if d == 0 {
		d = DefaultTimeout
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	sb, err = m.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	switch sb.State {
	case store.StateRunning:
	case store.StatePaused, store.StateLost:
		if err := m.resumePaused(ctx, sb, reboot); err != nil {
			return nil, false, err
		}
		resumed = true
	default:
		return nil, false, fmt.Errorf("%w: sandbox '%s' is %s", ErrConflict, id, sb.State)
	}
	if end := time.Now().UTC().Add(d); end.After(sb.EndAt) || resumed {
		sb.EndAt = end
	}
	sb.State = store.StateRunning
	return sb, resumed, m.store.UpdateSandbox(ctx, sb)
}

func (m *Manager) resumeLocked(ctx context.Context, sb *store.Sandbox) (err error) {
	defer m.metrics.observe("resume", time.Now(), &err)
	// Its volumes are still attached on the node (a paused sandbox's
	// attachment rows guard them from deletion); check the records agree.
	for _, vm := range sb.Volumes {
		if v, err := m.store.GetVolume(ctx, vm.VolumeID); err != nil || v.State != store.VolumeReady {
			return fmt.Errorf("%w: sandbox '%s' cannot resume: its volume '%s' is gone or being deleted", ErrConflict, sb.ID, vm.VolumeID)
		}
	}
	if _, err := m.store.CompareAndSetState(ctx, sb.ID, []store.SandboxState{store.StatePaused}, store.StateResuming); err != nil {
		return fmt.Errorf("%w: sandbox '%s' is %s", ErrConflict, sb.ID, sb.State)
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	nd, err := m.nodeOf(ctx, sb)
	if err == nil {
		var req node.CreateRequest
		if req, err = m.nodeRequest(sb, nil); err == nil {
			err = nd.Resume(nctx, sb.ID, req)
		}
	}
	if err != nil {
		_, _ = m.store.CompareAndSetState(nctx, sb.ID, []store.SandboxState{store.StateResuming}, store.StatePaused)
		return fmt.Errorf("resume: %w", err)
	}
	sb.State = store.StateRunning
	sb.PausePackage = nil // it runs: the pause's package is stale
	m.event(ctx, sb.ID, "resumed", "info", "sandbox resumed")
	return nil
}

// resumePaused resumes sb, paused or lost with its node, for Connect: on
// its node, or on another node from the current pause's package when its
// node is lost, cordoned or draining, or fails the resume as unavailable,
// out of resources or without the sandbox. A sandbox that cannot move (movePaused says why)
// resumes on its own node, and a lost one is refused with that reason.
func (m *Manager) resumePaused(ctx context.Context, sb *store.Sandbox, reboot bool) error {
	from := m.rowNode(sb)
	if sb.State == store.StateLost {
		sn, err := m.movePaused(ctx, sb, reboot, false)
		if err != nil {
			if sb.PausePackage == nil {
				return fmt.Errorf("%w: sandbox '%s' is lost with node %s (%v)", ErrConflict, sb.ID, from, err)
			}
			return err
		}
		return m.resumeElsewhere(ctx, sb, sn, reboot, false, "node "+from+" lost")
	}
	if why := m.leavingReason(ctx, from); why != "" {
		// A cordon stops new sandboxes, not this one's resume: pinned, or
		// with no other node to take it, it resumes where it is.
		if sn, err := m.movePaused(ctx, sb, reboot, true); err == nil {
			merr := m.resumeElsewhere(ctx, sb, sn, reboot, true, why)
			if merr == nil || sb.State != store.StatePaused || m.rowNode(sb) != from {
				return merr
			}
			m.event(ctx, sb.ID, "move-failed", "warn", "%s, but the sandbox could not move (%v): resuming it there", why, merr)
		}
	}
	err := m.resumeHere(ctx, sb, reboot)
	// A node without the sandbox (back from a loss without its files)
	// cannot resume it; its pause package can, elsewhere.
	missing := errors.Is(err, errdefs.ErrNotFound) && sb.PausePackage != nil
	if err == nil || !(retryable(err) || missing) {
		return err
	}
	sn, merr := m.movePaused(ctx, sb, reboot, false)
	if merr != nil {
		return fmt.Errorf("%w (%v)", err, merr)
	}
	return m.resumeElsewhere(ctx, sb, sn, reboot, false, "its resume there failed: "+err.Error())
}

// resumeHere resumes sb on its node; reboot first ends what is left of
// its processes so the resume boots it afresh over its files.
func (m *Manager) resumeHere(ctx context.Context, sb *store.Sandbox, reboot bool) error {
	if reboot {
		nd, err := m.nodeOf(ctx, sb)
		if err != nil {
			return fmt.Errorf("reboot: %w", err)
		}
		if err := nd.Stop(ctx, sb.ID); err != nil && !errors.Is(err, runtime.ErrNotRunning) {
			return fmt.Errorf("reboot: %w", err)
		}
	}
	return m.resumeLocked(ctx, sb)
}

// UpdateNetwork replaces the egress policy of a running sandbox.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, n store.Network) error {
	// A malformed policy is refused before anything else, whatever the
	// sandbox; what the sandbox's node can enforce is judged below.
	if err := m.checkNetwork(ctx, &n, nil, ""); err != nil {
		return err
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return err
	}
	if err := m.checkNetworkOn(ctx, policyOf(n), nd, m.rowNode(sb)); err != nil {
		return err
	}
	plain := policyOf(n)
	if err := m.sealNetwork(sb.TeamID, &n); err != nil {
		return err
	}
	old := sb.Network
	if plain.InterceptsTLS() && sb.State == store.StateRunning {
		// Only a sandbox with HTTPS rules trusts the interception CA; its agent
		// installs it at /init, before the proxy starts intercepting. A
		// paused one gets it from the /init of its resume.
		req, err := m.nodeRequest(sb, nil)
		if err != nil {
			return err
		}
		req.Policy = plain
		if err := nd.Reinit(ctx, id, req, sb.EnvdToken); err != nil {
			return fmt.Errorf("network update: install the egress CA: %w", err)
		}
	}
	if err := nd.UpdatePolicy(ctx, id, plain); err != nil {
		return err
	}
	n.AllowPublicTraffic = sb.Network.AllowPublicTraffic
	n.MaskRequestHost = sb.Network.MaskRequestHost
	n.HTTPSPorts = sb.Network.HTTPSPorts
	sb.Network = n
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		// The node must not enforce what the store does not say.
		if rerr := nd.UpdatePolicy(context.WithoutCancel(ctx), id, m.policyFor(sb.TeamID, old)); rerr != nil {
			m.log.Error("network update: store failed and the node kept the new policy", "sandbox", id, "err", rerr)
		}
		return err
	}
	return nil
}

// Logs returns the sandbox console and its lifecycle events.
func (m *Manager) Logs(ctx context.Context, id string, since time.Time, limit int) (*store.Sandbox, []byte, []*store.Event, error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return nil, nil, nil, err
	}
	console, err := nd.Logs(ctx, id)
	if err != nil && !errors.Is(err, node.ErrNotFound) {
		return nil, nil, nil, err
	}
	evs, err := m.store.ListEvents(ctx, id, since, limit)
	return sb, console, evs, err
}

// nodeInfo asks node nd (called id) for its facts (cheap in-process; one
// call over the wire).
func (m *Manager) nodeInfo(ctx context.Context, nd node.Node, id string) (node.Info, error) {
	info, err := nd.Info(ctx)
	if err != nil {
		return node.Info{}, fmt.Errorf("node %s info: %w", id, err)
	}
	return info, nil
}
