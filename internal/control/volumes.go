package control

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// Volume errors mapped by the API.
var (
	ErrVolumeNotFound = errors.New("volume not found")
	ErrVolumeInUse    = errors.New("volume is in use")
)

// VolumeRegistry routes a driver name to its plugin (controller half).
type VolumeRegistry interface {
	Get(name string) (volume.Plugin, error)
	Default() string
	Names() []string
}

// MaxVolumeMounts bounds volumeMounts per sandbox.
const MaxVolumeMounts = 16

// staleCreate is how old a volume row stuck in "creating" must be before the
// periodic reconciler treats its create as lost (at startup: any age).
const staleCreate = 10 * time.Minute

// reservedMountPaths are owned by the runtime or the agent.
var reservedMountPaths = []string{"/proc", "/sys", "/dev", "/.cubicle", "/etc/resolv.conf"}

func (m *Manager) volumeEvent(ctx context.Context, volID, sandboxID, typ, level, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if err := m.store.AppendEvent(context.WithoutCancel(ctx), &store.Event{VolumeID: volID, SandboxID: sandboxID, Type: typ, Level: level, Message: msg}); err != nil {
		m.log.Warn("append event", "volume", volID, "err", err)
	}
}

func (m *Manager) plugin(driver string) (volume.Plugin, error) {
	if m.volumes == nil {
		return nil, fmt.Errorf("%w: volumes are not configured on this server", volume.ErrUnknownDriver)
	}
	return m.volumes.Get(driver)
}

// CreateVolume creates a volume through its driver's Create hook. The row is
// written first (creating) so a crash between the hook and the final write
// is found and rolled back by the reconciler.
//
// Names are per team. The default team's volumes keep ID = name (as before
// teams existed); another team's get a generated ID, so no team learns
// whether a name is taken elsewhere.
//
// sizeMB 0 takes the server default on a driver that enforces sizes
// (volume.Sized); a size is refused on one that does not, and above the
// server maximum. A sized volume counts against the team's byte quota and
// must fit the data filesystem's free-space budget.
func (m *Manager) CreateVolume(ctx context.Context, teamID, name, driver string, sizeMB int) (_ *store.Volume, err error) {
	start := time.Now()
	if name == "" {
		name = uuid.NewString()
	} else if err := volume.ValidateName(name); err != nil {
		return nil, invalid("%v", err)
	}
	if m.volumes == nil || len(m.volumes.Names()) == 0 {
		return nil, invalid("volumes are not configured on this server")
	}
	if driver == "" {
		driver = m.volumes.Default()
	}
	p, err := m.volumes.Get(driver)
	if err != nil {
		return nil, invalid("unknown driver %q (configured: %s)", driver, strings.Join(m.volumes.Names(), ", "))
	}
	if hostBound(p) {
		if _, ok := m.nodes.Local(); !ok {
			return nil, invalid("driver %q keeps each volume on the control plane's own host, and this control plane runs no node (serve --embedded-node=false), so no sandbox could mount it; create it with a driver every node reaches (configured: %s)", driver, strings.Join(m.volumes.Names(), ", "))
		}
	}
	sized := false
	if s, ok := p.(volume.Sized); ok && s.EnforcesSize() {
		sized = true
	}
	switch {
	case sizeMB < 0:
		return nil, invalid("volume size must be positive")
	case sizeMB > 0 && !sized:
		return nil, invalid("driver %q does not enforce volume sizes (its data is not kept on this server's disk); create the volume without a size", driver)
	case sized && sizeMB == 0:
		sizeMB = m.cfg.DefaultVolumeMB
	}
	if m.cfg.MaxVolumeMB > 0 && sizeMB > m.cfg.MaxVolumeMB {
		return nil, invalid("volume size %d MiB is above the server maximum of %d MiB", sizeMB, m.cfg.MaxVolumeMB)
	}
	defer func() { m.volMetrics.op("create", driver, start, err) }()
	id := name
	if teamID != store.DefaultTeamID {
		id = "vol_" + token(8)
	}
	releaseDisk, err := m.reserveDisk("volume/"+id, fmt.Sprintf("a %d MiB volume", sizeMB), sizeMB)
	if err != nil {
		return nil, err
	}
	defer releaseDisk()
	v := &store.Volume{ID: id, TeamID: teamID, Name: name, Driver: driver, State: store.VolumeCreating, SizeMB: sizeMB}
	if err := m.store.CreateVolume(ctx, v); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: volume '%s' already exists", ErrConflict, name)
		}
		return nil, err
	}
	// The hook must not be abandoned half way because the client went away.
	hctx := context.WithoutCancel(ctx)
	res, err := p.Create(hctx, volume.CreateRequest{VolumeID: v.ID, Name: v.Name, SizeMB: v.SizeMB})
	releaseDisk()
	if err == nil && len(res.PrivateData) > volume.MaxPrivateData {
		err = fmt.Errorf("%w: private_data is %d bytes, at most %d allowed", volume.ErrProtocol, len(res.PrivateData), volume.MaxPrivateData)
		if derr := p.Destroy(hctx, volume.DestroyRequest{VolumeID: v.ID}); derr != nil {
			m.log.Error("roll back volume create", "volume", v.ID, "err", derr)
			v.State = store.VolumeDeleting // the reconciler retries Destroy
			_ = m.store.UpdateVolume(hctx, v)
			return nil, fmt.Errorf("create volume '%s' (driver %s): %w", name, driver, err)
		}
	}
	if err != nil {
		m.volMetrics.pluginError(driver, "create", err)
		_ = m.store.DeleteVolume(hctx, v.ID)
		return nil, fmt.Errorf("create volume '%s' (driver %s): %w", name, driver, err)
	}
	v.Token, v.PrivateData, v.State = res.Token, res.PrivateData, store.VolumeReady
	if v.Token == "" {
		// The volume-content API authenticates with this token, so a plugin
		// that has none gets a server-issued one.
		v.Token = "vt_" + token(24)
	}
	if err := m.store.UpdateVolume(hctx, v); err != nil {
		return nil, err
	}
	m.volumeEvent(ctx, v.ID, "", "volume.created", "info", "volume created with driver %s", driver)
	return v, nil
}

// GetVolume returns a volume of the team that exists (any state but
// creating), by ID or name. Another team's volume is ErrVolumeNotFound,
// exactly like a missing one.
func (m *Manager) GetVolume(ctx context.Context, teamID, ref string) (*store.Volume, error) {
	v, err := m.store.GetVolume(ctx, ref)
	if err == nil && v.TeamID != teamID {
		v, err = nil, store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		v, err = m.store.VolumeByName(ctx, teamID, ref)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.State == store.VolumeCreating) {
		return nil, fmt.Errorf("%w: volume '%s' not found", ErrVolumeNotFound, ref)
	}
	return v, err
}

// ListVolumes lists the team's ready and deleting volumes.
func (m *Manager) ListVolumes(ctx context.Context, teamID string) ([]*store.Volume, error) {
	vs, err := m.store.ListTeamVolumes(ctx, teamID)
	if err != nil {
		return nil, err
	}
	out := vs[:0]
	for _, v := range vs {
		if v.State != store.VolumeCreating {
			out = append(out, v)
		}
	}
	return out, nil
}

// VolumeAttachments lists the durable references of a volume.
func (m *Manager) VolumeAttachments(ctx context.Context, id string) ([]*store.VolumeAttachment, error) {
	return m.store.ListVolumeAttachments(ctx, id, "")
}

// DeleteVolume destroys an unreferenced volume: ErrVolumeInUse while any
// sandbox row references it (the delete guard), ErrVolumeNotFound if absent.
func (m *Manager) DeleteVolume(ctx context.Context, teamID, ref string) (err error) {
	v, err := m.GetVolume(ctx, teamID, ref)
	if err != nil {
		return err
	}
	id := v.ID
	start := time.Now()
	defer func() { m.volMetrics.op("delete", v.Driver, start, err) }()
	p, err := m.plugin(v.Driver)
	if err != nil {
		return fmt.Errorf("volume '%s' uses driver %q: %w", id, v.Driver, err)
	}
	if _, err := m.store.MarkVolumeDeleting(ctx, id); err != nil {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: volume '%s' not found", ErrVolumeNotFound, id)
		case errors.Is(err, store.ErrConflict):
			return fmt.Errorf("%w: %v; kill the sandboxes using it first", ErrVolumeInUse, strings.TrimPrefix(err.Error(), store.ErrConflict.Error()+": "))
		}
		return err
	}
	hctx := context.WithoutCancel(ctx)
	if err := m.leases.drop(hctx, id); err != nil {
		m.revertDeleting(hctx, v)
		return fmt.Errorf("%w: volume '%s': %v", ErrVolumeInUse, id, err)
	}
	if err := p.Destroy(hctx, volume.DestroyRequest{VolumeID: id}); err != nil {
		m.volMetrics.pluginError(v.Driver, "destroy", err)
		m.revertDeleting(hctx, v)
		return fmt.Errorf("destroy volume '%s' (driver %s): %w", id, v.Driver, err)
	}
	if err := m.store.DeleteVolume(hctx, id); err != nil {
		return err
	}
	m.volumeEvent(ctx, id, "", "volume.deleted", "info", "volume destroyed")
	return nil
}

func (m *Manager) revertDeleting(ctx context.Context, v *store.Volume) {
	cur, err := m.store.GetVolume(ctx, v.ID)
	if err != nil || cur.State != store.VolumeDeleting {
		return
	}
	cur.State = store.VolumeReady
	if err := m.store.UpdateVolume(ctx, cur); err != nil {
		m.log.Error("revert volume state", "volume", v.ID, "err", err)
	}
}

// mountDrivers is the volume drivers the requested mounts need, for
// placement (a node must have them all). Mounts that do not resolve are
// left to resolveMounts, which names the error.
func (m *Manager) mountDrivers(ctx context.Context, teamID string, req []VolumeMount) []string {
	var out []string
	for _, vm := range req {
		if v, err := m.store.VolumeByName(ctx, teamID, vm.Name); err == nil && !slices.Contains(out, v.Driver) {
			out = append(out, v.Driver)
		}
	}
	return out
}

// hostBound: p keeps its volumes' data on the control plane's host
// (volume.HostBound).
func hostBound(p volume.Plugin) bool {
	h, ok := p.(volume.HostBound)
	return ok && h.KeepsDataOnHost()
}

// hostBoundDriver: the driver's volumes are files of the control plane's
// host (the plugin is volume.HostBound). Without a plugin registry only
// the built-in's name says so.
func (m *Manager) hostBoundDriver(driver string) bool {
	if m.volumes != nil {
		if p, err := m.volumes.Get(driver); err == nil {
			return hostBound(p)
		}
	}
	return driver == "local"
}

// localVolumeNode is the node a create mounting volumes of the local
// driver must run on ("" when it mounts none), and why. Such a volume is a
// directory of one host: the control plane's plugin made it under its own
// root, which its in-process node shares, and once a sandbox holds it, it
// is the node its attachment rows name. Another node's plugin would mount
// its own directory of that name, a silent split of the data, so the
// scheduler places the sandbox on that node only.
func (m *Manager) localVolumeNode(ctx context.Context, teamID string, req []VolumeMount) (pin, why string, err error) {
	local, hasLocal := m.nodes.Local()
	for _, vm := range req {
		v, err := m.store.VolumeByName(ctx, teamID, vm.Name)
		if err != nil || !m.hostBoundDriver(v.Driver) {
			continue // resolveMounts names a missing volume
		}
		atts, err := m.store.ListVolumeAttachments(ctx, v.ID, "")
		if err != nil {
			return "", "", err
		}
		on := ""
		if len(atts) > 0 {
			on = atts[0].Node
			if on == "" {
				on = local // rows from before nodes had names
			}
		} else if hasLocal {
			on = local
		} else {
			return "", "", invalid("volumeMounts: volume '%s' uses the local driver, a directory on the control plane's host, and this control plane runs no node (serve --embedded-node=false), so no node can mount it; use a driver every node reaches (s3)", v.Name)
		}
		if pin != "" && on != pin {
			return "", "", invalid("volumeMounts: volume '%s' of the local driver is a directory of node %s, and %s", v.Name, on, why)
		}
		pin, why = on, fmt.Sprintf("volume '%s' of the local driver is a directory of node %s", v.Name, on)
	}
	return pin, why, nil
}

// resolveMounts validates requested mounts against the store and node nd
// (called nodeID); names resolve in the team's namespace only.
func (m *Manager) resolveMounts(ctx context.Context, teamID string, req []VolumeMount, nd node.Node, nodeID string) ([]store.VolumeMount, []node.VolumeAttachment, error) {
	if len(req) == 0 {
		return nil, nil, nil
	}
	if len(req) > MaxVolumeMounts {
		return nil, nil, invalid("volumeMounts: at most %d allowed", MaxVolumeMounts)
	}
	info, err := m.nodeInfo(ctx, nd, nodeID)
	if err != nil {
		return nil, nil, err
	}
	drivers := map[string]bool{}
	for _, d := range info.VolumeDrivers {
		drivers[d] = true
	}
	seenVol, seenPath := map[string]bool{}, map[string]bool{}
	var mounts []store.VolumeMount
	var atts []node.VolumeAttachment
	for _, vm := range req {
		if vm.Name == "" {
			return nil, nil, invalid("volumeMounts: name is required")
		}
		if err := validateMountPath(vm.Path); err != nil {
			return nil, nil, invalid("volumeMounts[%s]: %v", vm.Name, err)
		}
		p := path.Clean(vm.Path)
		if seenVol[vm.Name] {
			return nil, nil, invalid("volumeMounts: volume '%s' is mounted more than once; a sandbox may attach a volume only once", vm.Name)
		}
		if seenPath[p] {
			return nil, nil, invalid("volumeMounts: path %s is used more than once", p)
		}
		seenVol[vm.Name], seenPath[p] = true, true
		v, err := m.store.VolumeByName(ctx, teamID, vm.Name)
		if errors.Is(err, store.ErrNotFound) || (err == nil && v.State == store.VolumeCreating) {
			return nil, nil, invalid("volumeMounts: volume '%s' not found; create it first", vm.Name)
		}
		if err != nil {
			return nil, nil, err
		}
		if v.State != store.VolumeReady {
			return nil, nil, fmt.Errorf("%w: volume '%s' is being deleted", ErrConflict, vm.Name)
		}
		if !drivers[v.Driver] {
			return nil, nil, invalid("volumeMounts: volume '%s' uses driver %q, which node %s has no plugin for", vm.Name, v.Driver, nodeID)
		}
		mounts = append(mounts, store.VolumeMount{VolumeID: v.ID, Path: p, ReadOnly: vm.ReadOnly})
		atts = append(atts, node.VolumeAttachment{VolumeID: v.ID, Driver: v.Driver, PrivateData: v.PrivateData, Path: p, ReadOnly: vm.ReadOnly})
	}
	// Parents before children, so a nested mount lands on top.
	sort.SliceStable(atts, func(i, j int) bool { return atts[i].Path < atts[j].Path })
	return mounts, atts, nil
}

func validateMountPath(p string) error {
	if p == "" {
		return errors.New("path is required")
	}
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q must be absolute", p)
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path is too long or contains NUL")
	}
	c := path.Clean(p)
	if c == "/" {
		return errors.New("cannot mount a volume over /")
	}
	for _, r := range reservedMountPaths {
		if c == r || strings.HasPrefix(c, r+"/") {
			return fmt.Errorf("path %s is reserved (%s)", c, r)
		}
	}
	return nil
}

// dropAttachments removes a sandbox's volume references after the node
// confirmed the detach.
func (m *Manager) dropAttachments(ctx context.Context, sb *store.Sandbox) {
	if err := m.store.DeleteVolumeAttachments(context.WithoutCancel(ctx), sb.ID); err != nil {
		m.log.Error("drop volume attachments", "sandbox", sb.ID, "err", err)
		return
	}
	for _, vm := range sb.Volumes {
		m.volumeEvent(ctx, vm.VolumeID, sb.ID, "volume.detached", "info", "detached from sandbox %s", sb.ID)
	}
}

// reconcileNodeRefs releases node nodeID's volume refs that nothing owns.
func (m *Manager) reconcileNodeRefs(ctx context.Context, nodeID string, nd node.Node, refs []node.VolumeRef) []error {
	var errs []error
	for _, r := range refs {
		switch r.Kind {
		case node.HolderContent:
			if r.Holder == m.leases.holder(nodeID) && m.leases.holdsOn(r.VolumeID, nodeID) {
				continue
			}
			// Another replica's lease on a remote node: its own until
			// it stops touching the ref.
			if !m.nodes.IsLocal(nodeID) && r.Holder != m.leases.holder(nodeID) && time.Since(r.UpdatedAt) < m.leases.staleRemote() {
				continue
			}
			m.log.Info("reconcile: releasing stale volume-content attachment", "volume", r.VolumeID, "node", nodeID)
			if err := nd.DetachVolume(ctx, r.Holder, r.VolumeID); err != nil {
				errs = append(errs, err)
			}
		default:
			unlock, err := m.lock(ctx, r.Holder)
			if err != nil {
				return append(errs, err)
			}
			sb, err := m.store.GetSandbox(ctx, r.Holder)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				unlock()
				errs = append(errs, err)
				continue
			}
			if err == nil && sb.State.Live() && m.rowNode(sb) == nodeID {
				unlock()
				continue
			}
			m.log.Info("reconcile: detaching volume of a dead sandbox", "volume", r.VolumeID, "sandbox", r.Holder, "node", nodeID)
			if err := nd.Delete(ctx, r.Holder); err != nil {
				errs = append(errs, err)
			}
			unlock()
		}
	}
	return errs
}

// reconcileVolumes repairs drift between attachment rows, the node's
// durable refs and volume rows left mid-operation. startup is true when
// called by Recover of a control plane that shares its store with no
// other replica: then no operation can be in flight.
func (m *Manager) reconcileVolumes(ctx context.Context, startup bool) error {
	var errs []error
	// 1. Rows of killed (or vanished) sandboxes: retry the node cleanup, then drop them.
	atts, err := m.store.ListVolumeAttachments(ctx, "", "")
	if err != nil {
		return err
	}
	done := map[string]bool{}
	for _, a := range atts {
		if done[a.SandboxID] {
			continue
		}
		done[a.SandboxID] = true
		nd, err := m.nodeFor(ctx, a.Node)
		if err != nil {
			// A node the set does not know (forgotten, or a remote row in
			// embedded mode) is not ours to clean: its rows stay, guarding
			// the volume, until the node confirms.
			continue
		}
		unlock, err := m.lock(ctx, a.SandboxID)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		sb, err := m.store.GetSandbox(ctx, a.SandboxID)
		if (err == nil && sb.State.Live()) || (err != nil && !errors.Is(err, store.ErrNotFound)) {
			if err != nil {
				errs = append(errs, err)
			}
			unlock()
			continue
		}
		if err := nd.Delete(ctx, a.SandboxID); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s on node %s: %w", a.SandboxID, a.Node, err))
			unlock()
			continue
		}
		if sb == nil {
			sb = &store.Sandbox{ID: a.SandboxID}
			for _, b := range atts {
				if b.SandboxID == a.SandboxID {
					sb.Volumes = append(sb.Volumes, store.VolumeMount{VolumeID: b.VolumeID, Path: b.Path})
				}
			}
		}
		m.log.Info("reconcile: dropping volume references of a dead sandbox", "sandbox", a.SandboxID)
		m.dropAttachments(ctx, sb)
		unlock()
	}
	// 2. Node refs nobody owns, node by node: sandboxes that are not
	// live there, content leases this process does not hold (left by a
	// previous process). An unreachable remote node is skipped.
	members, err := m.nodes.Members(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, mb := range members {
		nd, err := m.nodes.Get(ctx, mb.ID)
		var refs []node.VolumeRef
		if err == nil {
			refs, err = nd.VolumeRefs(ctx)
		}
		if err != nil {
			if m.nodes.IsLocal(mb.ID) {
				errs = append(errs, err)
			} else {
				m.log.Warn("reconcile volumes: node unreachable", "node", mb.ID, "err", err)
			}
			continue
		}
		errs = append(errs, m.reconcileNodeRefs(ctx, mb.ID, nd, refs)...)
	}
	// 3. Volume rows left mid-create or mid-delete.
	vs, err := m.store.ListVolumes(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, v := range vs {
		switch {
		case v.State == store.VolumeCreating && (startup || time.Since(v.UpdatedAt) > staleCreate):
			errs = append(errs, m.finishLostVolume(ctx, v, "create was interrupted"))
		case v.State == store.VolumeDeleting && (startup || time.Since(v.UpdatedAt) > staleCreate):
			errs = append(errs, m.finishLostVolume(ctx, v, "delete was interrupted"))
		}
	}
	return errors.Join(errs...)
}

// finishLostVolume destroys the backend of a volume whose create or delete
// never completed and removes its row.
func (m *Manager) finishLostVolume(ctx context.Context, v *store.Volume, why string) error {
	p, err := m.plugin(v.Driver)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: v.ID}); err != nil {
		m.volMetrics.pluginError(v.Driver, "destroy", err)
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	if err := m.store.DeleteVolume(ctx, v.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	m.log.Info("reconcile: removed volume", "volume", v.ID, "why", why)
	m.volumeEvent(ctx, v.ID, "", "volume.deleted", "warn", "removed by the reconciler: %s", why)
	return nil
}

// OpenVolume authenticates a volume-content request and returns where its
// files are served: a directory on the in-process node, or the remote node
// that holds the volume attached (contentNodeFor chooses it). The volume
// stays attached there for as long as requests use it (plus an idle grace
// period); release ends this request's use. Nothing is attached before
// the token is checked.
func (m *Manager) OpenVolume(ctx context.Context, id, tok string) (ContentTarget, func(), error) {
	v, err := m.store.GetVolume(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.State == store.VolumeCreating) {
		return ContentTarget{}, nil, fmt.Errorf("%w: volume '%s' not found", ErrVolumeNotFound, id)
	}
	if err != nil {
		return ContentTarget{}, nil, err
	}
	if tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(v.Token)) != 1 {
		return ContentTarget{}, nil, fmt.Errorf("%w: invalid or missing volume token", ErrUnauthorized)
	}
	if v.State != store.VolumeReady {
		return ContentTarget{}, nil, fmt.Errorf("%w: volume '%s' is being deleted", ErrConflict, id)
	}
	return m.leases.acquire(ctx, v)
}

// ErrUnauthorized: a volume token did not match.
var ErrUnauthorized = errors.New("unauthorized")
