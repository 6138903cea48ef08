// Package imagecache is a node's cache of the images its sandboxes boot
// from. A remote node has none of the control plane's files: it pulls a
// template's image from the control plane's registry (by digest, over the
// cluster's mTLS, with the node's certificate), verifies every blob against
// its digest, unpacks it once under its own directory and serves later
// creates from there without a request.
package imagecache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var (
	// ErrInvalidRef: a reference that names no image by content.
	ErrInvalidRef = errdefs.NewReason(errdefs.ErrInvalidArgument, "image_ref_invalid", "imagecache: invalid image reference")
	// ErrDigestMismatch: what the registry sent is not what the digest names.
	ErrDigestMismatch = errdefs.NewReason(errdefs.ErrDataLoss, "image_digest_mismatch", "imagecache: content does not match its digest")
	// ErrPull: the registry could not be read (unreachable, refused, unknown image).
	ErrPull = errdefs.NewReason(errdefs.ErrUnavailable, "image_pull_failed", "imagecache: pull failed")
)

// Ref names an image in the control plane's registry by content: the
// repository it was pushed to and its manifest digest. The digest is the
// identity; the repository only says where to ask. Nodes read the registry
// by digest only (no tags, no listing), so a node learns an image only from
// the create requests it is sent.
type Ref struct {
	Repository string `json:"repository"`
	Digest     string `json:"digest"` // sha256:<64 hex>
}

func (r Ref) String() string { return r.Repository + "@" + r.Digest }

var (
	repoRE   = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$`)
	digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
)

// Validate says whether r names an image by content.
func (r Ref) Validate() error {
	if !repoRE.MatchString(r.Repository) || len(r.Repository) > 255 {
		return fmt.Errorf("%w: repository %q", ErrInvalidRef, r.Repository)
	}
	if !digestRE.MatchString(r.Digest) {
		return fmt.Errorf("%w: digest %q (want sha256:<64 hex>)", ErrInvalidRef, r.Digest)
	}
	return nil
}

// Config is where a cache pulls from and keeps its images.
type Config struct {
	// Registry is the control plane's host:port.
	Registry string
	// TLS is the node's client configuration: its certificate, the
	// cluster CA as roots and the control plane's server name.
	TLS *tls.Config
	// Dir holds <hex digest>/rootfs and <hex digest>/ref.json (root-only).
	Dir string
	// PullTimeout bounds one pull, fetch and unpack (default 15 minutes):
	// a stalled registry fails the pull instead of holding every create
	// of that image.
	PullTimeout time.Duration
}

// Cache is safe for concurrent use; concurrent first uses of one image
// pull it once.
type Cache struct {
	cfg Config
	tr  http.RoundTripper

	mu      sync.Mutex
	pulling map[string]*pull
}

type pull struct {
	done chan struct{}
	err  error
}

// New opens the cache in cfg.Dir, making it if needed.
func New(cfg Config) (*Cache, error) {
	if cfg.Registry == "" || cfg.TLS == nil || cfg.Dir == "" {
		return nil, errors.New("imagecache: Registry, TLS and Dir are required")
	}
	if cfg.PullTimeout == 0 {
		cfg.PullTimeout = 15 * time.Minute
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg.TLS.Clone()
	tr.ForceAttemptHTTP2 = true
	return &Cache{cfg: cfg, tr: tr, pulling: map[string]*pull{}}, nil
}

func (c *Cache) dir(r Ref) string { return filepath.Join(c.cfg.Dir, r.Digest[len("sha256:"):]) }

// Rootfs returns the unpacked root file system of r, pulling and unpacking
// it on first use. A cached image answers from disk alone. On error
// nothing of the pull is left.
func (c *Cache) Rootfs(ctx context.Context, r Ref) (string, error) {
	if err := r.Validate(); err != nil {
		return "", err
	}
	d := c.dir(r)
	if cached(d) {
		return filepath.Join(d, "rootfs"), nil
	}
	c.mu.Lock()
	p, ok := c.pulling[r.Digest]
	if !ok {
		p = &pull{done: make(chan struct{})}
		c.pulling[r.Digest] = p
		go func() {
			// Detached from the first caller: a second caller may still
			// be waiting when the first gives up.
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.PullTimeout)
			p.err = c.pull(pctx, r, d)
			cancel()
			c.mu.Lock()
			delete(c.pulling, r.Digest)
			c.mu.Unlock()
			close(p.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if p.err != nil {
		return "", p.err
	}
	return filepath.Join(d, "rootfs"), nil
}

// cached: ref.json is written last, so its presence means rootfs is whole.
func cached(d string) bool {
	_, err := os.Stat(filepath.Join(d, "ref.json"))
	return err == nil
}

// Cached lists the images the cache holds, by digest.
func (c *Cache) Cached() ([]Ref, error) {
	ents, err := os.ReadDir(c.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []Ref
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(c.cfg.Dir, e.Name(), "ref.json"))
		if err != nil {
			continue // a pull in progress or an interrupted one
		}
		var r Ref
		if json.Unmarshal(b, &r) == nil && r.Validate() == nil && r.Digest[len("sha256:"):] == e.Name() {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Digest < out[j].Digest })
	return out, nil
}

// Remove drops r from the cache; an image not cached is a no-op. The
// caller makes sure no sandbox runs on it.
func (c *Cache) Remove(r Ref) error {
	if err := r.Validate(); err != nil {
		return err
	}
	d := c.dir(r)
	// ref.json first: a half-removed image is no longer cached.
	if err := os.Remove(filepath.Join(d, "ref.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(d)
}

func (c *Cache) pull(ctx context.Context, r Ref, d string) (err error) {
	// Leave nothing of a failed pull: the next use starts afresh.
	defer func() {
		if err != nil {
			os.RemoveAll(d)
		}
	}()
	if err := os.RemoveAll(d); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(d, "blobs"), 0o700); err != nil {
		return err
	}
	raw, err := c.get(ctx, r, "manifests/"+r.Digest, filepath.Join(d, "manifest.json"), maxManifestSize, r.Digest)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		return err
	}
	m, err := v1.ParseManifest(bytes.NewReader(b))
	if err != nil || m.Config.Digest.Algorithm == "" {
		return fmt.Errorf("%w: %s is not an image manifest", ErrPull, r)
	}
	layers := make([]v1.Layer, 0, len(m.Layers))
	for i, desc := range m.Layers {
		if desc.Size < 0 || !digestRE.MatchString(desc.Digest.String()) {
			return fmt.Errorf("%w: layer %d of %s: bad descriptor", ErrPull, i, r)
		}
		path, err := c.get(ctx, r, "blobs/"+desc.Digest.String(), filepath.Join(d, "blobs", fmt.Sprint(i)), desc.Size, desc.Digest.String())
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		// Only verified bytes are unpacked; tarball sniffs the compression.
		l, err := tarball.LayerFromFile(path)
		if err != nil {
			return err
		}
		layers = append(layers, l)
	}
	if err := image.UnpackLayers(layers, filepath.Join(d, "rootfs")); err != nil {
		return fmt.Errorf("unpack %s: %w", r, err)
	}
	if err := os.RemoveAll(filepath.Join(d, "blobs")); err != nil {
		return err
	}
	out, _ := json.Marshal(r)
	return writeFileSync(filepath.Join(d, "ref.json"), out)
}

// maxManifestSize bounds a manifest, as the registry does.
const maxManifestSize = 4 << 20

// get fetches /v2/<repo>/<what> into path and refuses it unless its
// SHA-256 is want and it is at most limit bytes (exactly limit for a blob,
// whose size the verified manifest gives).
func (c *Cache) get(ctx context.Context, r Ref, what, path string, limit int64, want string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.cfg.Registry+"/v2/"+r.Repository+"/"+what, nil)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidRef, err)
	}
	req.Header.Set("Accept", string(types.OCIManifestSchema1)+", "+string(types.DockerManifestSchema2))
	resp, err := c.tr.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrPull, r, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("%w: %s: GET %s: %s: %s", ErrPull, r, what, resp.Status, bytes.TrimSpace(msg))
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return "", fmt.Errorf("%w: %s: GET %s: %v", ErrPull, r, what, err)
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if n > limit || (strings.HasPrefix(what, "blobs/") && n != limit) || got != want {
		return "", fmt.Errorf("%w: %s: got %d bytes with digest %s, want %s", ErrDigestMismatch, what, n, got, want)
	}
	return path, f.Close()
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
