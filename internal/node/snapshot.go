package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/lxcfs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

var (
	// ErrSnapshotUnsupported: the node's runtime cannot snapshot or stop sandboxes.
	ErrSnapshotUnsupported = errdefs.NewReason(errdefs.ErrFailedPrecondition, "node_snapshot_unsupported", "node: the runtime cannot snapshot sandboxes")
	// ErrRebuildRefused: Rebuild failed before it touched the sandbox,
	// which is as it was.
	ErrRebuildRefused = errdefs.NewReason(errdefs.ErrAborted, "node_rebuild_refused", "node: rebuild refused; the sandbox is unchanged")
)

// Snapshot is what a node keeps of one snapshot: <SnapshotDir>/<id>/rootfs
// (a read-only layer) and, for memory snapshots, <id>/checkpoint.
type Snapshot struct {
	ID         string
	Kind       string // runtime.SnapshotMemory or runtime.SnapshotFilesystem
	Layer      string
	Checkpoint string
	SizeBytes  int64
}

var snapshotIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func (l *Local) snapshotter() (runtime.Snapshotter, error) {
	sn, ok := l.cfg.Runtime.(runtime.Snapshotter)
	if !ok || l.cfg.SnapshotDir == "" {
		return nil, fmt.Errorf("%w (%s)", ErrSnapshotUnsupported, l.cfg.Runtime.Name())
	}
	return sn, nil
}

// memorySnapshots reports whether this node's snapshots keep memory.
func (l *Local) memorySnapshots() bool {
	sn, err := l.snapshotter()
	return err == nil && sn.MemorySnapshots()
}

// Snapshot captures sandbox id as snapshotID. The sandbox keeps its state.
func (l *Local) Snapshot(ctx context.Context, id, snapshotID string) (Snapshot, error) {
	sn, err := l.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if !snapshotIDRe.MatchString(snapshotID) {
		return Snapshot{}, fmt.Errorf("node: snapshot id %q", snapshotID)
	}
	dst := filepath.Join(l.cfg.SnapshotDir, snapshotID)
	// A runsc checkpoint with --leave-running ends no process, but the
	// sandbox's host pid may change: look again afterwards.
	defer l.begin(id, true)()
	info, err := sn.Snapshot(ctx, id, dst, true)
	l.watchAfter(ctx, id)
	if err != nil {
		return Snapshot{}, l.notFound(err)
	}
	return Snapshot{ID: snapshotID, Kind: info.Kind, Layer: info.Layer, Checkpoint: info.Checkpoint, SizeBytes: info.SizeBytes}, nil
}

// DeleteSnapshot removes a snapshot's files; unknown IDs are a no-op.
func (l *Local) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if l.cfg.SnapshotDir == "" || !snapshotIDRe.MatchString(snapshotID) {
		return nil
	}
	dst := filepath.Join(l.cfg.SnapshotDir, snapshotID)
	if sn, err := l.snapshotter(); err == nil {
		return sn.DeleteSnapshot(ctx, dst)
	}
	return os.RemoveAll(dst)
}

// snapshotHTTP reaches the object store's presigned URLs; each call's
// context bounds it.
var snapshotHTTP = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

// PushSnapshot implements Node.
func (l *Local) PushSnapshot(ctx context.Context, snapshotID string, targets []SnapshotObject) ([]SnapshotObject, error) {
	if _, err := l.snapshotPath(ctx, snapshotID, "rootfs"); err != nil {
		return nil, err
	}
	return snapstore.Push(ctx, snapshotHTTP, filepath.Join(l.cfg.SnapshotDir, snapshotID), targets)
}

// FetchSnapshot implements Node.
func (l *Local) FetchSnapshot(ctx context.Context, snapshotID string, sources []SnapshotObject) error {
	if _, err := l.snapshotter(); err != nil {
		return err
	}
	if !snapshotIDRe.MatchString(snapshotID) {
		return fmt.Errorf("%w: snapshot id %q", ErrSnapshotNotFound, snapshotID)
	}
	if _, err := l.snapshotPath(ctx, snapshotID, "rootfs"); err == nil {
		return nil // taken or fetched here before
	}
	if err := os.MkdirAll(l.cfg.SnapshotDir, 0o700); err != nil {
		return err
	}
	err := snapstore.Fetch(ctx, snapshotHTTP, filepath.Join(l.cfg.SnapshotDir, snapshotID), sources)
	if errors.Is(err, os.ErrExist) {
		return nil // a concurrent fetch of the same snapshot won
	}
	return err
}

// Snapshots lists the snapshot IDs whose files are on this node.
func (l *Local) Snapshots(ctx context.Context) ([]string, error) {
	if l.cfg.SnapshotDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(l.cfg.SnapshotDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && snapshotIDRe.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Stop ends a sandbox's processes keeping its files, network and volumes
// (a filesystem pause); Resume boots it afresh.
func (l *Local) Stop(ctx context.Context, id string) error {
	sn, err := l.snapshotter()
	if err != nil {
		return err
	}
	defer l.begin(id, true)()
	if err := sn.Stop(ctx, id); err != nil {
		l.watchAfter(ctx, id)
		return l.notFound(err)
	}
	return nil
}

// Rebuild replaces a sandbox's runtime half with one booted (or, with
// req.Restore, restored) from req's layers or image, keeping its network endpoint,
// volume attachments and ID (rollback). The agent is initialised with
// req's token.
func (l *Local) Rebuild(ctx context.Context, id string, req CreateRequest) error {
	defer l.begin(id, true)()
	refused := func(err error) error { return errors.Join(ErrRebuildRefused, l.notFound(err)) }
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return refused(err)
	}
	if _, err := l.cfg.Runtime.Inspect(ctx, id); err != nil {
		return refused(err)
	}
	if err := l.writeToken(id, req.EnvdToken); err != nil {
		return refused(err)
	}
	mounts := l.baseMounts(id)
	mounts = append(mounts, req.Mounts...)
	for _, va := range req.Volumes {
		// Already attached for this sandbox: attach returns the same path.
		hp, err := l.vols.attach(ctx, id, HolderSandbox, va)
		if err != nil {
			return refused(err)
		}
		mounts = append(mounts, runtime.Mount{Source: hp, Destination: va.Path, ReadOnly: va.ReadOnly})
	}
	spec, err := l.runtimeSpec(ctx, &req, ep.NetNSPath, mounts, nil)
	if err != nil {
		return refused(err)
	}
	if err := l.cfg.Runtime.Delete(ctx, id); err != nil {
		return err
	}
	info, err := l.cfg.Runtime.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("runtime create: %w", err)
	}
	current := req.EnvdToken
	if req.CurrentToken != "" {
		current = req.CurrentToken
	}
	if err := l.initAgent(ctx, id, ep.Addr, req, current, nil); err != nil {
		return err
	}
	l.watch(id, info.Pid)
	return nil
}

// baseMounts are what every sandbox gets: the agent and its token,
// resolv.conf, lxcfs.
func (l *Local) baseMounts(id string) []runtime.Mount {
	mounts := []runtime.Mount{
		{Source: l.cfg.AgentBin, Destination: AgentPathInSandbox, ReadOnly: true},
		{Source: l.tokenPath(id), Destination: AgentTokenInSandbox, ReadOnly: true},
	}
	if l.cfg.ResolvConf != "" {
		mounts = append(mounts, runtime.Mount{Source: l.cfg.ResolvConf, Destination: "/etc/resolv.conf", ReadOnly: true})
	}
	if l.cfg.Lxcfs != "" && l.cfg.Runtime.Name() != "runsc" {
		mounts = append(mounts, lxcfs.BindMounts(l.cfg.Lxcfs, l.cfg.LxcfsFiles)...)
	}
	return mounts
}

// runtimeSpec is the runtime half of req. It fills req.EnvVars with the
// CA variables, so callers pass the request on to initAgent afterwards.
func (l *Local) runtimeSpec(ctx context.Context, req *CreateRequest, netns string, mounts []runtime.Mount, devices []runtime.Device) (runtime.Spec, error) {
	layers, restore, err := l.rootfs(ctx, req)
	if err != nil {
		return runtime.Spec{}, err
	}
	var files []runtime.File
	if l.cfg.CACerts != nil && restore == "" {
		seed, err := l.cfg.CACerts.SandboxFiles(layers)
		if err != nil {
			return runtime.Spec{}, err
		}
		for p, b := range seed {
			files = append(files, runtime.File{Path: p, Data: b, Mode: 0o644})
		}
	}
	if l.cfg.CACerts != nil {
		env := cacerts.Env()
		maps.Copy(env, req.EnvVars)
		req.EnvVars = env
	}
	return runtime.Spec{
		ID:        req.ID,
		Files:     files,
		Layers:    layers,
		Restore:   restore,
		Hostname:  "cubicle",
		Args:      []string{AgentPathInSandbox, "-port", strconv.Itoa(AgentPort), "-token-file", AgentTokenInSandbox},
		Env:       []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		NetNSPath: netns,
		Mounts:    mounts,
		Devices:   devices,
		Resources: runtime.Resources{CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, DiskMB: req.DiskSizeMB, PIDs: PIDsFor(l.cfg.PIDsLimit, req.MemoryMB)},
	}, nil
}
