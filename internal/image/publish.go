package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// ErrOverlayEntry: an overlayfs upper directory entry whose content is
// not in the directory (a redirected directory or a metacopy file, whose
// data stays in the lower layer), which an OCI layer cannot say.
var ErrOverlayEntry = errors.New("image: overlay upper directory entry cannot be published")

// PublishDir stores below's layers (an image already in the store; ""
// for none) with the tree dir as one more layer on top, tagged ref, and
// returns the manifest digest. A ref already tagged, here or in the shared
// store (read through), is not rebuilt: published is false and the digest
// is the existing one, so replicas that share a store agree on one image.
//
// dir may be an overlayfs upper directory: its whiteouts (character
// devices 0/0) become OCI ".wh.<name>" entries and its opaque directories
// (trusted.overlay.opaque or user.overlay.opaque "y") ".wh..wh..opq";
// redirected directories and metacopy files are refused (ErrOverlayEntry).
// Other device nodes are left out: nodes never make them (UnpackLayers),
// the sandbox runtime mounts its own /dev. The
// layer is deterministic for a given tree (sorted entries, no timestamps
// but the files', fixed gzip level, a config without a creation time), so
// the same tree gives the same digest in any store.
//
// progress, when not nil, is called as the layer is written with the
// bytes of tar stream written so far (before compression).
func (s *Store) PublishDir(ref, below, dir string, progress func(written int64)) (digest v1.Hash, published bool, err error) {
	name, err := NormalizeRef(ref)
	if err != nil {
		return v1.Hash{}, false, err
	}
	if d, err := s.Resolve(name); err == nil {
		return d.Digest, false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return v1.Hash{}, false, err
	}
	base := empty.Image
	if below != "" {
		if base, err = s.Get(below); err != nil {
			return v1.Hash{}, false, fmt.Errorf("image: layers below %s: %w", name, err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return v1.Hash{}, false, err
	}
	if !fi.IsDir() {
		return v1.Hash{}, false, fmt.Errorf("image: %s is not a directory", dir)
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, "uploads"), "publish-*.tar.gz")
	if err != nil {
		return v1.Hash{}, false, err
	}
	defer os.Remove(f.Name())
	if err := writeLayerGzip(f, dir, progress); err != nil {
		f.Close()
		return v1.Hash{}, false, err
	}
	if err := f.Close(); err != nil {
		return v1.Hash{}, false, err
	}
	layer, err := tarball.LayerFromFile(f.Name(), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return v1.Hash{}, false, err
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return v1.Hash{}, false, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, false, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{}
	cf.History = nil
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = defaultEnv
	}
	if len(cf.Config.Cmd) == 0 {
		cf.Config.Cmd = []string{"/bin/sh"}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return v1.Hash{}, false, err
	}
	if err := s.Put(name, img); err != nil {
		return v1.Hash{}, false, err
	}
	d, err := s.Resolve(name)
	if err != nil {
		return v1.Hash{}, false, err
	}
	return d.Digest, true, nil
}

// counter reports the bytes written through it.
type counter struct {
	w        io.Writer
	n        int64
	progress func(int64)
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.progress(c.n)
	return n, err
}

func writeLayerGzip(w io.Writer, dir string, progress func(int64)) error {
	// BestSpeed: a built-in is large and local; CPU time matters more than
	// bytes, and a fixed level keeps the bytes (and digest) stable.
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(zw, 1<<20)
	var tw *tar.Writer
	if progress != nil {
		tw = tar.NewWriter(&counter{w: bw, progress: progress})
	} else {
		tw = tar.NewWriter(bw)
	}
	if err := writeTree(tw, dir, true); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// overlayEntry turns an overlayfs upper directory's markers into OCI
// whiteouts: the header to write instead of hdr (nil: hdr as is; skip:
// nothing), and whether the directory p is opaque (its ".wh..wh..opq"
// follows it).
func overlayEntry(p string, fi os.FileInfo, hdr *tar.Header) (repl *tar.Header, skip, opaque bool, err error) {
	switch {
	case fi.Mode()&os.ModeDevice != 0:
		if fi.Mode()&os.ModeCharDevice == 0 || hdr.Devmajor != 0 || hdr.Devminor != 0 {
			return nil, true, false, nil // a real device: never made on a node
		}
		dir, base := path.Split(hdr.Name)
		return &tar.Header{Typeflag: tar.TypeReg, Name: dir + whiteoutPrefix + base, Mode: 0o600, Format: tar.FormatPAX}, false, false, nil
	case fi.IsDir():
		if hasXattr(p, "trusted.overlay.redirect", "user.overlay.redirect") {
			return nil, false, false, fmt.Errorf("%w: %s is a redirected directory (its content is in a lower layer)", ErrOverlayEntry, p)
		}
		for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
			buf := make([]byte, 8)
			n, err := unix.Lgetxattr(p, attr, buf)
			if err == nil && string(buf[:n]) == "y" {
				return nil, false, true, nil
			}
		}
	case fi.Mode().IsRegular():
		if hasXattr(p, "trusted.overlay.metacopy", "user.overlay.metacopy") {
			return nil, false, false, fmt.Errorf("%w: %s is a metacopy file (its data is in a lower layer)", ErrOverlayEntry, p)
		}
	}
	return nil, false, false, nil
}

// hasXattr reports whether p (not followed) has any of attrs.
func hasXattr(p string, attrs ...string) bool {
	for _, a := range attrs {
		if _, err := unix.Lgetxattr(p, a, nil); err == nil {
			return true
		}
	}
	return false
}
