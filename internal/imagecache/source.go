package imagecache

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"

	"github.com/cubicle-dev/cubicle/internal/builtinimage"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// ErrUnknownImage: a built-in image the node's images dir does not hold.
var (
	ErrUnknownImage = errdefs.NewReason(errdefs.ErrNotFound, "image_unknown", "imagecache: no such built-in image on this node")
	// ErrNoRegistry: a registry image on a node that has no registry to pull from.
	ErrNoRegistry = errdefs.NewReason(errdefs.ErrFailedPrecondition, "image_no_registry", "imagecache: this node has no registry to pull from")
)

var builtinRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// Source is a remote node's node.ImageSource: built-in images (a Name
// without a Digest) from the node's own images dir, laid out as the
// embedded node's (template.ImageLayers), and registry images through the
// cache (nil: built-ins only, and ErrNoRegistry for the rest).
type Source struct {
	Cache     *Cache
	ImagesDir string
}

var _ node.ImageSource = (*Source)(nil)

// Layers implements node.ImageSource. A built-in published by the
// control plane (builtin/<name>@digest, serve --publish-builtins) boots
// from the node's own images dir when that holds it, as a built-in by name
// does, and is pulled otherwise.
func (s *Source) Layers(ctx context.Context, im node.Image) ([]string, error) {
	if im.Digest == "" {
		if !builtinRE.MatchString(im.Name) {
			return nil, fmt.Errorf("%w: built-in image %q", ErrInvalidRef, im.Name)
		}
		layers, missing := s.local(im.Name)
		if missing != "" {
			return nil, fmt.Errorf("%w: %s is not in this node's images dir (no %s) and the control plane has not published it to its registry (serve --publish-builtins; it may still be publishing)", ErrUnknownImage, im.Name, missing)
		}
		return layers, nil
	}
	if name, ok := builtinimage.NameOf(im.Name); ok {
		if layers, missing := s.local(name); missing == "" {
			return layers, nil
		}
	}
	if s.Cache == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoRegistry, im)
	}
	root, err := s.Cache.Rootfs(ctx, Ref{Repository: im.Name, Digest: im.Digest})
	if err != nil {
		return nil, err
	}
	return []string{root}, nil
}

// local is built-in name's layers in the node's images dir, or the first
// one it lacks.
func (s *Source) local(name string) (layers []string, missing string) {
	layers = template.ImageLayers(s.ImagesDir, name)
	for _, l := range layers {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return nil, l
		}
	}
	return layers, ""
}

// Cached implements node.ImageSource.
func (s *Source) Cached(context.Context) ([]node.Image, error) {
	if s.Cache == nil {
		return nil, nil
	}
	refs, err := s.Cache.Cached()
	if err != nil {
		return nil, err
	}
	out := make([]node.Image, len(refs))
	for i, r := range refs {
		out[i] = node.Image{Name: r.Repository, Digest: r.Digest}
	}
	return out, nil
}

// NewSource is a node's image source as `cubicle node run` makes it: the
// registry at the control-plane URL of its join (https only; port 443
// when none), the node's client TLS configuration, the built-ins in
// imagesDir and the cache in cacheDir. The cache is the node's own state
// (under its data dir), never the images dir: that may be shared with
// other servers or read-only, and what is pulled into it would outlive
// the node.
func NewSource(controlPlaneURL string, tlsConfig *tls.Config, imagesDir, cacheDir string) (*Source, error) {
	u, err := url.Parse(controlPlaneURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("imagecache: control-plane URL %q: want https://host[:port]", controlPlaneURL)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	c, err := New(Config{Registry: host, TLS: tlsConfig, Dir: cacheDir})
	if err != nil {
		return nil, err
	}
	return &Source{Cache: c, ImagesDir: imagesDir}, nil
}
