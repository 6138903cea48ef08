package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

var (
	// ErrImageRequest: a create names its root file system more than one
	// way (layers and an image, a checkpoint path and a snapshot ID) or a
	// restore that is not its top snapshot.
	ErrImageRequest = errdefs.NewReason(errdefs.ErrInvalidArgument, "node_image_request", "node: a create names its root file system more than one way")
	// ErrSnapshotNotFound: a snapshot ID the node has no files for.
	ErrSnapshotNotFound = errdefs.NewReason(errdefs.ErrNotFound, "node_snapshot_not_found", "node: no such snapshot on this node")
	// ErrImagesUnsupported: the node has no image source (Info's
	// Abilities.PullsImages is false): it boots from layers only.
	ErrImagesUnsupported = errdefs.NewReason(errdefs.ErrFailedPrecondition, "node_images_unsupported", "node: this node boots from layers, not image references")
)

// Image names what a sandbox boots from as a reference the node resolves
// itself, so no path of the control plane's crosses the boundary: a
// built-in image by Name (base, code-interpreter-v1: in every node's images
// dir), or a template's image in the control plane's registry by
// repository Name and manifest Digest.
type Image struct {
	Name   string `json:"name"`
	Digest string `json:"digest,omitempty"` // "sha256:<hex>"; "" for a built-in image
}

// IsZero reports whether i names no image.
func (i Image) IsZero() bool { return i == Image{} }

func (i Image) String() string {
	if i.Digest == "" {
		return i.Name
	}
	return i.Name + "@" + i.Digest
}

// ImageSource resolves image references to the read-only rootfs layers of
// this node (internal/imagecache pulls and caches registry images).
type ImageSource interface {
	// Layers are image's rootfs layers on this node, top-most first,
	// fetched first if need be. Safe for concurrent use.
	Layers(ctx context.Context, image Image) ([]string, error)
	// Cached lists the registry images the node holds (built-ins are on
	// every node and not listed).
	Cached(ctx context.Context) ([]Image, error)
}

// PullImage implements Node.
func (l *Local) PullImage(ctx context.Context, image Image) error {
	if image.IsZero() {
		return fmt.Errorf("%w: no image named", ErrImageRequest)
	}
	_, err := l.layers(ctx, &CreateRequest{Image: image})
	return err
}

// rootfs is req's root file system on this node: its layers (its
// snapshots' above its own or its image's) and the checkpoint it
// continues from, if any.
func (l *Local) rootfs(ctx context.Context, req *CreateRequest) (layers []string, restore string, err error) {
	base, err := l.layers(ctx, req)
	if err != nil {
		return nil, "", err
	}
	if err := l.openSnapshotLayers(ctx, base); err != nil {
		return nil, "", err
	}
	if len(req.SnapshotLayers) == 0 && req.RestoreSnapshot == "" {
		return base, req.Restore, nil
	}
	if req.Restore != "" {
		return nil, "", fmt.Errorf("%w (a checkpoint path and snapshot %q)", ErrImageRequest, req.RestoreSnapshot)
	}
	if req.RestoreSnapshot != "" && (len(req.SnapshotLayers) == 0 || req.SnapshotLayers[0] != req.RestoreSnapshot) {
		return nil, "", fmt.Errorf("%w (restore snapshot %q is not the top snapshot layer)", ErrImageRequest, req.RestoreSnapshot)
	}
	for _, id := range req.SnapshotLayers {
		dir, err := l.snapshotPath(ctx, id, "rootfs")
		if err != nil {
			return nil, "", err
		}
		layers = append(layers, dir)
	}
	if req.RestoreSnapshot != "" {
		if restore, err = l.snapshotPath(ctx, req.RestoreSnapshot, "checkpoint"); err != nil {
			return nil, "", err
		}
	}
	return append(layers, base...), restore, nil
}

// openSnapshotLayers opens the snapshots among layers named by path (a
// control plane that shares the node's files names them so): a layer
// that is a mount is mounted again after a reboot before it is stacked.
func (l *Local) openSnapshotLayers(ctx context.Context, layers []string) error {
	if l.cfg.SnapshotDir == "" {
		return nil
	}
	for _, p := range layers {
		dir := filepath.Dir(p)
		if filepath.Base(p) != "rootfs" || filepath.Dir(dir) != filepath.Clean(l.cfg.SnapshotDir) {
			continue
		}
		sn, err := l.snapshotter()
		if err != nil {
			return err
		}
		if err := sn.OpenSnapshot(ctx, dir); err != nil {
			return fmt.Errorf("snapshot %s: %w", filepath.Base(dir), err)
		}
	}
	return nil
}

// snapshotPath is part (rootfs, checkpoint) of snapshot id in the node's
// snapshot dir, which the node's runtime wrote there (Snapshot), opened
// (a layer that is a mount is mounted again after a reboot).
func (l *Local) snapshotPath(ctx context.Context, id, part string) (string, error) {
	sn, err := l.snapshotter()
	if err != nil {
		return "", err
	}
	if !snapshotIDRe.MatchString(id) {
		return "", fmt.Errorf("%w: snapshot id %q", ErrSnapshotNotFound, id)
	}
	if part == "rootfs" {
		if err := sn.OpenSnapshot(ctx, filepath.Join(l.cfg.SnapshotDir, id)); err != nil {
			return "", fmt.Errorf("snapshot %s: %w", id, err)
		}
	}
	p := filepath.Join(l.cfg.SnapshotDir, id, part)
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%w: %s (no %s)", ErrSnapshotNotFound, id, part)
	}
	return p, nil
}

// layers are req's rootfs layers: its own, or its image's through the
// node's image source.
func (l *Local) layers(ctx context.Context, req *CreateRequest) ([]string, error) {
	if req.Image.IsZero() {
		return req.Layers, nil
	}
	if len(req.Layers) > 0 {
		return nil, fmt.Errorf("%w (image %s, %d layers)", ErrImageRequest, req.Image, len(req.Layers))
	}
	if l.cfg.Images == nil {
		return nil, fmt.Errorf("%w (image %s)", ErrImagesUnsupported, req.Image)
	}
	layers, err := l.cfg.Images.Layers(ctx, req.Image)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", req.Image, err)
	}
	return layers, nil
}
