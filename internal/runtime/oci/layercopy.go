package oci

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// copyLayer copies a sandbox's overlay upper dir src into dst (which must
// not exist) as a read-only layer: every file, directory, symlink, fifo,
// overlay whiteout (a 0:0 character device) and hard link, with modes,
// times and the xattrs that mean something in a lower layer. IDs in
// [shift, shift+65536) are stored minus shift, so a user-namespaced
// sandbox's files become root-based like image layers and any later
// sandbox can mount the layer idmapped into its own range.
//
// Files keep their holes (SEEK_DATA/SEEK_HOLE): a sparse file costs the
// host what the sandbox wrote into it, not its apparent size. The copy
// charges what it allocates (data extents, directory and symlink blocks)
// and, when limit.bytes > 0, stops with runtime.ErrSnapshotTooLarge before
// it would pass it. It returns the bytes charged; on error dst is left for
// the caller to remove.
//
// The walk is relative to open directories (openat and friends, one name
// at a time), so no path it builds is longer than a name: a tree deeper
// than PATH_MAX copies like any other. Descriptors are closed on the way
// down and the parents reopened through ".." (checked by inode) on the
// way up, so the copy holds a constant number whatever the depth.
//
// The copy never follows a symlink: entries are stat'ed with
// AT_SYMLINK_NOFOLLOW and what is opened is resolved beneath its parent
// with openat2 refusing every symlink and mount crossing, so a hostile
// sandbox's links cannot pull host files into the layer. Callers hold the
// sandbox still (frozen, paused or stopped) for the copy; even so, an
// entry swapped between its stat and its open is an error, not a host
// file.
func copyLayer(src, dst string, shift uint32, limit budget) (int64, error) {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: src, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		unix.Close(sfd)
		return 0, err
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		unix.Close(sfd)
		return 0, err
	}
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		unix.Close(sfd)
		return 0, &os.PathError{Op: "open", Path: dst, Err: err}
	}
	droot, err := unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		unix.Close(sfd)
		unix.Close(dfd)
		return 0, &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(droot)
	c := &layerCopy{src: src, droot: droot, shift: shift, limit: limit, links: map[[2]uint64][]string{}}
	sfd, dfd, err = c.dir(sfd, dfd)
	if err != nil {
		return c.bytes, err
	}
	defer unix.Close(sfd)
	defer unix.Close(dfd)
	return c.bytes, c.dirAttrs(sfd, dfd, &st)
}

type layerCopy struct {
	src   string   // for messages
	droot int      // O_PATH fd of dst, where hard links are resolved from
	path  []string // names from src to the directory being copied
	shift uint32
	limit budget
	links map[[2]uint64][]string // (dev, ino) of multiply-linked files → first copy's names
	bytes int64
}

// budget bounds what a copy may allocate: bytes (0: no bound) and what
// they are, for the error.
type budget struct {
	bytes int64
	what  string
}

// charge counts n allocated bytes against the limit.
func (c *layerCopy) charge(n int64) error {
	c.bytes += n
	if c.limit.bytes > 0 && c.bytes > c.limit.bytes {
		return fmt.Errorf("%w: its files take more than %d bytes, %s", runtime.ErrSnapshotTooLarge, c.limit.bytes, c.limit.what)
	}
	return nil
}

// where names an entry for errors; it may be longer than PATH_MAX.
func (c *layerCopy) where(name string) string {
	return filepath.Join(append(append([]string{c.src}, c.path...), name)...)
}

// openBeneath opens name in the directory dirfd, refusing symlinks
// anywhere and crossing no mount.
func openBeneath(dirfd int, name string, flags int) (int, error) {
	return unix.Openat2(dirfd, name, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// openSame opens name beneath dirfd and checks it is the inode st
// describes (not one swapped in since the stat).
func openSame(dirfd int, name string, flags int, st *unix.Stat_t) (int, error) {
	fd, err := openBeneath(dirfd, name, flags)
	if err != nil {
		return -1, err
	}
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if now.Dev != st.Dev || now.Ino != st.Ino {
		unix.Close(fd)
		return -1, fmt.Errorf("%s changed during the copy", name)
	}
	return fd, nil
}

// id maps a host ID of the sandbox's range back to the image's.
func (c *layerCopy) id(v uint32) int {
	if c.shift != 0 && v >= c.shift && v < c.shift+usernsSize {
		return int(v - c.shift)
	}
	return int(v)
}

// dir copies the entries of the directory open as sfd into the one open
// as dfd. It owns both descriptors: they are closed while a subdirectory
// is copied and reopened through ".." afterwards, and returned for the
// caller to go on with (both closed, and -1, on error).
func (c *layerCopy) dir(sfd, dfd int) (int, int, error) {
	fail := func(err error) (int, int, error) {
		for _, fd := range []int{sfd, dfd} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		return -1, -1, err
	}
	names, err := readNames(sfd)
	if err != nil {
		return fail(fmt.Errorf("read %s: %w", c.where(""), err))
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fail(&os.PathError{Op: "lstat", Path: c.where(name), Err: err})
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			done, err := c.entry(sfd, dfd, name, &st)
			if err == nil && !done {
				err = c.attrs(sfd, dfd, name, &st)
			}
			if err != nil {
				return fail(err)
			}
			continue
		}
		if err := c.charge(st.Blocks * 512); err != nil {
			return fail(err)
		}
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return fail(&os.PathError{Op: "mkdir", Path: c.where(name), Err: err})
		}
		csfd, err := openSame(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY, &st)
		if err != nil {
			return fail(&os.PathError{Op: "open", Path: c.where(name), Err: err})
		}
		cdfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			unix.Close(csfd)
			return fail(err)
		}
		sid, err1 := fdID(sfd)
		did, err2 := fdID(dfd)
		if err := errors.Join(err1, err2); err != nil {
			unix.Close(csfd)
			unix.Close(cdfd)
			return fail(err)
		}
		unix.Close(sfd)
		unix.Close(dfd)
		sfd, dfd = -1, -1
		c.path = append(c.path, name)
		csfd, cdfd, err = c.dir(csfd, cdfd)
		if err != nil {
			return fail(err)
		}
		c.path = c.path[:len(c.path)-1]
		err = c.dirAttrs(csfd, cdfd, &st)
		if err == nil {
			sfd, err = reopenParent(csfd, sid)
		}
		if err == nil {
			dfd, err = reopenParent(cdfd, did)
		}
		unix.Close(csfd)
		unix.Close(cdfd)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", c.where(name), err))
		}
	}
	return sfd, dfd, nil
}

// readNames lists the directory open as fd (through a descriptor of its
// own, so fd's offset is untouched).
func readNames(fd int) ([]string, error) {
	rd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(rd), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

func fdID(fd int) ([2]uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return [2]uint64{}, err
	}
	return [2]uint64{st.Dev, st.Ino}, nil
}

// reopenParent opens fd's parent and checks it is the directory the walk
// came down from.
func reopenParent(fd int, want [2]uint64) (int, error) {
	p, err := unix.Openat2(fd, "..", &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return -1, err
	}
	if got, err := fdID(p); err != nil || got != want {
		unix.Close(p)
		return -1, errors.Join(err, errors.New("directory moved during the copy"))
	}
	return p, nil
}

// entry creates name in dfd like name in sfd (not a directory); done
// means it takes no attributes of its own (a hard link to an earlier
// copy, or something a layer does not carry).
func (c *layerCopy) entry(sfd, dfd int, name string, st *unix.Stat_t) (done bool, err error) {
	key := [2]uint64{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := c.links[key]; ok {
			return true, c.link(first, dfd, name)
		}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFREG:
		err = c.copyFile(sfd, dfd, name, st)
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		var target string
		if target, err = readlinkat(sfd, name); err == nil {
			if err = c.charge(st.Blocks * 512); err == nil {
				err = unix.Symlinkat(target, dfd, name)
			}
		}
	case st.Mode&unix.S_IFMT == unix.S_IFIFO, isWhiteout(st):
		err = unix.Mknodat(dfd, name, st.Mode, int(st.Rdev))
	default:
		// A socket means nothing without its process; a device node the
		// sandbox made (root without a user namespace may mknod) never
		// reaches a layer other sandboxes mount.
		return true, nil
	}
	if errors.Is(err, runtime.ErrSnapshotTooLarge) {
		return false, err // said to the API's client: no host paths
	}
	if err != nil {
		return false, fmt.Errorf("copy %s: %w", c.where(name), err)
	}
	if st.Nlink > 1 {
		c.links[key] = append(append([]string(nil), c.path...), name)
	}
	return false, nil
}

// link hard-links the copy at names (from dst) as name in dfd, walking to
// it one directory at a time.
func (c *layerCopy) link(names []string, dfd int, name string) error {
	at, err := unix.Openat(c.droot, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	for _, n := range names[:len(names)-1] {
		next, err := unix.Openat(at, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		unix.Close(at)
		if err != nil {
			return err
		}
		at = next
	}
	defer unix.Close(at)
	if err := unix.Linkat(at, names[len(names)-1], dfd, name, 0); err != nil {
		return fmt.Errorf("link %s: %w", c.where(name), err)
	}
	return nil
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// copyFile copies a regular file's data extents, leaving its holes holes.
func (c *layerCopy) copyFile(sfd, dfd int, name string, st *unix.Stat_t) error {
	ifd, err := openSame(sfd, name, unix.O_RDONLY, st)
	if err != nil {
		return err
	}
	in := os.NewFile(uintptr(ifd), name)
	defer in.Close()
	ofd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(ofd), name)
	err = c.copyData(in, out, st.Size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyData copies in's data extents below size to the same offsets of
// out, charging each (rounded to whole blocks) before it is written, and
// gives out in's apparent size.
func (c *layerCopy) copyData(in, out *os.File, size int64) error {
	for off := int64(0); off < size; {
		start, err := in.Seek(off, unix.SEEK_DATA)
		end := size
		switch {
		case errors.Is(err, unix.ENXIO):
			off = size // only a hole is left
			continue
		case errors.Is(err, unix.EINVAL):
			// No SEEK_DATA here: the rest is all data.
			start = off
		case err != nil:
			return err
		default:
			if end, err = in.Seek(start, unix.SEEK_HOLE); err != nil {
				return err
			}
			end = min(end, size)
		}
		if err := c.charge((end - start + blockSize - 1) / blockSize * blockSize); err != nil {
			return err
		}
		if _, err := in.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(start, io.SeekStart); err != nil {
			return err
		}
		// copy_file_range (a reflink where the filesystem shares
		// extents) where the kernel allows it, else a plain copy.
		if _, err := io.CopyN(out, in, end-start); err != nil {
			return err
		}
		off = end
	}
	return out.Truncate(size)
}

// blockSize is what one allocated block is charged as.
const blockSize = 4096

// attrs sets owner, xattrs, mode and times of name (not a directory);
// mode after owner (chown drops set-ID bits), times last (everything
// else changes them).
func (c *layerCopy) attrs(sfd, dfd int, name string, st *unix.Stat_t) error {
	if err := unix.Fchownat(dfd, name, c.id(st.Uid), c.id(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", c.where(name), err)
	}
	sp, err := openSame(sfd, name, unix.O_PATH, st)
	if err != nil {
		return fmt.Errorf("open %s: %w", c.where(name), err)
	}
	defer unix.Close(sp)
	dp, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dp)
	if err := c.xattrs(sp, dp, name); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		// dst's entry is the node just made in a directory only the copy
		// writes: following it is safe.
		if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(dfd, name, times(st), unix.AT_SYMLINK_NOFOLLOW)
}

// dirAttrs is attrs for a directory open as sfd and dfd.
func (c *layerCopy) dirAttrs(sfd, dfd int, st *unix.Stat_t) error {
	if err := unix.Fchown(dfd, c.id(st.Uid), c.id(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", c.where(""), err)
	}
	if err := c.xattrs(sfd, dfd, ""); err != nil {
		return err
	}
	if err := unix.Fchmod(dfd, st.Mode&0o7777); err != nil {
		return err
	}
	return unix.UtimesNanoAt(dfd, "", times(st), unix.AT_EMPTY_PATH)
}

func times(st *unix.Stat_t) []unix.Timespec {
	return []unix.Timespec{st.Atim, st.Mtim}
}

// fdPath names an open file (an O_PATH one too, a symlink included) for
// the path-only xattr calls; it is never longer than a few bytes.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// xattrs copies the extended attributes a lower layer needs from the file
// open as sfd to the one open as dfd: the overlay's opaque and whiteout
// markers, file capabilities (a user namespace's root ID shifted like the
// owner) and user/security labels. The overlay's bookkeeping of its upper
// (origin, impure, redirect) is dropped: it refers to this sandbox's
// mount. POSIX ACLs hold IDs and are only kept when no shift applies.
func (c *layerCopy) xattrs(sfd, dfd int, name string) error {
	sp, dp := fdPath(sfd), fdPath(dfd)
	names, err := listXattrs(sp)
	if err != nil {
		return err
	}
	for _, x := range names {
		switch {
		case x == "trusted.overlay.opaque", x == "trusted.overlay.whiteout":
		case strings.HasPrefix(x, "trusted.overlay."):
			continue
		case strings.HasPrefix(x, "system.posix_acl_") && c.shift != 0:
			continue
		}
		val, err := getXattr(sp, x)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return err
		}
		if x == "security.capability" {
			val = c.capRoot(val)
		}
		if err := unix.Setxattr(dp, x, val, 0); err != nil {
			return fmt.Errorf("oci: copy xattr %s of %s: %w", x, c.where(name), err)
		}
	}
	return nil
}

// isWhiteout: overlayfs marks a deleted lower file with a 0:0 char device.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
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
		n, err := unix.Listxattr(p, buf)
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
		n, err := unix.Getxattr(p, name, buf)
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

// dirBytes sums the bytes the regular files under dir (a snapshot's
// checkpoint image) take on disk.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return nil
	})
	return n
}
