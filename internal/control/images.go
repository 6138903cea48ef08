package control

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// bootImage is the image a create sends instead of tpl's layers when the
// node resolves image references itself (Info.Abilities.PullsImages): the
// layers are paths on the control plane's host. The embedded node shares
// them and keeps getting layers (the zero Image), unchanged and at no
// extra cost. A create from snapshot sn boots the image sn's chain was
// taken over (sn's template has only the node's paths).
func (m *Manager) bootImage(ctx context.Context, nodeID string, nd node.Node, tpl template.Template, sn *store.Snapshot) (node.Image, error) {
	pulls, err := m.pullsImages(ctx, nodeID, nd)
	if err != nil || !pulls {
		return node.Image{}, err
	}
	if sn != nil {
		return snapshotImage(sn, nodeID)
	}
	return m.imageRef(tpl)
}

// snapshotImage is the image below sn's chain, for a node that pulls
// images; a snapshot recorded only by path (its source booted from
// layers) cannot be named to such a node.
func snapshotImage(sn *store.Snapshot, nodeID string) (node.Image, error) {
	if sn.Image == "" || len(sn.SnapshotLayers) == 0 {
		return node.Image{}, fmt.Errorf("%w: snapshot '%s' is recorded only as host paths (its sandbox booted from layers, not an image), which node %s, a node that pulls its images, cannot use", ErrConflict, sn.ID, nodeID)
	}
	return parseImage(sn.Image), nil
}

// parseImage reverses node.Image.String: repository@digest, or a
// built-in's name.
func parseImage(s string) node.Image {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return node.Image{Name: s[:i], Digest: s[i+1:]}
	}
	return node.Image{Name: s}
}

// byReference turns req into its node-local form for a node that pulls
// images: the image and the snapshot chain by ID instead of paths, and a
// memory snapshot's checkpoint by its ID (the top of the chain).
func byReference(req *node.CreateRequest, boot node.Image, snapshotLayers []string, memory bool) {
	req.Layers, req.Image = nil, boot
	req.SnapshotLayers = snapshotLayers
	if memory && len(snapshotLayers) > 0 {
		req.Restore, req.RestoreSnapshot = "", snapshotLayers[0]
	}
}

// prefetch has every node that pulls images fetch tpl's before a warm
// pool's first standby, so the standbys (and the creates that claim them)
// never wait on a pull; a cached image costs a node a stat. The embedded
// node needs nothing. It fails only when no node that pulls could.
func (m *Manager) prefetch(ctx context.Context, tpl template.Template) error {
	members, err := m.nodes.Members(ctx)
	if err != nil {
		return err
	}
	var errs []error
	pulled := false
	for _, mb := range members {
		if !m.nodes.IsLocal(mb.ID) && (mb.Row == nil || mb.Row.Address == "") {
			continue // another replica's in-process node
		}
		nd, err := m.nodes.Get(ctx, mb.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pulls, err := m.pullsImages(ctx, mb.ID, nd)
		if err != nil || !pulls {
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		im, err := m.imageRef(tpl)
		if err != nil {
			return err
		}
		if err := nd.PullImage(ctx, im); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", mb.ID, err))
			continue
		}
		pulled = true
	}
	if pulled {
		return nil
	}
	return errors.Join(errs...)
}

// pullsAge is how long a node's PullsImages answer is reused: it changes
// only when the node restarts with another configuration.
const pullsAge = 30 * time.Second

type pullsEntry struct {
	pulls bool
	at    time.Time
}

// pullsImages reports whether the node resolves image references itself
// (Info.Abilities.PullsImages), asking it at most every pullsAge.
func (m *Manager) pullsImages(ctx context.Context, nodeID string, nd node.Node) (bool, error) {
	if v, ok := m.pulls.Load(nodeID); ok && time.Since(v.(pullsEntry).at) < pullsAge {
		return v.(pullsEntry).pulls, nil
	}
	info, err := nd.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("node %s: %w", nodeID, err)
	}
	m.pulls.Store(nodeID, pullsEntry{pulls: info.Abilities.PullsImages, at: time.Now()})
	return info.Abilities.PullsImages, nil
}

// imageRef is tpl's image as a node asks for it: a built-in by name (by
// its published repository and digest once this control plane has
// published it), or the control plane's registry image by digest.
func (m *Manager) imageRef(tpl template.Template) (node.Image, error) {
	switch {
	case tpl.Image == "":
		return node.Image{}, fmt.Errorf("%w: template '%s' has no image a node can pull (rebuild it)", ErrConflict, tpl.ID)
	case !strings.ContainsAny(tpl.Image, "/:"):
		if m.cfg.BuiltinImage != nil {
			if im, ok := m.cfg.BuiltinImage(tpl.Image); ok {
				return im, nil
			}
		}
		return node.Image{Name: tpl.Image}, nil
	case tpl.ImageDigest != "":
		// The build row's digest: any replica names the image the same way,
		// whichever one's index holds the tag.
		return node.Image{Name: repositoryOf(tpl.Image), Digest: tpl.ImageDigest}, nil
	case m.cfg.ImageDigest == nil:
		return node.Image{}, fmt.Errorf("%w: template '%s': this server has no image registry for nodes", ErrConflict, tpl.ID)
	}
	im, err := m.cfg.ImageDigest(tpl.Image)
	if err != nil {
		return node.Image{}, fmt.Errorf("template '%s' image %s: %w", tpl.ID, tpl.Image, err)
	}
	return im, nil
}

// repositoryOf is the repository of a "repo:tag" reference in the image
// store (a tag follows the last ":" only when no "/" comes after it).
func repositoryOf(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i >= 0 && !strings.Contains(ref[i:], "/") {
		return ref[:i]
	}
	return ref
}
