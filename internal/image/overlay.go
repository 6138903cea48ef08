package image

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// UnpackOverlay unpacks img's layers after the first skip into dest as an
// overlayfs layer to stack on lowers (top-most first), which must hold the
// merged tree of the first skip layers: a template built FROM a template
// whose rootfs is on disk keeps only what its own steps changed, not a copy
// of the whole tree. OCI whiteouts become overlayfs whiteouts (character
// device 0/0) and opaque directories (trusted.overlay.opaque=y), and
// directories dest must create for an entry copy their attributes from the
// lower layer that has them, so the merged view keeps /tmp's mode and
// /home/user's owner. Like Unpack, dest is replaced atomically.
func UnpackOverlay(img v1.Image, skip int, dest string, lowers []string) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if skip < 0 || skip > len(layers) {
		return fmt.Errorf("image: skip %d of %d layers", skip, len(layers))
	}
	return replaceDir(dest, func(tmp string) error {
		u := &upper{root: tmp, lowers: lowers}
		for i, l := range layers[skip:] {
			rc, err := l.Uncompressed()
			if err != nil {
				return fmt.Errorf("image: layer %d: %w", skip+i, err)
			}
			err = u.apply(rc)
			rc.Close()
			if err != nil {
				return fmt.Errorf("image: layer %d: %w", skip+i, err)
			}
		}
		return nil
	})
}

// upper is an overlay upper directory being written over read-only lowers.
type upper struct {
	root   string
	lowers []string
}

const opaqueXattr = "trusted.overlay.opaque"

func isWhiteout(fi os.FileInfo) bool {
	if fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// lookup finds rel in the merged view: the upper first, then the lowers.
// A whiteout in the upper hides the lowers.
func (u *upper) lookup(rel string) (layer string, fi os.FileInfo, err error) {
	if fi, err := os.Lstat(filepath.Join(u.root, rel)); err == nil {
		if isWhiteout(fi) {
			return "", nil, os.ErrNotExist
		}
		return u.root, fi, nil
	}
	for _, l := range u.lowers {
		if fi, err := os.Lstat(filepath.Join(l, rel)); err == nil {
			return l, fi, nil
		}
	}
	return "", nil, os.ErrNotExist
}

// parent resolves dir (relative, "/"-separated) in the merged view,
// following symlinks as if the tree were "/", and makes each component a
// directory in the upper with the attributes the merged view gives it. The
// result never leaves the upper.
func (u *upper) parent(dir string) (string, error) {
	cur, err := walkParents(dir, u.lookup, u.mkdir)
	if err != nil {
		return "", err
	}
	return filepath.Join(u.root, cur), nil
}

// mkdir makes rel a directory in the upper unless it is one, copying the
// attributes of the lower directory it shadows (fi from layer), if any.
func (u *upper) mkdir(rel, layer string, fi os.FileInfo) error {
	p := filepath.Join(u.root, rel)
	if layer == u.root && fi != nil && fi.IsDir() {
		return nil
	}
	if _, err := os.Lstat(p); err == nil {
		// A whiteout or a non-directory of an earlier layer of this
		// unpack: it hid whatever the lowers have there, and so must the
		// directory that replaces it.
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		return unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		return err
	}
	if fi != nil && fi.IsDir() {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
		if err := os.Chmod(p, fi.Mode().Perm()|fi.Mode()&(os.ModeSticky|os.ModeSetgid|os.ModeSetuid)); err != nil {
			return err
		}
		_ = os.Chtimes(p, fi.ModTime(), fi.ModTime())
	}
	return nil
}

func (u *upper) whiteout(target string) error {
	if err := os.RemoveAll(target); err != nil {
		return err
	}
	return unix.Mknod(target, unix.S_IFCHR|0o600, 0)
}

func (u *upper) apply(r io.Reader) error {
	written := map[string]bool{}
	var opaque []string
	var dirs []dirTimes
	err := eachEntry(r, func(tr *tar.Reader, hdr *tar.Header, rel string) error {
		dir, base := path.Split(rel)
		parent, err := u.parent(dir)
		if err != nil {
			return err
		}
		if base == whiteoutOpaque {
			opaque = append(opaque, parent)
			return nil
		}
		if gone, ok, err := whiteoutOf(hdr, base); ok || err != nil {
			if err != nil {
				return err
			}
			return u.whiteout(filepath.Join(parent, gone))
		}
		target := filepath.Join(parent, base)
		written[target] = true
		if hdr.Typeflag == tar.TypeLink {
			if err := u.link(target, hdr); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			return nil
		}
		// A directory replacing a whiteout or a non-directory of an earlier
		// layer must hide the lowers' directory there, as that did.
		hid := false
		if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
			hid = true
		}
		if err := writeEntry(u.root, target, hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			if hid {
				if err := unix.Lsetxattr(target, opaqueXattr, []byte("y"), 0); err != nil {
					return err
				}
			}
			dirs = append(dirs, dirTimes{target, hdr.ModTime})
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Paths recorded above were resolved when their entry came; a later
	// entry of the same tar may have replaced a directory on them with a
	// symlink (to the host's /, say). What follows goes through os.Root,
	// which never resolves outside the upper.
	root, err := os.OpenRoot(u.root)
	if err != nil {
		return err
	}
	defer root.Close()
	rel := func(p string) string {
		r, err := filepath.Rel(u.root, p)
		if err != nil {
			return p // not below the upper: os.Root refuses it
		}
		return r
	}
	for _, p := range opaque {
		// This layer's own entries stay; earlier ones of this unpack go,
		// and the lowers are hidden by the marker.
		if err := u.opaque(root, rel(p), p, written); err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = root.Chtimes(rel(dirs[i].path), dirs[i].mtime, dirs[i].mtime) // a dir replaced since has no times to keep
	}
	return nil
}

// opaque empties the upper's directory rel (host path p, as recorded) of
// what earlier layers of this unpack wrote and marks it opaque, all
// through root.
func (u *upper) opaque(root *os.Root, rel, p string, written map[string]bool) error {
	d, err := root.Open(rel)
	if err != nil {
		return err
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !writtenBelow(written, filepath.Join(p, e.Name())) {
			if err := root.RemoveAll(filepath.Join(rel, e.Name())); err != nil {
				return err
			}
		}
	}
	return unix.Fsetxattr(int(d.Fd()), opaqueXattr, []byte("y"), 0)
}

func writtenBelow(written map[string]bool, p string) bool {
	if written[p] {
		return true
	}
	prefix := p + string(filepath.Separator)
	for w := range written {
		if strings.HasPrefix(w, prefix) {
			return true
		}
	}
	return false
}

// link makes a hard link entry. Its target may be in a lower layer, which
// the upper cannot link to: then the file is copied (the merged view has
// the same content; only the shared inode is lost).
func (u *upper) link(target string, hdr *tar.Header) error {
	ln, err := cleanEntry(hdr.Linkname)
	if err != nil || ln == "" {
		return fmt.Errorf("%w: hardlink to %q", ErrUnsafePath, hdr.Linkname)
	}
	ldir, lbase := path.Split(ln)
	lp, err := u.parent(ldir)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(target); err != nil {
		return err
	}
	src := filepath.Join(lp, lbase)
	if fi, err := os.Lstat(src); err == nil && !isWhiteout(fi) {
		return os.Link(src, target)
	}
	rel, err := filepath.Rel(u.root, src)
	if err != nil {
		return err
	}
	layer, fi, err := u.lookup(rel)
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: hardlink to %q, which is not a file", ErrUnsafePath, hdr.Linkname)
	}
	in, err := os.Open(filepath.Join(layer, rel))
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	return os.Chmod(target, fi.Mode().Perm()|fi.Mode()&(os.ModeSticky|os.ModeSetgid|os.ModeSetuid))
}
