package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// ErrSnapshotNotFound: no snapshot with that ID or name that the caller may see.
var ErrSnapshotNotFound = errors.New("snapshot not found")

// MaxForks bounds one fork request (e2b's limit).
const MaxForks = 100

// DefaultForkTimeout is a fork's timeout when the request names none (e2b's default).
const DefaultForkTimeout = 15 * time.Second

var snapshotNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

func newSnapshotID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "snap_" + hex.EncodeToString(b)
}

// SnapshotInfo is a snapshot with the names its template row has.
type SnapshotInfo struct {
	store.Snapshot
	Names []string
}

// Snapshot captures a running or paused sandbox as a new snapshot, which
// is also a template sandboxes can be created from. name ("" = none) must
// not be taken by a template or snapshot of the team.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (*SnapshotInfo, error) {
	if name != "" && !snapshotNameRe.MatchString(name) {
		return nil, invalid("name %q: use 1-128 of [a-z0-9._-], starting with a letter or digit", name)
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return m.snapshotLocked(ctx, sb, name, false)
}

func (m *Manager) snapshotLocked(ctx context.Context, sb *store.Sandbox, name string, internal bool) (*SnapshotInfo, error) {
	// Fork's internal snapshots stay on their node; user snapshots are
	// uploaded when there is a snapshot store.
	return m.takeSnapshot(ctx, sb, name, internal, !internal)
}

// takeSnapshot is snapshotLocked; push uploads the package (a pause
// package is internal and uploaded).
func (m *Manager) takeSnapshot(ctx context.Context, sb *store.Sandbox, name string, internal, push bool) (_ *SnapshotInfo, err error) {
	defer m.metrics.observe("snapshot", time.Now(), &err)
	if hasAccelerators(sb) {
		return nil, fmt.Errorf("%w: sandbox '%s' cannot be snapshotted: %w (device memory cannot be captured)", ErrConflict, sb.ID, ErrAccelUnsupported)
	}
	if sb.State != store.StateRunning && sb.State != store.StatePaused {
		return nil, fmt.Errorf("%w: sandbox '%s' is %s", ErrConflict, sb.ID, sb.State)
	}
	if name != "" {
		if t, err := m.store.TemplateByName(ctx, sb.TeamID, name); err == nil && (t.TeamID == sb.TeamID || !t.Public) {
			return nil, fmt.Errorf("%w: the name '%s' is taken by template %s", ErrConflict, name, t.ID)
		} else if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	limit := m.cfg.MaxSnapshotsPerTeam
	if limit > 0 {
		// Checked first so a team at its limit costs no copy; the store
		// checks again in the insert's transaction.
		if have, err := m.store.ListSnapshots(ctx, store.SnapshotFilter{TeamID: sb.TeamID, Limit: limit}); err != nil {
			return nil, err
		} else if len(have) >= limit && !internal {
			return nil, &store.QuotaError{Quota: "snapshots per team", Limit: limit}
		}
	}
	layers, err := m.layersOf(ctx, sb)
	if err != nil {
		return nil, err
	}
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return nil, err
	}
	info, err := m.nodeInfo(ctx, nd, sb.Node)
	if err != nil {
		return nil, err
	}
	src, _ := m.store.GetTemplate(ctx, sb.TemplateID) // start/ready commands and user carry over
	if src == nil {
		src = &store.Template{}
	}
	sid := newSnapshotID()
	m.snapMu.Lock()
	m.snapInFlight[sid] = true
	m.snapMu.Unlock()
	defer func() {
		m.snapMu.Lock()
		delete(m.snapInFlight, sid)
		m.snapMu.Unlock()
	}()
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	ns, err := nd.Snapshot(nctx, sb.ID, sid)
	if errors.Is(err, runtime.ErrSnapshotTooLarge) {
		return nil, fmt.Errorf("sandbox '%s': %w; nothing was kept", sb.ID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		if err != nil {
			_ = nd.DeleteSnapshot(nctx, sid)
		}
	}()
	var pkg []store.SnapshotObject
	if m.cfg.SnapshotStore != nil && push {
		// Uploaded before the row is written, so a row with a package
		// always has its objects. A failed upload keeps the snapshot,
		// restorable on its own node only (the event says why).
		if pkg, err = m.pushPackage(nctx, nd, sb, ns); err != nil {
			m.log.Warn("snapshot upload failed; it restores on its own node only", "snapshot", sid, "err", err)
			m.event(ctx, sb.ID, "snapshot-upload-failed", "warn", "snapshot %s was not uploaded to the snapshot store: %v", sid, err)
			pkg, err = nil, nil
		}
	}
	sn := &store.Snapshot{
		ID: sid, TeamID: sb.TeamID, SandboxID: sb.ID, SourceTemplateID: sb.TemplateID, Node: m.rowNode(sb),
		Kind: ns.Kind, Runtime: info.Runtime, Layers: append([]string{ns.Layer}, layers...), Checkpoint: ns.Checkpoint,
		Image: sb.Image, SnapshotLayers: append([]string{sid}, sb.SnapshotLayers...), Package: pkg,
		SizeBytes: ns.SizeBytes, Volumes: sb.Volumes, EnvVars: sb.EnvVars, DefaultUser: sb.DefaultUser,
		AgentToken: sb.EnvdToken, Internal: internal,
	}
	primary := sid
	if name != "" {
		primary = name
	}
	bid := template.DerivedBuildID("snapshot", sid)
	t := &store.Template{
		ID: sid, TeamID: sb.TeamID, PrimaryName: primary, Names: []string{primary},
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskSizeMB,
		StartCmd: src.StartCmd, ReadyCmd: src.ReadyCmd, RunAs: src.RunAs, Workdir: src.Workdir,
		ReadyBuildID: bid, LatestBuildID: bid, BuildStatus: store.BuildReady, BuildCount: 1,
	}
	b := &store.TemplateBuild{ID: bid, TemplateID: sid, Status: store.BuildReady, CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB,
		DiskSizeMB: sb.DiskSizeMB, Rootfs: template.JoinLayers(sn.Layers...), Step: "snapshot of " + sb.ID}
	if err := m.store.CreateSnapshot(nctx, sn, t, b, limit); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: the name '%s' is taken", ErrConflict, name)
		}
		return nil, err // a *QuotaError among them
	}
	m.event(ctx, sb.ID, "snapshot", "info", "%s snapshot %s (%d bytes)", ns.Kind, sid, ns.SizeBytes)
	return &SnapshotInfo{Snapshot: *sn, Names: t.Names}, nil
}

// layersOf are the layers sb runs on: recorded at create, or (rows from
// before snapshots) its template's current build.
func (m *Manager) layersOf(ctx context.Context, sb *store.Sandbox) ([]string, error) {
	if len(sb.Layers) > 0 {
		return sb.Layers, nil
	}
	tpl, err := m.resolve(ctx, sb.TeamID, sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("%w: the layers of sandbox '%s' are unknown: %v", ErrConflict, sb.ID, err)
	}
	return tpl.Layers, nil
}

func (m *Manager) resolve(ctx context.Context, teamID, ref string) (template.Template, error) {
	if tr, ok := m.templates.(TeamResolver); ok {
		return tr.ResolveTeam(ctx, teamID, ref)
	}
	return m.templates.Resolve(ctx, ref)
}

// GetSnapshot returns a snapshot the caller's team may see, by ID (or
// ID:default) or name.
func (m *Manager) GetSnapshot(ctx context.Context, ref string) (*SnapshotInfo, error) {
	id, tag, _ := strings.Cut(ref, ":")
	if tag != "" && tag != "default" && tag != "latest" {
		return nil, fmt.Errorf("%w: '%s'", ErrSnapshotNotFound, ref)
	}
	sn, err := m.store.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		team, _ := teamOf(ctx)
		if t, terr := m.store.TemplateByName(ctx, team, id); terr == nil {
			sn, err = m.store.GetSnapshot(ctx, t.ID)
		}
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && (!sn.DeletedAt.IsZero() || !teamSeesID(ctx, sn.TeamID))) {
		return nil, fmt.Errorf("%w: '%s'", ErrSnapshotNotFound, ref)
	}
	if err != nil {
		return nil, err
	}
	return m.snapshotInfo(ctx, sn), nil
}

func (m *Manager) snapshotInfo(ctx context.Context, sn *store.Snapshot) *SnapshotInfo {
	info := &SnapshotInfo{Snapshot: *sn}
	if t, err := m.store.GetTemplate(ctx, sn.ID); err == nil {
		info.Names = t.Names
	}
	return info
}

// SnapshotPage is one page of ListSnapshots.
type SnapshotPage struct {
	Snapshots []*SnapshotInfo
	More      bool
}

// ListSnapshots pages the team's snapshots, newest first; name ("" = any)
// selects the one with that name.
func (m *Manager) ListSnapshots(ctx context.Context, f store.SnapshotFilter, name string) (*SnapshotPage, error) {
	team, _ := teamOf(ctx)
	f.TeamID, f.IncludeDeleted = team, false
	if name != "" {
		page := &SnapshotPage{}
		if f.AfterID != "" {
			return page, nil // a name matches at most one
		}
		info, err := m.GetSnapshot(ctx, name)
		if errors.Is(err, ErrSnapshotNotFound) {
			return page, nil
		}
		if err != nil {
			return nil, err
		}
		if f.SandboxID == "" || info.SandboxID == f.SandboxID {
			page.Snapshots = append(page.Snapshots, info)
		}
		return page, nil
	}
	limit := f.Limit
	f.Limit = limit + 1
	rows, err := m.store.ListSnapshots(ctx, f)
	if err != nil {
		return nil, err
	}
	page := &SnapshotPage{}
	if limit > 0 && len(rows) > limit {
		rows, page.More = rows[:limit], true
	}
	for _, sn := range rows {
		page.Snapshots = append(page.Snapshots, m.snapshotInfo(ctx, sn))
	}
	return page, nil
}

// DeleteSnapshot deletes a snapshot: it is gone for the API at once, and
// its files go once no sandbox runs from them (reconcileSnapshots).
func (m *Manager) DeleteSnapshot(ctx context.Context, ref string) error {
	info, err := m.GetSnapshot(ctx, ref)
	if err != nil {
		return err
	}
	if err := m.store.DeleteTemplate(ctx, info.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	m.SnapshotTrigger()
	return nil
}

// IsSnapshot reports whether templateID is a snapshot's template.
func (m *Manager) IsSnapshot(ctx context.Context, templateID string) bool {
	id, _, _ := strings.Cut(templateID, ":")
	_, err := m.store.GetSnapshot(ctx, id)
	return err == nil
}

// ForkResult is one requested fork: a sandbox or why it failed.
type ForkResult struct {
	Sandbox *store.Sandbox
	Err     error
}

// Fork snapshots a sandbox once and starts count sandboxes from that
// snapshot; each succeeds or fails on its own. The snapshot is internal:
// never listed, and removed with the last fork that uses it.
func (m *Manager) Fork(ctx context.Context, id string, count int, timeout time.Duration, o CreateOptions) ([]ForkResult, error) {
	if count < 1 || count > MaxForks {
		return nil, invalid("count must be between 1 and %d, got %d", MaxForks, count)
	}
	if timeout == 0 {
		timeout = DefaultForkTimeout
	}
	if timeout < 0 || timeout > m.cfg.MaxTimeout {
		return nil, invalid("timeout must be between 0 and %d seconds", int(m.cfg.MaxTimeout.Seconds()))
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return nil, err
	}
	sb, err := m.Get(ctx, id)
	if err != nil {
		unlock()
		return nil, err
	}
	info, err := m.snapshotLocked(ctx, sb, "", true)
	unlock()
	if err != nil {
		return nil, err
	}
	defer func() {
		// The template row only serves these creates; the files stay
		// while a fork runs on them.
		_ = m.store.DeleteTemplate(context.WithoutCancel(ctx), info.ID)
		m.SnapshotTrigger()
	}()
	o.TemplateID, o.Timeout, o.TeamID = info.ID, timeout, sb.TeamID
	o.Metadata = maps.Clone(sb.Metadata)
	// A fork shares its source's host mounts, as clones share volumes: the
	// source's create was allowed them, and its team reaches them through
	// the source already.
	o.HostMounts = true
	o.Network = sb.Network
	o.AutoPause, o.AutoResume, o.PauseFilesystem = sb.AutoPause, sb.AutoResume, !sb.PauseMemory
	out := make([]ForkResult, count)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fsb, err := m.Create(ctx, o)
			if err != nil && fsb != nil {
				_ = m.Kill(context.WithoutCancel(ctx), fsb.ID, "fork failed: "+err.Error())
				fsb = nil
			}
			out[i] = ForkResult{Sandbox: fsb, Err: err}
		}()
	}
	wg.Wait()
	return out, nil
}

// Rollback returns a sandbox, in place, to a snapshot: same ID, access
// token and volume attachments; its files (and memory, for a memory
// snapshot) become the snapshot's. A filesystem rollback reboots it.
func (m *Manager) Rollback(ctx context.Context, id, snapshotRef string) error {
	_, err := m.RollbackKind(ctx, id, snapshotRef)
	return err
}

// RollbackKind is Rollback, answering the kind of snapshot it rolled back to
// (runtime.SnapshotMemory or runtime.SnapshotFilesystem): whether processes
// and memory came back, or the sandbox rebooted on the snapshot's files.
func (m *Manager) RollbackKind(ctx context.Context, id, snapshotRef string) (kind string, err error) {
	defer m.metrics.observe("rollback", time.Now(), &err)
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return "", err
	}
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return "", err
	}
	info, err := m.GetSnapshot(ctx, snapshotRef)
	if err != nil {
		return "", err
	}
	if hasAccelerators(sb) {
		return "", fmt.Errorf("%w: sandbox '%s' cannot be rolled back: %w", ErrConflict, id, ErrAccelUnsupported)
	}
	if sb.State != store.StateRunning && sb.State != store.StatePaused {
		return "", fmt.Errorf("%w: sandbox '%s' is %s", ErrConflict, id, sb.State)
	}
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return "", err
	}
	if on := info.Snapshot.Node; on != "" && on != m.rowNode(sb) {
		// Its files are on another node: fetched from the snapshot store
		// by a node that boots by reference, else refused.
		why := m.movable(ctx, &info.Snapshot)
		if why == nil && !m.pullsOK(ctx, m.rowNode(sb)) {
			why = fmt.Errorf("node %s boots from the control plane's paths, not by reference", m.rowNode(sb))
		}
		if why != nil {
			return "", fmt.Errorf("%w: snapshot '%s' is kept on node %s and sandbox '%s' runs on node %s: %v", ErrConflict, info.Snapshot.ID, on, id, m.rowNode(sb), why)
		}
		if err := m.fetchChain(ctx, nd, m.rowNode(sb), &info.Snapshot); err != nil {
			return "", err
		}
	}
	// A node that does not share the control plane's files gets the
	// snapshot's chain by reference (its files are in the node's own
	// snapshot dir: the snapshot was taken there).
	var boot node.Image
	if pulls, err := m.pullsImages(ctx, m.rowNode(sb), nd); err != nil {
		return "", err
	} else if pulls {
		if boot, err = snapshotImage(&info.Snapshot, m.rowNode(sb)); err != nil {
			return "", err
		}
	}
	restore, currentToken, err := m.restoreOf(ctx, &info.Snapshot, sb)
	if err != nil {
		return "", err
	}
	want, err := m.mountsByName(ctx, sb.Volumes)
	if err != nil {
		return "", err
	}
	_, atts, err := m.resolveMounts(ctx, sb.TeamID, want, nd, m.rowNode(sb))
	if err != nil {
		return "", err
	}
	prev := sb.State
	if _, err := m.store.CompareAndSetState(ctx, id, []store.SandboxState{prev}, store.StateResuming); err != nil {
		return "", fmt.Errorf("%w: sandbox '%s' changed state", ErrConflict, id)
	}
	req, err := m.nodeRequest(sb, info.Layers)
	if err != nil {
		_, _ = m.store.CompareAndSetState(ctx, id, []store.SandboxState{store.StateResuming}, prev)
		return "", err
	}
	req.Volumes, req.Restore, req.CurrentToken = atts, restore, currentToken
	if !boot.IsZero() {
		byReference(&req, boot, info.SnapshotLayers, info.Kind == runtime.SnapshotMemory)
	}
	if t, err := m.store.GetTemplate(ctx, info.ID); err == nil {
		req.StartCmd, req.StartUser, req.StartWorkdir, req.DefaultWorkdir = t.StartCmd, sb.DefaultUser, t.Workdir, t.Workdir
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := nd.Rebuild(nctx, id, req); errors.Is(err, node.ErrRebuildRefused) {
		_, _ = m.store.CompareAndSetState(nctx, id, []store.SandboxState{store.StateResuming}, prev)
		return "", fmt.Errorf("rollback: %w", err)
	} else if err != nil {
		// The old root filesystem is gone: the sandbox cannot go back.
		derr := nd.Delete(nctx, id)
		m.markKilled(nctx, sb, "rollback failed: "+err.Error(), derr)
		return "", fmt.Errorf("rollback: %w", err)
	}
	sb.Layers, sb.State = info.Layers, store.StateRunning
	sb.Image, sb.SnapshotLayers = info.Image, info.SnapshotLayers
	sb.PausePackage = nil // it runs: the pause's package is stale
	if prev == store.StatePaused {
		sb.EndAt = time.Now().UTC().Add(DefaultTimeout)
	}
	if err := m.store.UpdateSandbox(nctx, sb); err != nil {
		return "", err
	}
	m.event(ctx, id, "rollback", "info", "rolled back to %s snapshot %s", info.Kind, info.ID)
	m.SnapshotTrigger()
	return string(info.Kind), nil
}

// restoreOf is how a sandbox starts from sn on this node: the memory image
// and the token its restored agent holds, or nothing (a fresh boot).
func (m *Manager) restoreOf(ctx context.Context, sn *store.Snapshot, sb *store.Sandbox) (restore, currentToken string, err error) {
	if sn.Kind != runtime.SnapshotMemory {
		return "", "", nil
	}
	nd, err := m.nodeOf(ctx, sb)
	if err != nil {
		return "", "", err
	}
	info, err := m.nodeInfo(ctx, nd, sb.Node)
	if err != nil {
		return "", "", err
	}
	if sn.Runtime != info.Runtime {
		return "", "", fmt.Errorf("%w: snapshot %s holds %s memory, which this node's %s runtime cannot restore", ErrConflict, sn.ID, sn.Runtime, info.Runtime)
	}
	if !sameMountPaths(sn.Volumes, sb.Volumes) {
		return "", "", invalid("memory snapshot %s was taken with volumes at %s; a sandbox from it must mount volumes at the same paths", sn.ID, mountPaths(sn.Volumes))
	}
	return sn.Checkpoint, sn.AgentToken, nil
}

func mountPaths(v []store.VolumeMount) string {
	if len(v) == 0 {
		return "(none)"
	}
	var p []string
	for _, vm := range v {
		p = append(p, vm.Path)
	}
	return strings.Join(p, ", ")
}

func sameMountPaths(a, b []store.VolumeMount) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]bool{}
	for _, vm := range a {
		seen[vm.Path] = true
	}
	for _, vm := range b {
		if !seen[vm.Path] {
			return false
		}
	}
	return true
}

// SnapshotTrigger asks the snapshot reconciler to run soon.
func (m *Manager) SnapshotTrigger() {
	select {
	case m.snapKick <- struct{}{}:
	default:
	}
}

// The snapshot loop (Run) removes the files of deleted snapshots once
// nothing runs on them, and files no row references.

// reconcileSnapshots is one pass: a deleted snapshot's layer that no live
// sandbox and no remaining snapshot stacks on is removed with its row; a
// snapshot directory with no row at all (a crash between the node's
// snapshot and the row) is removed too. It also publishes the disk usage.
func (m *Manager) reconcileSnapshots(ctx context.Context) error {
	rows, err := m.store.ListSnapshots(ctx, store.SnapshotFilter{IncludeDeleted: true})
	if err != nil {
		return err
	}
	live, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: liveStates})
	if err != nil {
		return err
	}
	// In use: by path (the embedded node) or by snapshot ID (a node that
	// pulls images; its rows name the chain by reference).
	used := map[string]bool{}
	for _, sb := range live {
		for _, l := range sb.Layers {
			used[l] = true
		}
		for _, id := range sb.SnapshotLayers {
			used[id] = true
		}
	}
	// packaging: paused sandboxes whose row names no package yet. The
	// pause call writes its package's snapshot row (internal, born
	// deleted) before the sandbox's row names it, and this pass may run
	// on another replica in between: their internal snapshots stay until
	// the sandbox leaves the pause (a failed package's with them).
	packaging := map[string]bool{}
	for _, sb := range live {
		// The package of its current pause (resume on another node).
		if sb.PausePackage != nil {
			used[sb.PausePackage.SnapshotID] = true
		} else if sb.State == store.StatePaused {
			packaging[sb.ID] = true
		}
	}
	for _, sn := range rows {
		if sn.DeletedAt.IsZero() {
			for _, l := range sn.Layers {
				used[l] = true
			}
			for _, id := range sn.SnapshotLayers {
				used[id] = true
			}
		}
	}
	known := map[string]bool{}
	var bytes, count float64
	for _, sn := range rows {
		known[sn.ID] = true
		if !sn.DeletedAt.IsZero() && len(sn.Layers) > 0 && !used[sn.Layers[0]] && !used[sn.ID] && !(sn.Internal && packaging[sn.SandboxID]) {
			nd, err := m.nodeFor(ctx, sn.Node)
			if err == nil {
				err = nd.DeleteSnapshot(ctx, sn.ID)
			} else if errors.Is(err, nodeset.ErrUnknownNode) {
				// Its node was forgotten: its files went with it (should
				// the ID join again, the pass below removes files no row
				// names), and the package and the row go now.
				err = nil
			}
			if err != nil {
				m.log.Error("delete snapshot files", "snapshot", sn.ID, "err", err)
				continue
			}
			if len(sn.Package) > 0 && m.cfg.SnapshotStore != nil {
				// Before the row: a package whose delete failed is retried.
				if err := m.cfg.SnapshotStore.Delete(ctx, sn.ID); err != nil {
					m.log.Error("delete snapshot package", "snapshot", sn.ID, "err", err)
					continue
				}
			}
			if err := m.store.PurgeSnapshot(ctx, sn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			continue
		}
		bytes += float64(sn.SizeBytes)
		if sn.DeletedAt.IsZero() {
			count++
		}
	}
	m.snapMetrics.set(count, bytes)
	members, err := m.nodes.Members(ctx)
	if err != nil {
		return err
	}
	for _, mb := range members {
		nd, err := m.nodes.Get(ctx, mb.ID)
		var ids []string
		if err == nil {
			ids, err = nd.Snapshots(ctx)
		}
		if err != nil {
			if m.nodes.IsLocal(mb.ID) {
				return err
			}
			m.log.Warn("snapshot files: node unreachable", "node", mb.ID, "err", err)
			continue
		}
		for _, id := range ids {
			if !known[id] && !m.snapshotInFlight(id) {
				m.log.Info("removing snapshot files no row references", "snapshot", id, "node", mb.ID)
				if err := nd.DeleteSnapshot(ctx, id); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// snapshotInFlight: a snapshot directory younger than a snapshot takes may
// belong to a snapshot whose row is not written yet.
func (m *Manager) snapshotInFlight(id string) bool {
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	return m.snapInFlight[id]
}
