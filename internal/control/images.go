package control

import (
	"context"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// bootImage is the image a create sends instead of tpl's layers when the
// node resolves image references itself (Info.Abilities.PullsImages): the
// layers are paths on the control plane's host. The embedded node shares
// them and keeps getting layers (the zero Image), unchanged and at no
// extra cost.
func (m *Manager) bootImage(tpl template.Template, fromSnapshot bool) (node.Image, error) {
	if !m.pullsImages.Load() {
		return node.Image{}, nil
	}
	if fromSnapshot {
		// A snapshot's layer is a file of the node that took it.
		return node.Image{}, fmt.Errorf("%w: sandboxes from snapshots start only on the embedded node for now", ErrConflict)
	}
	return m.imageRef(tpl)
}

// prefetch has a node that pulls images fetch tpl's before a warm pool's
// first standby, so the standbys (and the creates that claim them) never
// wait on a pull; a cached image costs the node a stat. The embedded node
// needs nothing.
func (m *Manager) prefetch(ctx context.Context, tpl template.Template) error {
	if !m.pullsImages.Load() {
		return nil
	}
	im, err := m.imageRef(tpl)
	if err != nil {
		return err
	}
	return m.node.PullImage(ctx, im)
}

// imageRef is tpl's image as a node asks for it: a built-in by name, or
// the control plane's registry image by digest.
func (m *Manager) imageRef(tpl template.Template) (node.Image, error) {
	switch {
	case tpl.Image == "":
		return node.Image{}, fmt.Errorf("%w: template '%s' has no image a node can pull (rebuild it)", ErrConflict, tpl.ID)
	case !strings.ContainsAny(tpl.Image, "/:"):
		return node.Image{Name: tpl.Image}, nil
	case m.cfg.ImageDigest == nil:
		return node.Image{}, fmt.Errorf("%w: template '%s': this server has no image registry for nodes", ErrConflict, tpl.ID)
	}
	im, err := m.cfg.ImageDigest(tpl.Image)
	if err != nil {
		return node.Image{}, fmt.Errorf("template '%s' image %s: %w", tpl.ID, tpl.Image, err)
	}
	return im, nil
}
