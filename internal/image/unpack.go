package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/go-archive"
	"github.com/moby/go-archive/chrootarchive"
	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Unpack extracts the flattened filesystem of image ref into dest. It builds
// dest+".tmp" first and swaps it in with one rename, so a crash leaves either
// the old dest or the new one, never a half-written tree.
func (s *Store) Unpack(ref, dest string) error {
	img, err := s.Get(ref)
	if err != nil {
		return err
	}
	return UnpackImage(img, dest)
}

// UnpackImage is Unpack for any v1.Image.
func UnpackImage(img v1.Image, dest string) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	return UnpackLayers(layers, dest)
}

// UnpackLayers is UnpackImage for layers held apart from their image
// (bottom-most first): a node's image cache applies the blobs it pulled
// and verified itself.
func UnpackLayers(layers []v1.Layer, dest string) error {
	return replaceDir(dest, func(tmp string) error {
		for i, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				return fmt.Errorf("image: layer %d: %w", i, err)
			}
			err = applyLayer(tmp, rc)
			rc.Close()
			if err != nil {
				return fmt.Errorf("image: layer %d: %w", i, err)
			}
		}
		return nil
	})
}

// replaceDir fills a fresh dest.tmp with fill and swaps it into place, so
// dest is the old tree or the new one, never a half-written one.
func replaceDir(dest string, fill func(tmp string) error) error {
	dest = filepath.Clean(dest)
	tmp := dest + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := fill(tmp); err != nil {
		return err
	}
	if _, err := os.Lstat(dest); err == nil {
		// Atomic swap, then drop the old tree (now at tmp).
		err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dest, unix.RENAME_EXCHANGE)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			// No RENAME_EXCHANGE on this fs: two renames, brief gap.
			old := dest + ".old"
			if err := os.RemoveAll(old); err != nil {
				return err
			}
			if err := os.Rename(dest, old); err != nil {
				return err
			}
			if err := os.Rename(tmp, dest); err != nil {
				os.Rename(old, dest)
				return err
			}
			ok = true
			return os.RemoveAll(old)
		}
		if err != nil {
			return fmt.Errorf("image: swap %s: %w", dest, err)
		}
		ok = true
		return os.RemoveAll(tmp)
	}
	if err := os.Rename(tmp, dest); err != nil {
		return err
	}
	ok = true
	return nil
}

// ApplyLayer applies one uncompressed layer tar onto root, honouring OCI
// whiteouts. Exported for callers that stack layers themselves.
func ApplyLayer(root string, r io.Reader) error { return applyLayer(root, r) }

type dirTimes struct {
	path  string
	mtime time.Time
}

// whiteoutOf reports whether a member named base is an OCI whiteout, and the
// sibling it removes. ".wh.", ".wh.." and ".wh..." name no sibling: they
// would remove the directory itself or, at the top, the root's parent.
func whiteoutOf(hdr *tar.Header, base string) (string, bool, error) {
	gone, ok := strings.CutPrefix(base, whiteoutPrefix)
	if !ok {
		return "", false, nil
	}
	if gone == "" || gone == "." || gone == ".." {
		return "", false, fmt.Errorf("%w: whiteout %q", ErrUnsafePath, hdr.Name)
	}
	return gone, true, nil
}

// eachEntry calls fn for every member of the tar stream r with its path
// relative to the root (cleanEntry; the root itself is skipped). fn reads
// the member's content from tr.
func eachEntry(r io.Reader, fn func(tr *tar.Reader, hdr *tar.Header, rel string) error) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := cleanEntry(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			continue // "./" itself
		}
		if err := fn(tr, hdr, rel); err != nil {
			return err
		}
	}
}

// applyLayer applies one uncompressed layer tar onto root with moby's
// go-archive, run in a chroot of root (chrootarchive: a private mount
// namespace and pivot_root on a locked OS thread). Every path the layer
// names, a symlink it planted earlier in the same tar included, resolves
// as if root were "/": a file, directory, hard link or directory time
// written through such a link lands inside root. go-archive keeps OCI
// whiteouts (.wh.<name> removes <name>; .wh..wh..opq hides what lower
// layers put in a directory, not what this layer wrote) and stores owners
// as the tar says (no ID shift: the runtime maps them per sandbox).
//
// The stream passes sanitize first, which refuses names that climb out
// with ErrUnsafePath and drops what a rootfs must not hold (device
// nodes). Needs root (CAP_SYS_ADMIN for the mount namespace), as the
// server that unpacks images has.
func applyLayer(root string, r io.Reader) error {
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	go func() {
		// Once the unpack stops (done, or failed on an earlier entry),
		// the rest of the stream is still checked, so a name that climbs
		// out is reported as such whatever came before it.
		err := sanitize(r, &untilClosed{w: pw})
		pw.CloseWithError(err)
		checked <- err
	}()
	_, err := chrootarchive.ApplyUncompressedLayer(root, pr, &archive.TarOptions{BestEffortXattrs: true})
	pr.CloseWithError(errUnpackDone)
	if cerr := <-checked; cerr != nil {
		return cerr
	}
	return err
}

var errUnpackDone = errors.New("image: unpack finished")

// untilClosed writes to w until a write fails (the reader is gone), then
// discards.
type untilClosed struct {
	w      io.Writer
	closed bool
}

func (u *untilClosed) Write(p []byte) (int, error) {
	if !u.closed {
		if _, err := u.w.Write(p); err == nil {
			return len(p), nil
		}
		u.closed = true
	}
	return len(p), nil
}

// sanitize copies the layer tar r to w, entry by entry: names are made
// relative and clean (one that climbs out, or a hard link to outside, is
// ErrUnsafePath, as is a whiteout that names no sibling); the root entry
// is skipped; regular files, directories, symlinks, hard links and fifos
// pass; device nodes are never made (the sandbox runtime mounts its own
// /dev, and a device node in a rootfs on the host, say the host disk with
// mode 0666, would hand it to any host user who can reach the tree);
// sockets and other types are not filesystem content and are dropped.
func sanitize(r io.Reader, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := eachEntry(r, func(tr *tar.Reader, hdr *tar.Header, rel string) error {
		if _, _, err := whiteoutOf(hdr, path.Base(rel)); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeFifo:
		case tar.TypeGNUSparse:
			hdr.Typeflag = tar.TypeReg // tar.Reader expands its holes
		case tar.TypeLink:
			ln, err := cleanEntry(hdr.Linkname)
			if err != nil || ln == "" {
				return fmt.Errorf("%w: hardlink to %q", ErrUnsafePath, hdr.Linkname)
			}
			hdr.Linkname = ln
		default:
			return nil
		}
		hdr.Name = rel
		hdr.Format = tar.FormatUnknown
		//lint:ignore SA1019 mirrored in PAXRecords, which is what is written
		hdr.Xattrs = nil
		if hdr.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// cleanEntry returns the entry's path relative to the root, or ErrUnsafePath
// if it climbs out. Leading "/" and "./" are tolerated, as tar allows them.
func cleanEntry(name string) (string, error) {
	n := strings.TrimLeft(name, "/")
	c := path.Clean(n)
	if c == "." {
		return "", nil
	}
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
	}
	return c, nil
}

// resolveParent returns the host path of dir (relative, "/"-separated) inside
// root, following symlinks in it as if root were "/": a lower layer may have
// made /lib a link to usr/lib. The result never leaves root.
func resolveParent(root, dir string) (string, error) {
	cur, err := walkParents(dir, func(rel string) (string, os.FileInfo, error) {
		fi, err := os.Lstat(filepath.Join(root, rel))
		return root, fi, err
	}, nil)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, cur), nil
}

// walkParents resolves dir component by component as if its tree were "/":
// lookup gives the entry at a relative path and the directory that holds it
// (where a symlink's target is read); symlinks are followed, and every
// other component is handed to visit (nil: none) before the walk goes on.
// It returns the resolved relative path, which never climbs out.
func walkParents(dir string, lookup func(rel string) (string, os.FileInfo, error), visit func(rel, layer string, fi os.FileInfo) error) (string, error) {
	cur := ""
	parts := strings.Split(strings.Trim(dir, "/"), "/")
	links := 0
	for len(parts) > 0 {
		p := parts[0]
		parts = parts[1:]
		switch p {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			if cur == "." || cur == "/" {
				cur = ""
			}
			continue
		}
		next := path.Join(cur, p)
		layer, fi, err := lookup(next)
		if err == nil && fi.Mode()&os.ModeSymlink != 0 {
			if links++; links > 40 {
				return "", fmt.Errorf("%w: too many symlinks under %q", ErrUnsafePath, dir)
			}
			dst, err := os.Readlink(filepath.Join(layer, next))
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(dst, "/") {
				cur = ""
			}
			parts = append(strings.Split(dst, "/"), parts...)
			continue
		}
		if visit != nil {
			if err != nil {
				layer, fi = "", nil
			}
			if err := visit(next, layer, fi); err != nil {
				return "", err
			}
		}
		cur = next
	}
	return cur, nil
}

func writeEntry(root, target string, hdr *tar.Header, r io.Reader) error {
	fi, statErr := os.Lstat(target)
	exists := statErr == nil
	// Replace anything in the way, except a directory replaced by a directory
	// (which keeps its lower-layer children).
	if exists && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := os.RemoveAll(target); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !exists || !fi.IsDir() {
			if err := os.Mkdir(target, 0o755); err != nil {
				return err
			}
		}
	//lint:ignore SA1019 archives from old tools still mark files '\x00'
	case tar.TypeReg, tar.TypeRegA:
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
	case tar.TypeLink:
		ln, err := cleanEntry(hdr.Linkname)
		if err != nil || ln == "" {
			return fmt.Errorf("%w: hardlink to %q", ErrUnsafePath, hdr.Linkname)
		}
		ldir, lbase := path.Split(ln)
		lp, err := resolveParent(root, ldir)
		if err != nil {
			return err
		}
		// Link the entry itself, not what it may point at.
		return os.Link(filepath.Join(lp, lbase), target)
	case tar.TypeChar, tar.TypeBlock:
		// Never made: the sandbox runtime mounts its own /dev, and a device
		// node in a rootfs on the host (say the host disk, mode 0666) would
		// hand it to any host user who can reach the tree.
		return nil
	case tar.TypeFifo:
		if err := unix.Mkfifo(target, mode); err != nil {
			return err
		}
	default:
		return nil // sockets, GNU sparse extensions, etc.: not filesystem content we need
	}
	if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			unix.Lsetxattr(target, name, []byte(v), 0) // best effort: fs may not support it
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid/setgid.
		if err := os.Chmod(target, os.FileMode(mode&0o777)|modeBits(mode)); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if !hdr.AccessTime.IsZero() {
		ts[0] = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

func modeBits(mode uint32) os.FileMode {
	var m os.FileMode
	if mode&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}
