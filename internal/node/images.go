package node

import (
	"context"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

var (
	// ErrImageRequest: a create names both an image and layers.
	ErrImageRequest = errdefs.NewReason(errdefs.ErrInvalidArgument, "node_image_request", "node: a create names an image or layers, not both")
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
