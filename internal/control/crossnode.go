package control

import (
	"context"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// SnapshotStore signs URLs for snapshot packages (*snapstore.Store).
type SnapshotStore interface {
	PutURLs(ctx context.Context, snapshotID string, parts ...string) ([]snapstore.Object, error)
	GetURLs(ctx context.Context, snapshotID string, pushed []snapstore.Object) ([]snapstore.Object, error)
	Delete(ctx context.Context, snapshotID string) error
}

// errNoSnapshotStore names the flag a restore on another node needs.
var errNoSnapshotStore = errors.New("restoring on another node needs a snapshot store (serve --snapshot-store s3://BUCKET?endpoint=…&region=…)")

// pinReason is why a snapshot's sandboxes must stay on the snapshot's
// node, or "": volumes of the local driver are directories of that node
// (the seed's host mounts).
func (m *Manager) pinReason(ctx context.Context, sn *store.Snapshot) (string, error) {
	for _, vm := range sn.Volumes {
		v, err := m.store.GetVolume(ctx, vm.VolumeID)
		if errors.Is(err, store.ErrNotFound) {
			continue // the create fails on it by itself
		}
		if err != nil {
			return "", err
		}
		if v.Driver == "local" {
			return fmt.Sprintf("it mounts volume '%s' of the local driver, a directory of node %s", v.Name, sn.Node), nil
		}
	}
	return "", nil
}

// movable says why sn's sandboxes cannot start on another node (nil: they
// can): no snapshot store, a pinning mount, or a snapshot of its chain
// without a package.
func (m *Manager) movable(ctx context.Context, sn *store.Snapshot) error {
	if m.cfg.SnapshotStore == nil {
		return errNoSnapshotStore
	}
	if why, err := m.pinReason(ctx, sn); err != nil {
		return err
	} else if why != "" {
		return errors.New("snapshot '" + sn.ID + "' stays on its node: " + why)
	}
	if sn.Image == "" || len(sn.SnapshotLayers) == 0 {
		return fmt.Errorf("snapshot '%s' is recorded only as host paths of node %s", sn.ID, sn.Node)
	}
	_, err := m.chain(ctx, sn)
	return err
}

// chain is sn's snapshots by ID, top-most first, each with its package.
func (m *Manager) chain(ctx context.Context, sn *store.Snapshot) ([]*store.Snapshot, error) {
	out := make([]*store.Snapshot, 0, len(sn.SnapshotLayers))
	for _, id := range sn.SnapshotLayers {
		row := sn
		if id != sn.ID {
			var err error
			if row, err = m.store.GetSnapshot(ctx, id); err != nil {
				return nil, fmt.Errorf("snapshot '%s' stacks on %s: %w", sn.ID, id, err)
			}
		}
		if len(row.Package) == 0 {
			return nil, fmt.Errorf("snapshot %s was not uploaded to the snapshot store", id)
		}
		out = append(out, row)
	}
	return out, nil
}

// pinnedError adds, to a placement that found no node for a create from
// a snapshot, why the snapshot could not go elsewhere.
func (m *Manager) pinnedError(ctx context.Context, sn *store.Snapshot, err error) error {
	var nf *scheduler.NoFitError
	if sn == nil || !errors.As(err, &nf) {
		return err
	}
	if why := m.movable(ctx, sn); why != nil {
		return fmt.Errorf("%w (a sandbox from snapshot '%s' starts on node %s, where its files are: %v)", err, sn.ID, sn.Node, why)
	}
	return err
}

// pullsOK: the node boots by reference (only those can take a chain by
// ID from the snapshot store).
func (m *Manager) pullsOK(ctx context.Context, nodeID string) bool {
	nd, err := m.nodes.Get(ctx, nodeID)
	if err != nil {
		return false
	}
	pulls, err := m.pullsImages(ctx, nodeID, nd)
	return err == nil && pulls
}

// fetchChain has nd fetch sn's chain from the snapshot store, through
// presigned GET URLs for exactly those snapshots' objects.
func (m *Manager) fetchChain(ctx context.Context, nd node.Node, nodeID string, sn *store.Snapshot) error {
	if err := m.movable(ctx, sn); err != nil {
		return fmt.Errorf("%w: %v", ErrConflict, err)
	}
	rows, err := m.chain(ctx, sn)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConflict, err)
	}
	for _, row := range rows {
		gets, err := m.cfg.SnapshotStore.GetURLs(ctx, row.ID, toObjects(row.Package))
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", row.ID, err)
		}
		if err := nd.FetchSnapshot(ctx, row.ID, gets); err != nil {
			return fmt.Errorf("node %s: fetch snapshot %s: %w", nodeID, row.ID, err)
		}
	}
	return nil
}

// pushPackage uploads a new snapshot's own layer (and memory image) from
// its node through presigned PUT URLs; the digests go in its row.
func (m *Manager) pushPackage(ctx context.Context, nd node.Node, sb *store.Sandbox, ns node.Snapshot) ([]store.SnapshotObject, error) {
	if sb.Image == "" {
		return nil, nil // booted from paths: no other node could use it
	}
	if why, err := m.pinReason(ctx, &store.Snapshot{ID: ns.ID, Node: m.rowNode(sb), Volumes: sb.Volumes}); err != nil || why != "" {
		return nil, err // pinned: nothing to upload
	}
	parts := []string{snapstore.PartRootfs}
	if ns.Kind == runtime.SnapshotMemory {
		parts = append(parts, snapstore.PartCheckpoint)
	}
	puts, err := m.cfg.SnapshotStore.PutURLs(ctx, ns.ID, parts...)
	if err != nil {
		return nil, err
	}
	objs, err := nd.PushSnapshot(ctx, ns.ID, puts)
	if err != nil {
		return nil, err
	}
	out := make([]store.SnapshotObject, 0, len(objs))
	for _, o := range objs {
		out = append(out, store.SnapshotObject{Part: o.Part, Digest: o.Digest, Size: o.Size})
	}
	return out, nil
}

func toObjects(pkg []store.SnapshotObject) []snapstore.Object {
	out := make([]snapstore.Object, 0, len(pkg))
	for _, p := range pkg {
		out = append(out, snapstore.Object{Part: p.Part, Digest: p.Digest, Size: p.Size})
	}
	return out
}
