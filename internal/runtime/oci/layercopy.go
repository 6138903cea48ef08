package oci

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// copyLayer copies a sandbox's overlay upper dir src into dst (which must
// not exist) as a read-only layer: every file, directory, symlink, device
// node (overlay whiteouts are 0:0 character devices), fifo and hard link,
// with modes, times and the xattrs that mean something in a lower layer.
// IDs in [shift, shift+65536) are stored minus shift, so a user-namespaced
// sandbox's files become root-based like image layers and any later
// sandbox can mount the layer idmapped into its own range.
//
// The copy never follows a symlink: src is walked with Lstat and files are
// opened O_NOFOLLOW, so a hostile sandbox's links cannot pull host files
// into the layer. It returns the bytes of regular file data copied.
//
// Callers hold the sandbox still (frozen, paused or stopped) for the copy;
// even so, what is opened for reading (directories to list, files to copy)
// is resolved beneath src with openat2 refusing every symlink, so a path
// swapped for a link mid-walk cannot reach outside the upper dir.
func copyLayer(src, dst string, shift uint32) (int64, error) {
	root, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(root)
	if err := os.Mkdir(dst, 0o755); err != nil {
		return 0, err
	}
	c := &layerCopy{src: src, dst: dst, root: root, shift: shift, links: map[[2]uint64]string{}}
	if err := c.walk("."); err != nil {
		return c.bytes, err
	}
	return c.bytes, nil
}

type layerCopy struct {
	src, dst string
	root     int // O_PATH fd of src
	shift    uint32
	links    map[[2]uint64]string // (dev, ino) of multiply-linked files → first copy
	bytes    int64
}

// open opens rel beneath src for reading, refusing symlinks anywhere in
// the path and crossing no mount.
func (c *layerCopy) open(rel string, flags int) (*os.File, error) {
	fd, err := unix.Openat2(c.root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: filepath.Join(c.src, rel), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(c.src, rel)), nil
}

// id maps a host ID of the sandbox's range back to the image's.
func (c *layerCopy) id(v uint32) int {
	if c.shift != 0 && v >= c.shift && v < c.shift+usernsSize {
		return int(v - c.shift)
	}
	return int(v)
}

func (c *layerCopy) walk(rel string) error {
	sp, dp := filepath.Join(c.src, rel), filepath.Join(c.dst, rel)
	fi, err := os.Lstat(sp)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if rel != "." {
		done, err := c.entry(sp, dp, fi, st)
		if err != nil || done {
			return err
		}
	}
	if fi.IsDir() {
		d, err := c.open(rel, unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		ents, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := c.walk(filepath.Join(rel, e.Name())); err != nil {
				return err
			}
		}
	}
	return c.attrs(sp, dp, fi, st)
}

// entry creates dp like sp; done means dp is a hard link to an earlier
// copy and takes no attributes of its own.
func (c *layerCopy) entry(sp, dp string, fi fs.FileInfo, st *syscall.Stat_t) (done bool, err error) {
	mode := fi.Mode()
	if !mode.IsDir() && st.Nlink > 1 {
		key := [2]uint64{uint64(st.Dev), st.Ino}
		if first, ok := c.links[key]; ok {
			return true, os.Link(first, dp)
		}
		c.links[key] = dp
	}
	switch {
	case mode.IsDir():
		return false, os.Mkdir(dp, 0o700)
	case mode.IsRegular():
		return false, c.copyFile(c.rel(sp), dp)
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(sp)
		if err != nil {
			return false, err
		}
		return false, os.Symlink(target, dp)
	case mode&fs.ModeSocket != 0:
		return true, nil // a socket's file means nothing without its process
	case mode&fs.ModeNamedPipe != 0, isWhiteout(mode, st):
		return false, unix.Mknod(dp, st.Mode, int(st.Rdev))
	default:
		// A device node the sandbox made (root without a user namespace
		// may mknod): never carried into a layer other sandboxes mount.
		return true, nil
	}
}

// rel is sp relative to src.
func (c *layerCopy) rel(sp string) string {
	r, _ := filepath.Rel(c.src, sp)
	return r
}

func (c *layerCopy) copyFile(rel, dp string) error {
	in, err := c.open(rel, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, in) // copy_file_range where the filesystems allow it
	c.bytes += n
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// attrs sets owner, xattrs, mode and times; mode after owner (chown drops
// set-ID bits), times last (everything else changes them).
func (c *layerCopy) attrs(sp, dp string, fi fs.FileInfo, st *syscall.Stat_t) error {
	if err := os.Lchown(dp, c.id(st.Uid), c.id(st.Gid)); err != nil {
		return err
	}
	if err := c.xattrs(sp, dp); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		if err := unix.Fchmodat(unix.AT_FDCWD, dp, st.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(syscall.TimespecToNsec(st.Atim)), unix.NsecToTimespec(syscall.TimespecToNsec(st.Mtim))}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dp, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// xattrs copies the extended attributes a lower layer needs: the overlay's
// opaque and whiteout markers, file capabilities (a user namespace's root
// ID shifted like the owner) and user/security labels. The overlay's
// bookkeeping of its upper (origin, impure, redirect) is dropped: it
// refers to this sandbox's mount. POSIX ACLs hold IDs and are only kept
// when no shift applies.
func (c *layerCopy) xattrs(sp, dp string) error {
	names, err := listXattrs(sp)
	if err != nil {
		return err
	}
	for _, name := range names {
		switch {
		case name == "trusted.overlay.opaque", name == "trusted.overlay.whiteout":
		case strings.HasPrefix(name, "trusted.overlay."):
			continue
		case strings.HasPrefix(name, "system.posix_acl_") && c.shift != 0:
			continue
		}
		val, err := getXattr(sp, name)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return err
		}
		if name == "security.capability" {
			val = c.capRoot(val)
		}
		if err := unix.Lsetxattr(dp, name, val, 0); err != nil {
			return fmt.Errorf("oci: copy xattr %s of %s: %w", name, sp, err)
		}
	}
	return nil
}

// isWhiteout: overlayfs marks a deleted lower file with a 0:0 char device.
func isWhiteout(mode fs.FileMode, st *syscall.Stat_t) bool {
	return mode&fs.ModeCharDevice != 0 && st.Rdev == 0
}

// capRoot rewrites the root ID of a v3 (namespaced) file capability.
func (c *layerCopy) capRoot(v []byte) []byte {
	const vfsCapRevision3 = 0x03000000
	if len(v) != 24 || binary.LittleEndian.Uint32(v)&0xff000000 != vfsCapRevision3 {
		return v
	}
	out := append([]byte(nil), v...)
	binary.LittleEndian.PutUint32(out[20:], uint32(c.id(binary.LittleEndian.Uint32(v[20:]))))
	return out
}

func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// dirBytes sums the sizes of the regular files under dir (a snapshot's
// checkpoint image).
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
